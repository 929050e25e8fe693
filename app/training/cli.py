"""`specdesk train-drafter`: record, train within a time budget, export, measure, adopt or not."""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from specdesk.engines.methods import resolve, row, runs_as, trainable, training
from specdesk.engines.types import SpecDeskError

from specdesk.app.models.provenance import write_provenance

from .adopt import decide

DEVICES = ("auto", "cpu", "cuda", "mps")
PRECISIONS = ("auto", "float32", "bfloat16")  # precision.py's, named here without importing torch
TYPICAL_PROMPT_TOKENS = 64  # for the cache size said before recording
RECORD_CONTEXT = 2048  # a GGUF target's context while recording: prompt and answer (longer prompts are skipped)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, type=Path,
                        help="the target: a Hugging Face model folder, or a GGUF file (llama.cpp records the data; "
                             "an MTP layer is written into a copy of the file)")
    parser.add_argument("--method", choices=trainable(), default=trainable()[0],  # the method table's order
                        help="what to train: an EAGLE-3 head, an MTP layer (for a target without one), a "
                             "DFlash block drafter, a DSpark drafter (DFlash with a Markov head; it runs as "
                             "dflash) or a draft model (default eagle3)")
    parser.add_argument("--prompts", type=Path,
                        help="JSONL prompts the target answers to make the data (default: the bundled set)")
    parser.add_argument("--from-history", action="store_true",
                        help="also train on your own messages from the saved chats (off by default; read here, "
                             "nothing leaves this machine)")
    parser.add_argument("--minutes", type=float, default=20.0, help="training time budget (default 20)")
    parser.add_argument("--device", choices=DEVICES, default="auto", help="where to train and measure")
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="the training steps' arithmetic: bfloat16 autocast (weights and optimizer stay float32) "
                             "or float32; auto: bfloat16 on GPUs that support it and on CPUs where it is at least "
                             "twice as fast (AMX, AVX-512 BF16), float32 elsewhere")
    parser.add_argument("--cooldown", type=float, default=0.2,
                        help="the last share of the budget (minutes or --steps) over which the learning rate falls "
                             "to zero (default 0.2; 0 keeps it constant)")
    parser.add_argument("--out", type=Path, help="output folder (default: <target>-<method>-trained beside the target)")
    parser.add_argument("--resume", action="store_true", help="continue the run whose checkpoint is in --out")
    parser.add_argument("--max-prompts", type=int, help="answer only the first N training prompts")
    parser.add_argument("--max-tokens", type=int, default=96, help="answer length per prompt (default 96)")
    parser.add_argument("--cache-mb", type=float, default=2048, help="bound of the recorded data (default 2048 MiB)")
    parser.add_argument("--cache", type=Path,
                        help="where recordings are kept (default: OUT/cache); runs for the same target file, "
                             "prompts and recorded layers share one recording here")
    parser.add_argument("--steps", type=int, help="stop after this many training steps even with time left")
    parser.add_argument("--eval-every", type=int, default=200,
                        help="evaluate on held-out data and checkpoint every N steps (also every 30 s; default 200)")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per training step (default 8)")
    parser.add_argument("--compare-prompts", type=int, default=4, help="held-out prompts in the speedup compare")
    parser.add_argument("--compare-tokens", type=int, default=64, help="tokens per prompt in the compare")
    parser.add_argument("--target-gguf", type=Path,
                        help="the target's GGUF: also export the drafter as a GGUF that the llama.cpp engine loads")
    parser.add_argument("--draft", type=Path, help="a draft model the target already has, to measure against")
    parser.add_argument("--threads", type=int, help="CPU threads for torch")
    parser.add_argument("--draft-layers", type=int,
                        help="--method draft: the draft model's layers, the target's first ones and its last "
                             "(default: a quarter of the target's, at least 1); --method dflash or dspark: the "
                             "block drafter's layers (default 1)")
    parser.add_argument("--reference", type=Path,
                        help="an EAGLE-3 head for the same target (a folder): print the share of its held-out "
                             "acceptance the trained head reaches")


def register(subparsers) -> argparse.ArgumentParser:
    """`specdesk train-drafter`: the subcommand in the CLI's subparsers, dispatched to `run`."""
    parser = subparsers.add_parser("train-drafter", help="train an EAGLE-3 head, MTP layer, DFlash or DSpark "
                                                         "drafter or a draft model for a Hugging Face or GGUF target "
                                                         "here, and adopt it only if it pays",
                                   description=__doc__)
    add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def default_out(target: Path, method: str) -> Path:
    """Where a run's drafter, checkpoint and recordings go unless --out says: beside the target."""
    target = Path(target)
    name = target.stem if target.suffix.lower() == ".gguf" else target.name
    return target.parent / f"{name}-{method}-trained"


