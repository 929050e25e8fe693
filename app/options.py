"""The terminal subcommands' shared options: models, method and sampling for chat, compare and
serve, and what they resolve to (the demo family's files, the SpecConfig, a loaded Session).

app/main.py builds the parser from these and so does app/serving/serve.py; nothing here imports
either of them, so the commands import one way only.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from specdesk.app.runtime.backend import ChatSettings
from specdesk.app.runtime.session import Session, resolve_demo
from specdesk.app.storage.settings import DEMO, DEMO_HF
from specdesk.engines.methods import method_info, takes_drafter_file, uses_file
from specdesk.engines.types import MAX_DRAFT_TOKENS, METHODS, SamplingParams, SpecConfig, SpecDeskError

MAX_SEED = 2**32 - 1  # llama.cpp's sampler seed is 32 bits
DEFAULT_METHOD = "auto"  # as the app's: the method and k expected to be fastest, or none


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=["llama", "torch"], default="llama",
                        help="llama: GGUF files on llama.cpp (default); torch: Hugging Face folders on PyTorch")
    parser.add_argument("--device", default="auto",
                        help="torch engine: auto (CUDA/ROCm, else Metal, else CPU), cpu, cuda or mps; "
                             "llama.cpp: auto (the first GPU or RPC device), CPU, or a device `specdesk devices` lists")
    parser.add_argument("--target", help="target model: a GGUF file, or an HF folder with --engine torch "
                                         "(default: the demo target)")
    parser.add_argument("--draft", help="draft model for --method draft or auto, DFlash drafter folder for --method "
                                        "dflash (a DFlash / EAGLE-3 drafter GGUF with a GGUF target) "
                                        "(default with the demo target: the demo's)")
    parser.add_argument("--method", choices=list(METHODS), default=DEFAULT_METHOD,
                        help=f"speculation method (default: {DEFAULT_METHOD}, which picks the method and k each step, "
                             "using --draft when given)")
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
        if draft is None and method_takes_draft_model(args.method):
            draft = DEMO
        if draft is None and method_info(args.method).demo_drafter and torch_engine:
            draft = method_info(args.method).demo_drafter  # the demo family's drafter made for its target
        target, draft = resolve_demo(target, draft, "small" if args.small_demo else "full", progress)
    if takes_drafter_file(args.method) and torch_engine and draft is None:
        raise SpecDeskError(f"method {args.method!r} needs {method_info(args.method).drafter} folder: "
                            "pass --draft DIR")
    if draft is not None and method_info(args.method).role == "chooser":
        from specdesk.app.runtime.session import drafter_kind

        kind = drafter_kind(draft)
        if kind != "draft":  # auto chooses among the lookups, a draft model and the target's MTP layers
            what = method_info(kind).drafter
            raise SpecDeskError(f"{draft} is {what[0].lower()}{what[1:]} made for one target, not a draft model: "
                                f"method auto drafts with a draft model; use --method {kind} for this file")
    return target, draft


def method_takes_draft_model(method: str) -> bool:
    """A general draft model serves the method (draft needs one, auto uses one when given)."""
    return method_info(method).takes == "draft_model"


def sampling_params(args) -> SamplingParams:
    """--temperature, --top-p, --top-k, --seed, with --max-tokens checked beside them."""
    if args.max_tokens < 1:
        raise SpecDeskError(f"--max-tokens {args.max_tokens} is out of range: use at least 1")
    if not 0 <= args.seed <= MAX_SEED:
        raise SpecDeskError(f"--seed {args.seed} is out of range: use 0 to {MAX_SEED}")
    return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)


def build_configs(args, draft: Optional[str]) -> tuple[SpecConfig, SamplingParams]:
    sampling = sampling_params(args)
    if args.threads is not None and args.threads < 1:
        raise SpecDeskError(f"--threads {args.threads} is out of range: use 1 or more")
    spec = SpecConfig(method=args.method, k=args.k, draft_path=draft if uses_file(args.method) else None,
                      draft_p_min=args.draft_p_min)
    return spec, sampling


def chat_settings(args, spec: SpecConfig, sampling: SamplingParams) -> ChatSettings:
    return ChatSettings(spec, sampling, args.max_tokens)


def open_session(target: str, spec: SpecConfig, args) -> Session:
    """The target the options ask for, loaded with the spec's draft file, in its own engine
    process (app/runtime/session.Session): a crash in a model ends that, not the command; so
    does a process that stops answering (the watchdog: a terminal has no Stop button). A draft
    the engine refuses is an error here, where the app keeps the target and says why."""
    from specdesk.app.runtime.placement import placement_options

    kind = getattr(args, "engine", "llama")
    session = Session(device=getattr(args, "device", "auto"), watchdog=True)
    try:
        outcome = session.load(target, spec.draft_path, n_ctx=args.ctx, threads=args.threads or 0,
                               placement=placement_options(args, kind), kind=kind)
        if outcome.draft_error is not None:
            raise SpecDeskError(outcome.draft_error)
    except BaseException:
        session.close()
        raise
    for note in outcome.info.notes:
        print(f"specdesk: {note}", file=sys.stderr, flush=True)
    return session
