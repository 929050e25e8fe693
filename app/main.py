"""The terminal subcommands of `specdesk`: compare, chat, demo, models, serve.

The `specdesk` command itself is `specdesk.ui.cli`, which adds the desktop app, screenshots and
the self-test on top of this parser, so nothing in app/ imports the UI (docs/ARCHITECTURE.md,
Layers). Run without the UI as `python -m specdesk.app.main SUBCOMMAND`.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Optional

from specdesk.app.options import (add_model_options, build_configs, open_session, progress, resolve_models,
                                  sampling_params)
from specdesk.app.runtime.backend import ChatBackend, ChatOutcome, ChatSettings
from specdesk.app.runtime.chat_controller import ChatController, ThisThread, TurnRequest
from specdesk.app.storage.history import History
from specdesk.app.terminal import printable
from specdesk.engines.types import SpecConfig, SpecDeskError


# --- compare ---------------------------------------------------------------
def format_table(report) -> str:
    """The compare as a table: each arm's median tok/s over the runs and their range, and a
    headline that is the one median divided by the other (app/runtime/compare.CompareReport)."""
    base, spec = report.baseline, report.speculative
    identical = {True: "yes", False: "NO", None: "n/a (sampling)"}[report.identical_outputs]
    if report.identical_outputs and report.too_short:  # one token alike says little
        identical += f" ({base.tokens} token{'s' if base.tokens != 1 else ''})"
    base_rate, spec_rate = report.baseline_rate, report.speculative_rate
    rows = [
        f"engine {report.engine} · target {Path(report.target).name}"
        + (f" · draft {Path(report.draft).name}" if report.draft else "")
        + f" · method {report.method} · k {report.k} · T {report.temperature} · {len(report.results)} prompt(s)",
        "",
        f"{'':14}{'tokens':>8}{'tok/s':>10}{'runs':>18}{'accept':>9}{'tok/pass':>10}",
        f"{'baseline':14}{base.tokens:>8}{base_rate.median:>10.1f}{base_rate.span('', 1):>18}{'':>9}"
        f"{base.mean_accepted_length:>10.2f}",
        f"{'speculative':14}{spec.tokens:>8}{spec_rate.median:>10.1f}{spec_rate.span('', 1):>18}"
        f"{spec.acceptance_rate:>9.2f}{spec.mean_accepted_length:>10.2f}",
        "",
        f"speedup {report.headline()} · identical outputs: {identical}",
    ]
    if report.busy:
        rows.append(f"warning: {report.busy}; the figures may be off")
    if report.too_short:
        rows.append(f"warning: {report.too_short}")
    if report.auto_summary():
        rows.append(report.auto_summary())
    if any(spec.per_position_drafted):
        rows.append("acceptance per draft position: "
                    + " ".join(f"{a:.2f}" for a in spec.per_position_acceptance))
    if spec.passes:
        share = spec.draft_s / max(1e-9, spec.draft_s + spec.verify_s)
        rows.append(f"time drafting {share:.0%} · verifying {1 - share:.0%}")
    for divergence in report.divergences:
        rows.append(f"outputs differ at {divergence.describe()}")
    return "\n".join(rows)


def compare_prompts(args) -> list[str]:
    """`--prompt`, or the prompts of `--prompts FILE`, or the first four benchmark prompts."""
    from specdesk.app.runtime.compare import load_prompts

    if args.prompt is not None and args.prompts is not None:
        raise SpecDeskError("give either --prompt or --prompts, not both")
    if args.prompts is not None:
        return load_prompts(args.prompts)
    if args.prompt is not None:
        return [args.prompt]
    from specdesk.app.storage.paths import assets_dir

    return load_prompts(assets_dir() / "prompts" / "code.jsonl")[:4]


def cmd_compare(args) -> int:
    """Baseline and speculative on the prompts, on local models or a server (app/serving/served.py)."""
    prompts = compare_prompts(args)
    served = bool(getattr(args, "endpoint", None))
    if served:
        from specdesk.app.serving.served import ServedSession, open_endpoint

        sampling = sampling_params(args)
        speculative = open_endpoint(args.endpoint, args.endpoint_model, args.endpoint_api_key)
        baseline = None
        if args.baseline_endpoint:
            baseline = open_endpoint(args.baseline_endpoint, args.baseline_model or args.endpoint_model,
                                     args.baseline_api_key or args.endpoint_api_key)
        backend = ServedSession(speculative, baseline)
        settings = ChatSettings(SpecConfig(), sampling, args.max_tokens)
    else:
        target, draft = resolve_models(args)
        spec, sampling = build_configs(args, draft)
        if spec.method == "none":
            raise SpecDeskError("compare needs a speculation method: --method ngram, ngram-pool or draft")
        backend = open_session(target, spec, args)
        settings = ChatSettings(spec, sampling, args.max_tokens)
    live = sys.stderr.isatty() and args.json != "-"

    def show_progress(label, index, event):
        print(f"\r{label:12} prompt {index + 1}/{len(prompts)}", end="", file=sys.stderr, flush=True)
    # a server's prompts are chat messages; local ones too where the model has a chat template
    # (as the app's Compare tab does), unless --no-chat
    chat = served or (args.chat if args.chat is not None else backend.info.chat_template)
    try:
        report = backend.compare(prompts, settings, threading.Event(), show_progress if live else None, chat=chat)
        if live:
            print("\r" + " " * 40 + "\r", end="", file=sys.stderr)
        payload = {**backend.compare_json(report), "chat_template": chat}  # how the prompts were sent
    finally:
        backend.close()
    if not served:  # said once the compare ran: a refused input stays one line
        print("specdesk: prompts " + ("went through the model's chat template (--no-chat: raw text)" if chat else
                                      "were raw text to continue" + ("" if args.chat is False else
                                                                     " (the model has no chat template)")),
              file=sys.stderr)
    if args.json == "-":
        print(json.dumps(payload))
        return 0
    if served:
        print(printable(f"speculative: {speculative.target_label} ({speculative.info.kind}) · baseline: "
                        + (f"{baseline.target_label} ({baseline.info.kind})" if baseline is not None
                           else "the same server, speculation off per request"), one_line=True))
        # a server does not say how long drafting took: leave out the local table's time split
        print("\n".join(line for line in format_table(report).splitlines() if not line.startswith("time drafting")))
        for i, result in enumerate(report.results):
            at = result.first_text_difference()
            if report.temperature == 0 and at is not None:
                print(f"prompt {i + 1}: texts differ from character {at}")
    else:
        print(format_table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(payload) + "\n")
    return 0


# --- chat --------------------------------------------------------------------
CHAT_HELP = "empty line or Ctrl-D to quit, /reset for a new chat, /save [FILE] to write it as Markdown"


def next_user_line() -> Optional[str]:
    """The terminal chat's next message; None at an empty line or the end of input."""
    try:
        line = input("you> ")
    except EOFError:
        return None
    if not sys.stdin.isatty():  # a terminal echoes the typed line's end; piped input does not
        print()
    return line if line.strip() else None


