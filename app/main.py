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
from typing import Any, Callable, Iterator, Optional

from specdesk.app.runtime.session import chat_tokens, open_engine as open_engine_process, prompt_tokenizer, resolve_demo
from specdesk.app.storage.settings import DEMO, DEMO_DFLASH, DEMO_HF
from specdesk.engines.types import MAX_DRAFT_TOKENS, METHODS, SamplingParams, SpecConfig, SpecDeskError


MAX_SEED = 2**32 - 1  # llama.cpp's sampler seed is 32 bits


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=["llama", "torch"], default="llama",
                        help="llama: GGUF files on llama.cpp (default); torch: Hugging Face folders on PyTorch")
    parser.add_argument("--device", default="auto",
                        help="torch engine: auto (CUDA/ROCm, else Metal, else CPU), cpu, cuda or mps; "
                             "llama.cpp: auto (the first GPU or RPC device), CPU, or a device `specdesk devices` lists")
    parser.add_argument("--target", help="target model: a GGUF file, or an HF folder with --engine torch "
                                         "(default: the demo target)")
    parser.add_argument("--draft", help="draft model for --method draft, DFlash drafter folder for --method dflash "
                                        "(a DFlash / EAGLE-3 drafter GGUF with a GGUF target) "
                                        "(default with the demo target: the demo's)")
    parser.add_argument("--method", choices=[m for m in METHODS], default="draft",
                        help="speculation method (default: draft)")
    parser.add_argument("--k", type=int, default=4, help=f"draft tokens per step, 1..{MAX_DRAFT_TOKENS} (default 4)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores, at most 8)")
    parser.add_argument("--ctx", type=int, default=0, help="context size in tokens (default: the model's, at most 4096)")
    parser.add_argument("--draft-p-min", type=float, default=0.0,
                        help="stop drafting when the draft's top probability falls below this (default 0: off)")
    parser.add_argument("--small-demo", action="store_true", help="use the small (test) demo family")
    from specdesk.app.runtime.placement import add_placement_options

    add_placement_options(parser)


def resolve_models(args) -> tuple[str, Optional[str]]:
    """The target and draft paths: without --target, the demo family's (built if needed)."""
    target, draft = args.target, args.draft
    torch_engine = getattr(args, "engine", "llama") == "torch"
    if target is None:
        target = DEMO_HF if torch_engine else DEMO
        if draft is None and args.method in ("draft", "auto"):
            draft = DEMO
        if draft is None and args.method == "dflash" and torch_engine:
            draft = DEMO_DFLASH
        target, draft = resolve_demo(target, draft, "small" if args.small_demo else "full", _progress)
    if args.method == "dflash" and torch_engine and draft is None:
        raise SpecDeskError("method 'dflash' needs a DFlash drafter folder: pass --draft DIR")
    if args.method == "draft" and draft is None:
        raise SpecDeskError("method 'draft' needs a draft model: pass --draft PATH")
    return target, draft


def build_configs(args, draft: Optional[str]) -> tuple[SpecConfig, SamplingParams]:
    if args.max_tokens < 1:
        raise SpecDeskError(f"--max-tokens {args.max_tokens} is out of range: use at least 1")
    if args.threads is not None and args.threads < 1:
        raise SpecDeskError(f"--threads {args.threads} is out of range: use 1 or more")
    if not 0 <= args.seed <= MAX_SEED:
        raise SpecDeskError(f"--seed {args.seed} is out of range: use 0 to {MAX_SEED}")
    spec = SpecConfig(method=args.method, k=args.k, draft_path=draft if args.method in ("auto", "draft", "dflash", "eagle3") else None,
                      draft_p_min=args.draft_p_min)
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    return spec, sampling