def _positive(value, name: str) -> None:
    if value is not None and not value > 0:
        raise SpecDeskError(f"{name} {value} is out of range: use a number above 0")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


PAUSED = 3  # the exit status of a run paused before its end (its checkpoint and recordings kept)


def run(args: argparse.Namespace, progress=None, should_stop=None, say=None) -> int:
    """The command: 0 done, 2 refused (a message says why), PAUSED paused (`should_stop`, or
    Ctrl-C on a terminal: the first one pauses at the next step, a second one interrupts).
    `progress` gets the run's events as dicts ({"phase": "record" | "train" | "measure" |
    "done" | "paused", ...}); `say` its messages (default: standard error)."""
    if should_stop is None:
        should_stop = _interrupt_pauses()
    try:
        return _run(args, progress or (lambda event: None), should_stop, say)
    except SpecDeskError as e:
        (say or _stderr)(f"error: {e}")
        return 2


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _interrupt_pauses():
    """On the main thread: the first Ctrl-C asks for a pause (checked between prompts and steps),
    a second one interrupts as usual."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: False
    asked = []

    def handler(signum, frame):
        if asked:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        asked.append(True)
        _stderr("\npausing at the next step (Ctrl-C again to stop at once)")

    try:
        signal.signal(signal.SIGINT, handler)
    except ValueError:
        return lambda: False
    return lambda: bool(asked)


@dataclass
class TrainingRun:
    """What the steps of one run share: the options, where it reports, and what each step made."""

    args: argparse.Namespace
    progress: Callable[[dict], None]
    should_stop: Callable[[], bool]
    say: Callable[[str], None]
    from_gguf: bool = False
    out: Optional[Path] = None
    engine: object = None  # the target's engine: it records, then measures
    network: object = None  # the target's embeddings, final norm and head (and its layers, from a folder)
    training_device: str = ""
    taps: tuple[int, ...] = ()
    prompts_path: Optional[Path] = None
    prompts: list = field(default_factory=list)  # the whole set: what the recordings' cache key names
    train_prompts: list = field(default_factory=list)
    held_prompts: list = field(default_factory=list)
    cache: Optional[Path] = None
    train_files: list = field(default_factory=list)
    held_files: list = field(default_factory=list)
    record_seconds: float = 0.0

    @property
    def method(self) -> str:
        return self.args.method

    def paused(self, where: str) -> int:
        self.say(f"paused {where}: run the same command with --resume to continue")
        self.progress({"phase": "paused", "where": where})
        return PAUSED


def _run(args: argparse.Namespace, progress, should_stop, say=None) -> int:
    """The run's steps in order; a step that pauses ends it with PAUSED."""
    from specdesk.engines.torch.device import require_torch

    torch = require_torch("training a drafter")
    _check_numbers(args)
    run = TrainingRun(args, progress, should_stop, say or _stderr)
    _check_target(run)
    _read_prompts(run)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    _load_target(run)
    if not _record(run):
        return run.paused(f"while recording ({len(run.held_files) + len(run.train_files)} sequences recorded "
                          "and kept)")
    trained = _train(run)
    if trained.state.paused:
        return run.paused(f"at step {trained.state.step}")
    reference = _compare_reference(run, trained)
    folder, gguf_path = _export(run, trained.plan)
    measured, existing = _measure(run, folder, gguf_path)
    adopted, reason = decide(measured, existing)
    record_json = _provenance(run, trained, reference, folder, gguf_path, measured, existing, adopted, reason)
    path = write_provenance(run.out, record_json)
    run.say(f"{'adopted' if adopted else 'kept, not adopted'}: {reason}")
    run.say(f"provenance: {path}")
    progress({"phase": "done", "method": args.method, "adopted": adopted, "reason": reason,
              "drafter": record_json["drafter"], "gguf": record_json["gguf"], "provenance": str(path),
              "speedup": record_json["speedup"]})
    print(str(folder))
    return 0


def _check_numbers(args: argparse.Namespace) -> None:
    for name in ("minutes", "max_prompts", "max_tokens", "cache_mb", "steps", "batch_size", "eval_every",
                 "compare_prompts", "compare_tokens", "threads"):
        _positive(getattr(args, name), "--" + name.replace("_", "-"))
    if not 0 <= args.cooldown < 1:
        raise SpecDeskError(f"--cooldown {args.cooldown:g}: give a share of the budget from 0 up to (not including) 1")


