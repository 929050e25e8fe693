"""`specdesk train-drafter`: record, train within a time budget, export, measure, adopt or not."""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from specdesk.engines.types import SpecDeskError

METHODS = ("eagle3", "mtp", "dflash", "dspark", "draft")
RUNS_AS = {"dspark": "dflash"}  # the engines' method that runs a drafter, where it is not the trainer's name
DEVICES = ("auto", "cpu", "cuda", "mps")
PRECISIONS = ("auto", "float32", "bfloat16")  # precision.py's, named here without importing torch
TYPICAL_PROMPT_TOKENS = 64  # for the cache size said before recording
RECORD_CONTEXT = 2048  # a GGUF target's context while recording: prompt and answer (longer prompts are skipped)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, type=Path,
                        help="the target: a Hugging Face model folder, or a GGUF file (llama.cpp records the data; "
                             "an MTP layer is written into a copy of the file)")
    parser.add_argument("--method", choices=METHODS, default="eagle3",
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


def _run(args: argparse.Namespace, progress, should_stop, say=None) -> int:
    from specdesk.engines.torch.device import require_torch

    torch = require_torch("training a drafter")
    for name in ("minutes", "max_prompts", "max_tokens", "cache_mb", "steps", "batch_size", "eval_every",
                 "compare_prompts", "compare_tokens", "threads"):
        _positive(getattr(args, name), "--" + name.replace("_", "-"))
    if not 0 <= args.cooldown < 1:
        raise SpecDeskError(f"--cooldown {args.cooldown:g}: give a share of the budget from 0 up to (not including) 1")
    from specdesk.engines.torch.engine import TorchEngine

    from specdesk.app.models.provenance import write_provenance

    from .adopt import METHOD_LABELS, decide, existing_methods, measure
    from .loop import CHECKPOINT, LoopSettings, terminal_live, train_loop
    from .methods import DEPTH, method_taps, plan
    from .precision import autocast, choose_precision, precision_name
    from .prompts import default_prompts_path, split_prompts, training_prompts
    from .gguf_target import is_gguf_target
    from .record import RecordSettings, cache_key, estimate_bytes, load_sequence, prompt_tokens, record

    say = say or _stderr

    def paused(where: str) -> int:
        say(f"paused {where}: run the same command with --resume to continue")
        progress({"phase": "paused", "where": where})
        return PAUSED
    target = args.target
    from_gguf = is_gguf_target(target)
    out = args.out or default_out(target, args.method)
    if (out / CHECKPOINT).is_file() and not args.resume:
        raise SpecDeskError(f"{out} holds a training run already: pass --resume to continue it, or choose "
                            "another --out")
    if from_gguf:
        from specdesk.engines.files import require_regular_file

        from .gguf_target import model_config

        require_regular_file(target, "GGUF model file (--target)")
        model_config(target)  # an architecture the trainer cannot read is refused before anything loads
        if args.method == "mtp":  # the layer goes into a copy of the file: what it cannot carry is refused now
            from specdesk.app.demo.export_native_gguf import check_mtp_copy_source

            check_mtp_copy_source(target)
        args.target_gguf = target  # the GGUF drafter is exported for it
    elif args.target_gguf:
        from specdesk.engines.files import require_regular_file

        require_regular_file(args.target_gguf, "GGUF model file (--target-gguf)")
    if args.method == "mtp" and not from_gguf:  # a GGUF target of a trainable architecture has no NextN layers
        from .mtp import refuse_existing

        refuse_existing(target)
    prompts_path = args.prompts or default_prompts_path()
    prompts = training_prompts(prompts_path, args.from_history, say)
    train_prompts, held_prompts = split_prompts(prompts)
    if args.max_prompts:
        train_prompts = train_prompts[:args.max_prompts]

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    say(f"loading {target}")
    pass_over = None
    if from_gguf:  # llama.cpp runs the target; the embeddings, final norm and head are dequantized for training
        from specdesk.engines.llama.engine import LlamaEngine
        from specdesk.engines.torch.device import choose_device, device_name

        from .gguf_target import LlamaPass, heads_network

        engine = LlamaEngine(target, n_ctx=RECORD_CONTEXT, n_threads=args.threads)
        device = choose_device(args.device)
        network = heads_network(target, device)
        training_device = device_name(device)
    else:
        # float32 everywhere: the drafter trains in float32 against the target's frozen embeddings and head
        engine = TorchEngine(target, device=args.device, dtype="float32")
        network = engine.target.network
        training_device = engine.device_description
    config = network.config
    taps = method_taps(args.method, network)
    if args.method == "draft":  # a layer count the target cannot give is refused before recording
        from .draft import layer_ids

        layer_ids(config.num_hidden_layers, args.draft_layers)
    elif args.method in ("dflash", "dspark"):
        from .dflash import spec_for

        spec_for(config, args.draft_layers)
    settings = RecordSettings(taps=taps, max_new_tokens=args.max_tokens, limit_bytes=int(args.cache_mb * 2**20))
    if from_gguf:
        pass_over = LlamaPass(engine, taps, settings.top_k, RECORD_CONTEXT)
    key = cache_key(target, prompts, settings)  # the whole set: a larger --max-prompts reuses what is recorded
    cache = (args.cache or out / "cache") / key
    for folder, option in ((out, "--out"), (cache, "--cache")):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SpecDeskError(f"{folder}: cannot create this folder ({e.strerror or e}); "
                                f"give {option} a folder you can write to") from None
    size = estimate_bytes(len(train_prompts) + len(held_prompts), TYPICAL_PROMPT_TOKENS, settings, config.hidden_size)
    say(f"recording {len(train_prompts)} training and {len(held_prompts)} held-out prompts from {prompts_path} "
        f"into {cache}: about {size / 2**20:.1f} MiB "
        f"({settings.bytes_per_token(config.hidden_size)} bytes a token, at most {args.cache_mb:g} MiB)")
    started = time.time()
    held_files = record(engine, held_prompts, settings, cache, "held", say, progress, should_stop, pass_over)
    train_files = record(engine, train_prompts, settings, cache, "train", say, progress, should_stop, pass_over)
    if pass_over is not None:
        pass_over.close()
    if should_stop():
        return paused(f"while recording ({len(held_files) + len(train_files)} sequences recorded and kept)")
    if not train_files or not held_files:
        raise SpecDeskError("no sequences were recorded (every prompt was refused): see the messages above")
    record_seconds = time.time() - started

    train_seqs = [load_sequence(p) for p in train_files]
    held_seqs = [load_sequence(p) for p in held_files]
    tokens_recorded = sum(len(s.tokens) for s in train_seqs)
    trainer = plan(args.method, network, train_seqs, held_seqs, args.batch_size,
                   min(config.max_position_embeddings, 1024), target, draft_layers=args.draft_layers)
    step_device = str(network.model.embed_tokens.weight.device.type)
    precision = choose_precision(step_device, args.precision)
    loop = LoopSettings(minutes=args.minutes, max_steps=args.steps, eval_every=args.eval_every,
                        cooldown=args.cooldown, device=step_device, precision=precision)
    what = {"eagle3": "an EAGLE-3 head", "mtp": "an MTP layer", "dflash": "a DFlash drafter",
            "dspark": "a DSpark drafter", "draft": "a draft model"}[args.method]
    say(f"training {what} on {len(train_seqs)} sequences ({tokens_recorded} tokens) for at most "
        f"{args.minutes:g} minutes" + (f" or {args.steps} steps" if args.steps else "")
        + f", in {precision_name(precision)} on {training_device}")
    state = train_loop(trainer.module, trainer.step, trainer.evaluate, loop, out, args.resume, say, terminal_live(),
                       progress, should_stop)
    if state.paused:
        return paused(f"at step {state.step}")
    acceptance = next(h["acceptance"] for h in state.history if h["step"] == state.best_step)
    say(f"best held-out acceptance per position {acceptance} (mean accepted {sum(acceptance):.3f}) at step "
        f"{state.best_step} of {state.step}")

    reference = None
    if args.reference is not None:
        if trainer.evaluate_reference is None:
            raise SpecDeskError(f"--reference compares EAGLE-3 heads; this run trains {args.method}")
        with autocast(step_device, precision):  # the precision the trained head was evaluated in
            reference_mean, reference_figures = trainer.evaluate_reference(args.reference)
        share = sum(acceptance) / reference_mean if reference_mean > 0 else float("inf")
        at_90 = next((h for h in state.history if sum(h["acceptance"]) >= 0.9 * reference_mean), None)
        reference = {"folder": str(Path(args.reference).resolve()), "held_out_acceptance_per_position":
                     reference_figures["acceptance"], "held_out_mean_accepted": round(reference_mean, 4),
                     "share_reached": round(share, 4),
                     "seconds_to_90_percent": None if at_90 is None else at_90["seconds"]}
        say(f"reached {share:.0%} of the reference head's held-out acceptance ({sum(acceptance):.3f} against "
            f"{reference_mean:.3f} mean accepted; per position {reference_figures['acceptance']}, {args.reference}); "
            + ("90% of it never reached" if at_90 is None
               else f"90% of it reached after {at_90['seconds'] / 60:.1f} minutes (step {at_90['step']})"))

    folder = trainer.export(out / args.method)
    say(f"exported {folder}")
    gguf_path = None
    if args.target_gguf:
        from specdesk.app.demo.export_native_gguf import (export_dflash_folder, export_eagle3_folder,
                                                           export_mtp_target, export_mtp_target_from_gguf)

        if args.method == "mtp" and from_gguf:  # the file's own tensors, its types kept, and the layer
            gguf_path = export_mtp_target_from_gguf(folder, target, out / f"{target.stem}-mtp.gguf")
        else:
            from .draft import export_gguf_draft

            writer = {"eagle3": export_eagle3_folder, "mtp": export_mtp_target, "dflash": export_dflash_folder,
                      "dspark": export_dflash_folder, "draft": export_gguf_draft}[args.method]
            name = "target-mtp-F16.gguf" if args.method == "mtp" else f"{args.method}-F16.gguf"
            gguf_path = writer(folder, args.target_gguf, out / name)
        say(f"exported {gguf_path} for the llama.cpp engine")
    compare_texts = [p.text for p in held_prompts[:args.compare_prompts]]
    by_text = {p.text: p for p in held_prompts}

    def tokenize(text: str) -> list[int]:
        return prompt_tokens(engine, by_text[text])

    label = f"trained {METHOD_LABELS[args.method]}"
    k = DEPTH
    progress({"phase": "measure", "prompts": len(compare_texts)})
    from specdesk.engines.types import SpecConfig

    if args.method == "mtp":  # the layer lives in the exported copy of the target, measured in its engine
        if from_gguf:
            with_layer = LlamaEngine(gguf_path, n_ctx=RECORD_CONTEXT, n_threads=args.threads)
        else:
            with_layer = TorchEngine(folder, device=engine.device, dtype=str(engine.dtype).removeprefix("torch."))
        trained = measure(with_layer, label, SpecConfig(method="mtp", k=k), compare_texts,
                          lambda text: prompt_tokens(with_layer, by_text[text]), args.compare_tokens)
        with_layer.close()
    else:  # the llama.cpp engine loads the GGUF drafter, the PyTorch engine the folder
        drafter = str(gguf_path if from_gguf else folder)
        trained = measure(engine, label, SpecConfig(method=RUNS_AS.get(args.method, args.method), k=k,
                                                    draft_path=drafter), compare_texts, tokenize, args.compare_tokens)
    existing = [measure(engine, name, spec, compare_texts, tokenize, args.compare_tokens)
                for name, spec in existing_methods(engine, k, str(args.draft) if args.draft else None)]
    adopted, reason = decide(trained, existing)
    record_json = {
        "method": args.method,
        "drafter": str(folder.resolve()),
        "gguf": None if gguf_path is None else str(gguf_path.resolve()),
        "trained_here": True,
        "target": str(target.resolve()),
        "trained_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "data": {"prompts": str(Path(prompts_path).resolve()), "prompts_sha256": _sha256(Path(prompts_path)),
                 "training_prompts": len(train_prompts), "held_out_prompts": len(held_prompts),
                 "sequences": len(train_seqs), "tokens": tokens_recorded, "answer_tokens": args.max_tokens,
                 "cache": str(cache), "record_seconds": round(record_seconds, 1)},
        "training": {"steps": state.step, "best_step": state.best_step, "seconds": round(state.elapsed, 1),
                     "budget_minutes": args.minutes, "device": training_device, "taps": list(taps),
                     "precision": precision_name(precision), "cooldown": args.cooldown,
                     "history": state.history},
        "held_out_acceptance_per_position": acceptance,
        "held_out_mean_accepted": round(sum(acceptance), 4),
        "reference": reference,
        "measured": {"k": k, "prompts": len(compare_texts), "tokens": args.compare_tokens,
                     "trained": trained.to_json(), "existing": {m.label: m.to_json() for m in existing}},
        "speedup": round(trained.speedup, 3),
        "adopted": adopted,
        "reason": reason,
    }
    path = write_provenance(out, record_json)
    say(f"{'adopted' if adopted else 'kept, not adopted'}: {reason}")
    say(f"provenance: {path}")
    progress({"phase": "done", "method": args.method, "adopted": adopted, "reason": reason, "drafter": record_json["drafter"],
              "gguf": record_json["gguf"], "provenance": str(path), "speedup": record_json["speedup"]})
    print(str(folder))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="specdesk train-drafter", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