def open_engine(target: str, args):
    """The engine the options ask for, in its own process (app/runtime/session.open_engine): a crash in
    a model ends that, not the CLI; so does a process that stops answering (the watchdog: a
    terminal has no Stop button)."""
    from specdesk.app.runtime.placement import placement_options

    kind = getattr(args, "engine", "llama")
    engine = open_engine_process(target, args.ctx, args.threads, kind=kind, device=getattr(args, "device", "auto"),
                                 watchdog=True, **placement_options(args, kind))
    for note in getattr(engine, "notes", ()):
        print(f"specdesk: {note}", file=sys.stderr, flush=True)
    return engine


# --- compare ---------------------------------------------------------------
def format_table(report) -> str:
    base, spec = report.baseline, report.speculative
    identical = {True: "yes", False: "NO", None: "n/a (sampling)"}[report.identical_outputs]
    rows = [
        f"engine {report.engine} · target {Path(report.target).name}"
        + (f" · draft {Path(report.draft).name}" if report.draft else "")
        + f" · method {report.method} · k {report.k} · T {report.temperature} · {len(report.results)} prompt(s)",
        "",
        f"{'':14}{'tokens':>8}{'seconds':>10}{'tok/s':>10}{'accept':>9}{'tok/pass':>10}",
        f"{'baseline':14}{base.tokens:>8}{base.seconds:>10.2f}{base.tok_per_s:>10.1f}{'':>9}{base.mean_accepted_length:>10.2f}",
        f"{'speculative':14}{spec.tokens:>8}{spec.seconds:>10.2f}{spec.tok_per_s:>10.1f}"
        f"{spec.acceptance_rate:>9.2f}{spec.mean_accepted_length:>10.2f}",
        "",
        f"speedup {report.speedup:.2f}x · identical outputs: {identical}",
    ]
    if spec.per_position_drafted:
        rows.append("acceptance per draft position: "
                    + " ".join(f"{a:.2f}" for a in spec.per_position_acceptance))
    if spec.passes:
        share = spec.draft_s / max(1e-9, spec.draft_s + spec.verify_s)
        rows.append(f"time drafting {share:.0%} · verifying {1 - share:.0%}")
    for divergence in report.divergences:
        rows.append(f"outputs differ at {divergence.describe()}")
    return "\n".join(rows)


def next_user_line() -> Optional[str]:
    """The terminal chat's next message; None at an empty line or the end of input."""
    try:
        line = input("you> ")
    except EOFError:
        return None
    return line if line.strip() else None


def user_turns(messages: list[dict], on_new: Callable[[], None] = lambda: None) -> Iterator[str]:
    """The terminal chat's turns, for local and served chats: each message the user types,
    already appended to `messages`; `/new` clears them (and calls on_new) and asks again."""
    while True:
        line = next_user_line()
        if line is None:
            return
        if line.strip() == "/new":
            messages.clear()
            on_new()
            continue
        messages.append({"role": "user", "content": line})
        yield line


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
    if getattr(args, "endpoint", None):  # a served engine (app/serving/served.py)
        from specdesk.app.serving.served import cmd_served_compare

        return cmd_served_compare(args)
    from specdesk.app.runtime.compare import compare

    prompts = compare_prompts(args)
    target, draft = resolve_models(args)
    spec, sampling = build_configs(args, draft)
    if spec.method == "none":
        raise SpecDeskError("compare needs a speculation method: --method ngram, ngram-pool or draft")
    engine = open_engine(target, args)
    try:
        if spec.method == "draft":
            engine.load_draft(spec.draft_path)
        tokenize = prompt_tokenizer(engine, args.chat)
        live = sys.stderr.isatty() and args.json != "-"

        def show_progress(label, index, event):
            print(f"\r{label:12} prompt {index + 1}/{len(prompts)}", end="", file=sys.stderr, flush=True)
        on_event = show_progress if live else None
        report = compare(engine, prompts, spec, sampling, args.max_tokens, tokenize, on_event=on_event)
        if live:
            print("\r" + " " * 40 + "\r", end="", file=sys.stderr)
        placement = engine.placement_report() if hasattr(engine, "placement_report") else {}
    finally:
        engine.close()
    from specdesk.app.models.measurements import record_compare

    from specdesk.app.runtime.placement import placement_label

    record_compare(report, placement=placement_label(placement))  # pairing ranks drafts by what was measured here
    payload = report.to_json()
    if placement:  # where each model sat, and what llama.cpp allocated on each device
        payload["placement"] = placement
    if args.json == "-":
        print(json.dumps(payload))
    else:
        print(format_table(report))
        if args.json:
            Path(args.json).write_text(json.dumps(payload) + "\n")
    return 0