def _check_target(run: TrainingRun) -> None:
    """Refuse what cannot be trained before anything loads: a run in the way, a file that is not
    one, an architecture the trainer cannot read, and what the method's row refuses."""
    from specdesk.engines.files import require_regular_file

    from .gguf_target import is_gguf_target, model_config
    from .loop import CHECKPOINT

    args = run.args
    facts = training(args.method)
    run.from_gguf = is_gguf_target(args.target)
    run.out = args.out or default_out(args.target, args.method)
    if (run.out / CHECKPOINT).is_file() and not args.resume:
        raise SpecDeskError(f"{run.out} holds a training run already: pass --resume to continue it, or choose "
                            "another --out")
    if run.from_gguf:
        require_regular_file(args.target, "GGUF model file (--target)")
        model_config(args.target)  # an architecture the trainer cannot read is refused before anything loads
        args.target_gguf = args.target  # the GGUF drafter is exported for it
    elif args.target_gguf:
        require_regular_file(args.target_gguf, "GGUF model file (--target-gguf)")
    if facts.refuse is not None:  # MTP: a folder with MTP layers, a GGUF whose copy cannot carry the layer
        resolve(facts.refuse)(args.target, run.from_gguf)


def _read_prompts(run: TrainingRun) -> None:
    from .prompts import default_prompts_path, split_prompts, training_prompts

    args = run.args
    run.prompts_path = args.prompts or default_prompts_path()
    run.prompts = training_prompts(run.prompts_path, args.from_history, run.say)
    run.train_prompts, run.held_prompts = split_prompts(run.prompts)
    if args.max_prompts:
        run.train_prompts = run.train_prompts[:args.max_prompts]


def _load_target(run: TrainingRun) -> None:
    """The target: llama.cpp runs a GGUF (its embeddings, final norm and head dequantized for
    training), PyTorch a folder, in float32 (the drafter trains against its frozen embeddings and
    head); then the layers the method reads, and its own refusals, before anything is recorded."""
    args = run.args
    run.say(f"loading {args.target}")
    if run.from_gguf:
        from specdesk.engines.llama.engine import LlamaEngine
        from specdesk.engines.torch.device import choose_device, device_name

        from .gguf_target import heads_network

        run.engine = LlamaEngine(args.target, n_ctx=RECORD_CONTEXT, n_threads=args.threads)
        device = choose_device(args.device)
        run.network = heads_network(args.target, device)
        run.training_device = device_name(device)
    else:
        from specdesk.engines.torch.engine import TorchEngine

        run.engine = TorchEngine(args.target, device=args.device, dtype="float32")
        run.network = run.engine.target.network
        run.training_device = run.engine.device_description
    from .methods import method_taps

    run.taps = method_taps(args.method, run.network)
    facts = training(args.method)
    if facts.check is not None:  # a layer count the target cannot give is refused before recording
        resolve(facts.check)(run.network.config, args.draft_layers)


def _record(run: TrainingRun) -> bool:
    """The target answers the prompts; its hidden states at the method's taps and its top-k are
    kept in the cache. False when the run was paused."""
    from .gguf_target import LlamaPass
    from .record import RecordSettings, cache_key, estimate_bytes, record

    args, say, config = run.args, run.say, run.network.config
    settings = RecordSettings(taps=run.taps, max_new_tokens=args.max_tokens, limit_bytes=int(args.cache_mb * 2**20))
    pass_over = LlamaPass(run.engine, run.taps, settings.top_k, RECORD_CONTEXT) if run.from_gguf else None
    key = cache_key(args.target, run.prompts, settings)  # the whole set: a larger --max-prompts reuses what is recorded
    run.cache = (args.cache or run.out / "cache") / key
    for folder, option in ((run.out, "--out"), (run.cache, "--cache")):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SpecDeskError(f"{folder}: cannot create this folder ({e.strerror or e}); "
                                f"give {option} a folder you can write to") from None
    size = estimate_bytes(len(run.train_prompts) + len(run.held_prompts), TYPICAL_PROMPT_TOKENS, settings,
                          config.hidden_size)
    say(f"recording {len(run.train_prompts)} training and {len(run.held_prompts)} held-out prompts from "
        f"{run.prompts_path} into {run.cache}: about {size / 2**20:.1f} MiB "
        f"({settings.bytes_per_token(config.hidden_size)} bytes a token, at most {args.cache_mb:g} MiB)")
    started = time.time()
    common = (settings, run.cache)
    run.held_files = record(run.engine, run.held_prompts, *common, "held", say, run.progress, run.should_stop,
                            pass_over)
    run.train_files = record(run.engine, run.train_prompts, *common, "train", say, run.progress, run.should_stop,
                             pass_over)
    if pass_over is not None:
        pass_over.close()
    if run.should_stop():
        return False
    if not run.train_files or not run.held_files:
        raise SpecDeskError("no sequences were recorded (every prompt was refused): see the messages above")
    run.record_seconds = time.time() - started
    return True