def cmd_chat(args) -> int:
    """The terminal chat, on local models or a server (app/serving/served.py): one loop over a backend."""
    if getattr(args, "endpoint", None):
        from specdesk.app.serving.served import ServedSession, open_endpoint

        endpoint = open_endpoint(args.endpoint, args.endpoint_model, args.endpoint_api_key)
        backend = ServedSession(endpoint)
        settings = ChatSettings(SpecConfig(), sampling_params(args), args.max_tokens)
        title = printable(f"{endpoint.target_label} · {endpoint.info.describe()}", one_line=True)
    else:
        target, draft = resolve_models(args)
        spec, sampling = build_configs(args, draft)
        backend = open_session(target, spec, args)
        settings = ChatSettings(spec, sampling, args.max_tokens)
        title = f"{Path(target).name} · method {spec.method}" + (f" (k={spec.k})" if spec.method != "none" else "")
        if spec.method == "auto":  # its costs here, before the first turn rather than inside it
            print("auto: measuring what each method costs on this machine (once per model)…", file=sys.stderr)
            backend.prepare(spec)
    print(f"SpecDesk chat · {title} · {CHAT_HELP}", file=sys.stderr)
    try:
        terminal_chat(backend, settings, args.system)
    finally:
        backend.close()
    return 0


def terminal_chat(backend: ChatBackend, settings: ChatSettings, system: Optional[str] = None) -> list[dict]:
    """Read turns until an empty line or the end of input; each is a turn of the chat controller
    (app/runtime/chat_controller.py, as in the app), taken here by chat_turn. Ctrl-C stops the
    reply in progress (the chat goes on); an error that leaves the backend usable (a message too
    long for the context, a server that dropped the stream) is one line, and the chat goes on;
    one that every next message would meet again (an engine process that died, a server that
    redirects elsewhere) ends it. The chat lasts the session, as a terminal's scrollback does.
    Returns the conversation."""
    from specdesk.app.runtime.engine_client import EngineHostDied

    request = TurnRequest(settings.spec, settings.sampling, settings.max_tokens, backend)
    # a model's or a server's text, never a terminal command
    runner = ThisThread(backend, show=lambda text: print(printable(text), end="", flush=True))
    history = History.temporary()
    chat = ChatController(history, runner, lambda: request, system_prompt=lambda: system or "")
    try:
        while True:
            line = next_user_line()
            if line is None:
                return chat.conversation(chat.messages)
            if line.strip() in ("/reset", "/new"):
                chat.new_chat()
                print("[a new chat]", file=sys.stderr)
                continue
            if line.strip() == "/save" or line.startswith("/save "):
                try:
                    saved = save_conversation(chat.conversation(chat.messages), line[len('/save'):].strip())
                    print(f"[saved to {saved}]", file=sys.stderr)
                except SpecDeskError as e:
                    print(f"specdesk: {e}", file=sys.stderr)
                continue
            before = len(chat.messages)
            print("model> ", end="", flush=True)
            try:
                turn = chat.send(line)
            except KeyboardInterrupt:
                print("\n[stopped]")
                continue
            except EngineHostDied:
                print()
                raise  # the engine process ended: nothing left to chat with
            except SpecDeskError as e:
                print()
                if getattr(e, "ends_chat", False):  # nothing a next message could change (a redirect elsewhere)
                    raise
                if len(chat.messages) == before + 2:  # what came before the failure stays as the reply
                    print(f"[partial reply, {len(chat.messages[-1].text)} characters]", file=sys.stderr)
                print(f"specdesk: {e}", file=sys.stderr)
                continue
            print()
            outcome = turn.outcome
            note = f"\n[{printable(outcome.note, one_line=True)}]" if outcome.note else ""
            print(f"[{describe_reply(outcome)}]{note}", file=sys.stderr)
    finally:
        history.close()