# --- chat --------------------------------------------------------------------
def cmd_chat(args) -> int:
    if getattr(args, "endpoint", None):  # a served engine (app/serving/served.py)
        from specdesk.app.serving.served import cmd_served_chat

        return cmd_served_chat(args)
    from specdesk.app.runtime.compare import run_once
    from specdesk.app.models.measurements import MethodTally
    from specdesk.app.runtime.session import record_chat_reply
    from specdesk.app.terminal import printable
    from specdesk.engines.types import GenerationRequest

    target, draft = resolve_models(args)
    spec, sampling = build_configs(args, draft)
    engine = open_engine(target, args)
    messages: list[dict] = []
    print(f"SpecDesk chat · {Path(target).name} · method {spec.method}"
          + (f" (k={spec.k})" if spec.method != "none" else "")
          + " · empty line or Ctrl-D to quit, /new for a new chat", file=sys.stderr)
    try:
        for _ in user_turns(messages, engine.reset_chat):
            cancel = threading.Event()
            try:
                # The oldest turns go first when the conversation outgrows the context.
                tokens, dropped = chat_tokens(engine, messages, args.max_tokens)
                del messages[:dropped]
                request = GenerationRequest(tuple(tokens), max_tokens=args.max_tokens, sampling=sampling, spec=spec)
                print("model> ", end="", flush=True)
                tally = MethodTally(spec.method)

                def show(event) -> None:
                    tally(event)
                    print(printable(event.text), end="", flush=True)  # a model's text, never a terminal command
                result = run_once(engine, request, cancel, on_event=show)
                record_chat_reply(engine, spec, sampling, result, tally)  # its acceptance and tok/s, measured
            except KeyboardInterrupt:
                cancel.set()
                print("\n[stopped]")
                continue
            except SpecDeskError as e:
                if not getattr(engine, "alive", True):  # the engine process ended: nothing left to chat with
                    raise
                messages.pop()  # this message cannot be answered (too long, say): the chat goes on
                print(f"specdesk: {e}", file=sys.stderr)
                continue
            messages.append({"role": "assistant", "content": result.text})
            s = result.stats
            print(f"\n[{s.tokens} tokens · {s.tok_per_s:.1f} tok/s"
                  + (f" · acceptance {s.acceptance_rate:.2f} · {s.mean_accepted_length:.2f} tok/pass"
                     if spec.method != "none" else "") + "]", file=sys.stderr)
    finally:
        engine.close()
    return 0


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
                         progress=_progress)
    # llama.cpp's native drafters for the same target: the target with its MTP layer and the
    # DFlash drafter as GGUFs; the EAGLE-3 head is not trained, only seeded.
    native = build_native(paths)
    paths.update({"mtp_gguf": native["mtp_gguf"], "dflash_gguf": native["dflash_gguf"],
                  "eagle3_gguf_seeded": native["eagle3_gguf"]})
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
    p.add_argument("--prompt", help="one prompt (raw completion text)")
    p.add_argument("--prompts", help='a JSONL file, one {"prompt": "..."} per line')
    p.add_argument("--chat", action="store_true", help="wrap prompts in the model's chat template")
    p.add_argument("--json", help="write the JSON report to this path, or - for stdout only")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("chat", help="chat in the terminal")
    add_model_options(p)
    add_endpoint_options(p, compare=False)
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