@dataclass(frozen=True)
class Trained:
    """What the training step made: the method's plan (its module now holds the best state), the
    loop's state, and the recorded data it learned from."""

    plan: object
    state: object
    acceptance: list
    precision: object
    sequences: int
    tokens: int


def _train(run: TrainingRun) -> Trained:
    """The method's plan (its row's), trained within the budget by the shared loop."""
    from .loop import LoopSettings, terminal_live, train_loop
    from .methods import plan
    from .precision import choose_precision, precision_name
    from .record import load_sequence

    args, config = run.args, run.network.config
    train_seqs = [load_sequence(p) for p in run.train_files]
    held_seqs = [load_sequence(p) for p in run.held_files]
    tokens = sum(len(s.tokens) for s in train_seqs)
    trainer = plan(args.method, run.network, train_seqs, held_seqs, args.batch_size,
                   min(config.max_position_embeddings, 1024), args.target, draft_layers=args.draft_layers)
    step_device = str(run.network.model.embed_tokens.weight.device.type)
    precision = choose_precision(step_device, args.precision)
    loop = LoopSettings(minutes=args.minutes, max_steps=args.steps, eval_every=args.eval_every,
                        cooldown=args.cooldown, device=step_device, precision=precision)
    run.say(f"training {training(args.method).label} on {len(train_seqs)} sequences ({tokens} tokens) for at most "
            f"{args.minutes:g} minutes" + (f" or {args.steps} steps" if args.steps else "")
            + f", in {precision_name(precision)} on {run.training_device}")
    state = train_loop(trainer.module, trainer.step, trainer.evaluate, loop, run.out, args.resume, run.say,
                       terminal_live(), run.progress, run.should_stop)
    acceptance = [] if state.paused else next(h["acceptance"] for h in state.history if h["step"] == state.best_step)
    if not state.paused:
        run.say(f"best held-out acceptance per position {acceptance} (mean accepted {sum(acceptance):.3f}) at step "
                f"{state.best_step} of {state.step}")
    return Trained(trainer, state, acceptance, precision, len(train_seqs), tokens)


def _compare_reference(run: TrainingRun, trained: Trained) -> Optional[dict]:
    """--reference: the share of another head's held-out acceptance the trained one reaches."""
    from .precision import autocast

    args, acceptance, history = run.args, trained.acceptance, trained.state.history
    if args.reference is None:
        return None
    if trained.plan.evaluate_reference is None:
        raise SpecDeskError(f"--reference compares EAGLE-3 heads; this run trains {args.method}")
    step_device = str(run.network.model.embed_tokens.weight.device.type)
    with autocast(step_device, trained.precision):  # the precision the trained head was evaluated in
        reference_mean, reference_figures = trained.plan.evaluate_reference(args.reference)
    share = sum(acceptance) / reference_mean if reference_mean > 0 else float("inf")
    at_90 = next((h for h in history if sum(h["acceptance"]) >= 0.9 * reference_mean), None)
    run.say(f"reached {share:.0%} of the reference head's held-out acceptance ({sum(acceptance):.3f} against "
            f"{reference_mean:.3f} mean accepted; per position {reference_figures['acceptance']}, {args.reference}); "
            + ("90% of it never reached" if at_90 is None
               else f"90% of it reached after {at_90['seconds'] / 60:.1f} minutes (step {at_90['step']})"))
    return {"folder": str(Path(args.reference).resolve()), "held_out_acceptance_per_position":
            reference_figures["acceptance"], "held_out_mean_accepted": round(reference_mean, 4),
            "share_reached": round(share, 4), "seconds_to_90_percent": None if at_90 is None else at_90["seconds"]}