def conversation_markdown(messages: list[dict], title: str = "SpecDesk chat") -> str:
    """A conversation as Markdown: a heading naming who wrote each message, then its text."""
    parts = [f"# {title}\n"]
    for message in messages:
        who = {"user": "You", "assistant": "Model", "system": "System"}.get(message["role"], message["role"])
        parts.append(f"## {who}\n\n{message['content'].rstrip()}\n")
    return "\n".join(parts)


def save_conversation(messages: list[dict], name: str = "") -> Path:
    """/save [FILE]: the conversation as Markdown in FILE (default: a dated name here)."""
    import time

    path = Path(name or time.strftime("specdesk-chat-%Y%m%d-%H%M%S.md")).expanduser()
    try:
        path.write_text(conversation_markdown(messages), encoding="utf-8")
    except OSError as e:
        raise SpecDeskError(f"cannot write {path} ({e.strerror or e}): /save another file") from None
    return path


def describe_reply(outcome: ChatOutcome) -> str:
    """One reply's numbers in a line: tokens, speed, and what speculation did where it drafted."""
    s = outcome.result.stats
    parts = [f"{s.tokens} tokens", f"{s.tok_per_s:.1f} tok/s"]
    if s.drafted:
        parts += [f"acceptance {s.acceptance_rate:.2f}", f"{s.mean_accepted_length:.2f} tok/pass"]
    if s.per_position_drafted and s.drafted:
        parts.append("per position " + " ".join(f"{a:.2f}" for a in s.per_position_acceptance))
    if outcome.numbers != "engine":
        parts.append(f"numbers: {outcome.numbers}")
    return " · ".join(parts)


# --- demo ----------------------------------------------------------------------
def output_folder(value: str, option: str) -> Path:
    """A folder to write into: refused up front when the path is taken by something else."""
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise SpecDeskError(f"{option} {path} exists and is not a folder: choose a new or existing folder")
    return path


