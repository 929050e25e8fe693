"""The `specdesk` command: the desktop app by default, plus every terminal subcommand.

This entry point sits above app/ and ui/ (docs/ARCHITECTURE.md, Layers): it takes the
terminal subcommands' parser from `specdesk.app.main` and adds what needs the UI (the
desktop app, offscreen screenshots, the installers' self-test). Qt is imported only when one
of those runs, so `specdesk compare` on a machine without a display never loads it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from specdesk.app import main as terminal


def cmd_gui(args) -> int:
    """The main window; with no display, say so and compare the demo pair in the terminal."""
    from specdesk.ui.app import display_available

    if not display_available():
        print("specdesk: no display available (DISPLAY / WAYLAND_DISPLAY unset): running `specdesk compare` "
              + ("on that target" if getattr(args, "target", None) else "on the demo pair") + " instead",
              file=sys.stderr)
        target = getattr(args, "target", None)
        return terminal.main(["compare", *(["--target", target] if target else [])])
    from specdesk.ui.app import run_gui

    return run_gui(dark=getattr(args, "dark", None), target=getattr(args, "target", None))


def cmd_screenshot(args) -> int:
    from specdesk.ui.screenshot import parse_size, parse_sizes, take_screenshots

    width, height = parse_size(args.size)
    sizes = parse_sizes(args.sizes) if args.sizes else None
    terminal.output_folder(args.out, "--out")
    if args.endpoint:  # the chat on a served engine (ui/served_screenshot.py)
        from specdesk.ui.served_screenshot import take_served_screenshot

        print(take_served_screenshot(Path(args.out), args.endpoint, args.api_key, args.model, (width, height),
                                     dark=args.dark, suffix=args.suffix, progress=terminal.progress))
        return 0
    for path in take_screenshots(Path(args.out), (width, height), dark=args.dark, threads=args.threads or 0,
                                 demo_size="full" if args.full_demo else "small",
                                 suffix=args.suffix, progress=terminal.progress, sizes=sizes, target=args.target):
        print(path)
    return 0


def add_desktop_commands(parser: argparse.ArgumentParser, sub) -> None:
    parser.add_argument("--selftest", action="store_true",
                        help="check this install offscreen (demo family, llama.cpp, speculative = greedy) and exit")
    p = sub.add_parser("gui", help="open the desktop app (the default with no subcommand)")
    p.add_argument("--dark", action="store_true", default=None, help="use a dark palette")
    p.add_argument("--target", metavar="PATH", help="open this GGUF file or Hugging Face folder as the target, with "
                                                    "the draft that fits it (as File > Open does)")
    p.set_defaults(func=cmd_gui)

    p = sub.add_parser("screenshot", help="save PNGs of the main window, the compare view and the pairing dialog "
                                          "(offscreen)")
    p.add_argument("--out", required=True, help="folder for main-window.png, compare.png and pairing.png")
    p.add_argument("--size", default="1280x800", help="window size, WIDTHxHEIGHT (default 1280x800)")
    p.add_argument("--sizes", metavar="WxH,…",
                   help="also save each tab at each size as chat-WxH.png, compare-WxH.png, models-WxH.png "
                        "(e.g. 1024x640,1920x1080)")
    p.add_argument("--dark", action="store_true", help="use a dark palette")
    p.add_argument("--suffix", default="", help="added to the file names, e.g. -dark")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: automatic)")
    p.add_argument("--full-demo", action="store_true",
                   help="use the full demo family (real code replies) instead of the small test family")
    p.add_argument("--target", metavar="PATH", help="a model of your own (a GGUF file) instead of the demo family: "
                                                    "method auto, a chat question, no pairing dialog")
    p.add_argument("--endpoint", metavar="URL", help="instead: served-chat.png, the chat on this server")
    p.add_argument("--model", help="with --endpoint: the server's model id (default: the first it lists)")
    p.add_argument("--api-key", help="with --endpoint: the server's API key")
    p.set_defaults(func=cmd_screenshot)


def build_parser() -> argparse.ArgumentParser:
    parser = terminal.build_parser(add_desktop_commands)
    parser.description = __doc__.splitlines()[0]
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.selftest:
        from specdesk.ui.selftest import run_selftest

        return run_selftest()
    if args.command is None:
        args.func = cmd_gui
    return terminal.run(parser, args)


if __name__ == "__main__":
    sys.exit(main())