def _export(run: TrainingRun, plan) -> tuple[Path, Optional[Path]]:
    """The drafter as a Hugging Face folder, and for llama.cpp when there is a target GGUF: a
    drafter GGUF beside it, or (a method whose layers live in the target, MTP) the target with them."""
    args = run.args
    folder = plan.export(run.out / args.method)
    run.say(f"exported {folder}")
    if not args.target_gguf:
        return folder, None
    if not row(args.method).in_target:
        name = f"{args.method}-F16.gguf"
    else:
        name = f"{Path(args.target).stem}-{args.method}.gguf" if run.from_gguf else f"target-{args.method}-F16.gguf"
    gguf_path = resolve(training(args.method).export_gguf)(folder, args.target_gguf, run.out / name, run.from_gguf)
    run.say(f"exported {gguf_path} for the llama.cpp engine")
    return folder, gguf_path


def _measure(run: TrainingRun, folder: Path, gguf_path: Optional[Path]):
    """The trained drafter and what the target already has, on held-out prompts: (trained, existing).
    A drafter runs as its method's (a variant's base); layers inside the target, in its export."""
    from specdesk.engines.types import SpecConfig

    from .adopt import existing_methods, measure
    from .methods import DEPTH
    from .record import prompt_tokens

    args, engine = run.args, run.engine
    compare_texts = [p.text for p in run.held_prompts[:args.compare_prompts]]
    by_text = {p.text: p for p in run.held_prompts}
    label = f"trained {row(args.method).short}"
    run.progress({"phase": "measure", "prompts": len(compare_texts)})
    if row(args.method).in_target:  # the layer lives in the exported copy of the target, measured in its engine
        with_layer = _open_like(run, gguf_path if run.from_gguf else folder)
        trained = measure(with_layer, label, SpecConfig(method=runs_as(args.method), k=DEPTH), compare_texts,
                          lambda text: prompt_tokens(with_layer, by_text[text]), args.compare_tokens)
        with_layer.close()
    else:  # the llama.cpp engine loads the GGUF drafter, the PyTorch engine the folder
        drafter = str(gguf_path if run.from_gguf else folder)
        trained = measure(engine, label, SpecConfig(method=runs_as(args.method), k=DEPTH, draft_path=drafter),
                          compare_texts, lambda text: prompt_tokens(engine, by_text[text]), args.compare_tokens)
    existing = [measure(engine, name, spec, compare_texts, lambda text: prompt_tokens(engine, by_text[text]),
                        args.compare_tokens)
                for name, spec in existing_methods(engine, DEPTH, str(args.draft) if args.draft else None)]
    return trained, existing


def _open_like(run: TrainingRun, path: Path):
    """Another target on the engine the run's target is on, as it was opened."""
    if run.from_gguf:
        from specdesk.engines.llama.engine import LlamaEngine

        return LlamaEngine(path, n_ctx=RECORD_CONTEXT, n_threads=run.args.threads)
    from specdesk.engines.torch.engine import TorchEngine

    return TorchEngine(path, device=run.engine.device, dtype=str(run.engine.dtype).removeprefix("torch."))


def _provenance(run: TrainingRun, trained: Trained, reference, folder: Path, gguf_path: Optional[Path],
                measured, existing, adopted: bool, reason: str) -> dict:
    """What provenance.json says of the run: the data, the training, the measurements, the verdict."""
    from .methods import DEPTH
    from .precision import precision_name

    args, state, acceptance = run.args, trained.state, trained.acceptance
    return {
        "method": args.method,
        "drafter": str(folder.resolve()),
        "gguf": None if gguf_path is None else str(gguf_path.resolve()),
        "trained_here": True,
        "target": str(args.target.resolve()),
        "trained_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "data": {"prompts": str(Path(run.prompts_path).resolve()), "prompts_sha256": _sha256(Path(run.prompts_path)),
                 "training_prompts": len(run.train_prompts), "held_out_prompts": len(run.held_prompts),
                 "sequences": trained.sequences, "tokens": trained.tokens, "answer_tokens": args.max_tokens,
                 "cache": str(run.cache), "record_seconds": round(run.record_seconds, 1)},
        "training": {"steps": state.step, "best_step": state.best_step, "seconds": round(state.elapsed, 1),
                     "budget_minutes": args.minutes, "device": run.training_device, "taps": list(run.taps),
                     "precision": precision_name(trained.precision), "cooldown": args.cooldown,
                     "history": state.history},
        "held_out_acceptance_per_position": acceptance,
        "held_out_mean_accepted": round(sum(acceptance), 4),
        "reference": reference,
        "measured": {"k": DEPTH, "prompts": len(run.held_prompts[:args.compare_prompts]), "tokens": args.compare_tokens,
                     "trained": measured.to_json(), "existing": {m.label: m.to_json() for m in existing}},
        "speedup": round(measured.speedup, 3),
        "adopted": adopted,
        "reason": reason,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="specdesk train-drafter", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