def cmd_demo(args) -> int:
    from specdesk.app.demo.install import build_family

    if args.action != "build":
        raise SpecDeskError(f"unknown demo action {args.action!r}")
    if args.out:
        output_folder(args.out, "--out")
    from specdesk.app.demo.export_native_gguf import build_native

    paths = build_family(small=args.small, retrain=args.retrain, out=Path(args.out) if args.out else None,
                         progress=progress)
    # llama.cpp's native drafters for the same target: the target with its MTP layer and the
    # DFlash drafter, EAGLE-3 head and DSpark drafter as GGUFs; a family without a trained head gets a seeded
    # one, labelled so.
    native = build_native(paths)
    eagle3_role = "eagle3_gguf" if native["eagle3_source"] == "trained" else "eagle3_gguf_seeded"
    paths.update({"mtp_gguf": native["mtp_gguf"], "dflash_gguf": native["dflash_gguf"], eagle3_role: native["eagle3_gguf"]})
    if native.get("dspark_gguf"):
        paths["dspark_gguf"] = native["dspark_gguf"]
    print(json.dumps(paths))
    return 0


class _VersionAction(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        from specdesk.app.about import version_text

        print(version_text())
        parser.exit(0)


def cmd_devices(args) -> int:
    """Every device llama.cpp and PyTorch can use here, as JSON."""
    from specdesk.engines.torch.device import torch_devices

    from specdesk.app.runtime.placement import llama_device_report
    from specdesk.engines.llama.rpc import parse_endpoints

    report = {"llama_cpp": llama_device_report(parse_endpoints(args.rpc)), "torch": torch_devices()}
    print(json.dumps(report, indent=None if args.compact else 2))
    return 0


def build_parser(add_more: Optional[Callable[[argparse.ArgumentParser, Any], None]] = None
                 ) -> argparse.ArgumentParser:
    """The terminal subcommands; `add_more(parser, subparsers)` lets the entry point above
    (specdesk.ui.cli) add the desktop app's own."""
    parser = argparse.ArgumentParser(prog="specdesk", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=_VersionAction, nargs=0,
                        help="print the version and the llama.cpp build (backend, CPU code, GPU offload)")
    sub = parser.add_subparsers(dest="command")
    from specdesk.app.serving.served import add_endpoint_options

    p = sub.add_parser("compare", help="run baseline and speculative decoding on the same prompts")
    add_model_options(p)
    add_endpoint_options(p, compare=True)
    p.add_argument("--prompt", help="one prompt (a user message in the model's chat template, or raw text with "
                                    "--no-chat)")
    p.add_argument("--prompts", help='a JSONL file, one {"prompt": "..."} per line')
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap each prompt in the model's chat template as one user message (the default when the "
                        "model has a template, as in the app's Compare tab); --no-chat: raw text to continue")
    p.add_argument("--json", help="write the JSON report to this path, or - for stdout only")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("chat", help="chat in the terminal")
    add_model_options(p)
    add_endpoint_options(p, compare=False)
    p.add_argument("--system", metavar="TEXT", help="a system prompt that opens the chat (and each /reset)")
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("demo", help="the embedded demo model family")
    p.add_argument("action", choices=["build"])
    p.add_argument("--small", action="store_true", help="the small family the tests use (shipped, like the full one)")
    p.add_argument("--retrain", action="store_true",
                   help="run the training recipe here instead of using the shipped weights "
                        "(full: hours on a CPU; with --small: minutes)")
    p.add_argument("--out", help="folder for the built family (default: the user cache)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("devices", help="list the devices llama.cpp and PyTorch can use here (JSON)")
    p.add_argument("--compact", action="store_true", help="one line of JSON")
    from specdesk.app.runtime.placement import add_rpc_option

    add_rpc_option(p)
    p.set_defaults(func=cmd_devices)

    from specdesk.app.models.models_cli import add_models_parser

    add_models_parser(sub)
    from specdesk.app.serving.serve import add_serve_parser

    add_serve_parser(sub)
    from specdesk.app.training.cli import register as register_train_drafter

    register_train_drafter(sub)
    if add_more is not None:
        add_more(parser, sub)
    return parser


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Run a parsed subcommand: a SpecDeskError is one line on stderr and exit status 2."""
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.func(args)
    except SpecDeskError as e:
        print(f"specdesk: error: {e}", file=sys.stderr)
        if getattr(e, "details", ""):  # the engine process's last output (app/runtime/engine_client.py)
            print(e.details, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specdesk: interrupted", file=sys.stderr)
        return 130


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    return run(parser, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
