"""Method auto against every fixed (method, k) and no speculation, on the benchmark prompts.

For each engine, every configuration runs every prompt greedily, interleaved prompt by
prompt (so a machine that speeds up or slows down over the run favours none of them);
decode time only, as compare times it. One JSON line per configuration:
`tok_per_s`, `speedup` over no speculation in the same run, `identical` (greedy output equal
to no speculation's on every prompt; where not, `divergences` counts the prompts whose first
difference is a near-tie or a mismatch, as compare classifies them), and for auto the share of
steps each method drafted.
Then one summary line per engine: auto over the best fixed configuration and over none, the
same from the second prompt on (after a first cost probe taken under load, `--busy-probe`, the
first reply runs on its costs), and auto over the best fixed configuration chosen on the other
half of the runs (the plain best of fifteen noisy rates is the luckiest one on a busy machine;
see split_best_fixed).

The `mtp-only` target is the demo target exported with its MTP layer (llama.cpp), with auto
limited to MTP and no speculation: the case where every method may lose.

`--prompts FILE` takes any prompt set (held-out sets: benchmarks/heldout/); `--busy-from F`
starts `--busy-loops N` CPU-bound processes after the fraction F of the timed runs, so auto is
measured on a machine whose state changes under it (every configuration alike: they are
interleaved). The auto line also gives the costs auto chose with at the end.

Usage: python benchmarks/auto.py [--engines llama,torch,mtp-only] [--prompts FILE] [--n-prompts N]
       [--max-tokens 64] [--rounds R] [--busy-from 0.5 --busy-loops 2]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
from collections import Counter
from typing import Optional

import numpy as np

from specdesk.app.runtime.compare import PromptResult, classify_divergence, divergence_noise, load_prompts
from specdesk.app.runtime.generation import run_once
from specdesk.app.storage.paths import assets_dir
from specdesk.engines.types import GenerationRequest, SamplingParams, SpecConfig


def configurations(kind: str, draft: Optional[str], ks: list[int]) -> list[SpecConfig]:
    fixed = {"llama": ["ngram", "ngram-pool", "draft"], "torch": ["ngram", "ngram-pool", "draft", "mtp"],
             "mtp-only": ["mtp"]}[kind]
    if draft is None:  # a target of its own (--target) without a draft model
        fixed = [m for m in fixed if m != "draft"]
    configs = [SpecConfig()]
    for method in fixed:
        for k in ks:
            configs.append(SpecConfig(method, k=k, draft_path=draft if method == "draft" else None))
    auto_methods = ("mtp",) if kind == "mtp-only" else ()
    configs.append(SpecConfig("auto", k=max(ks), draft_path=draft if kind != "mtp-only" else None,
                              auto_methods=auto_methods))
    return configs


def label(spec: SpecConfig) -> str:
    return spec.method if spec.method in ("none", "auto") else f"{spec.method} k={spec.k}"


def _spin() -> None:
    while True:
        pass


class BusyLoops:
    """N processes that keep a core busy each, from start() until stop()."""

    def __init__(self, n: int):
        self.n, self.processes = n, []

    def start(self) -> None:
        if not self.processes:
            self.processes = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(self.n)]
            for process in self.processes:
                process.start()
            print(json.dumps({"event": "busy loops started", "n": self.n}), file=sys.stderr, flush=True)

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        self.processes = []


def bench(kind: str, engine, configs: list[SpecConfig], prompts: list[str], max_tokens: int, rounds: int = 1,
          busy_from: float = 2.0, busy: Optional[BusyLoops] = None, busy_probe: bool = False,
          chat: bool = False) -> None:
    sampling = SamplingParams()
    if chat:  # each prompt as a user's message, in the model's own chat template (compare --chat)
        from specdesk.app.chat.prompting import chat_prompt

        encoded = [chat_prompt(engine, [{"role": "user", "content": p}]) for p in prompts]
    else:
        encoded = [engine.tokenize(p) for p in prompts]
    probe_load = BusyLoops(2) if busy_probe else None
    if probe_load is not None:  # auto's first cost probe on a busy machine; the timed runs are quiet
        probe_load.start()
    for spec in configs:  # first-call allocations and auto's cost measurement, untimed
        engine.reset_chat()
        run_once(engine, GenerationRequest(tuple(encoded[0]), max_tokens=4, sampling=sampling, spec=spec))
    if probe_load is not None:
        probe_load.stop()
    tokens = Counter()
    seconds = Counter()
    halves = (Counter(), Counter()), (Counter(), Counter())  # (tokens, seconds) of even and odd runs
    later = Counter(), Counter()  # (tokens, seconds) from the second prompt on: auto's costs settled
    outputs: dict[str, list] = {label(s): [] for s in configs}
    results: dict[str, list] = {label(s): [] for s in configs}  # RunResults, for the divergences
    chosen: Counter = Counter()
    by_choice: Counter = Counter()  # "method k=K" -> auto's steps, over every run
    auto_costs = None
    runs = encoded * rounds
    for index, prompt in enumerate(runs):
        if busy is not None and index >= busy_from * len(runs):
            busy.start()
        order = configs if index % 2 == 0 else configs[::-1]
        for spec in order:
            engine.reset_chat()
            request = GenerationRequest(tuple(prompt), max_tokens=max_tokens, sampling=sampling, spec=spec)
            on_event = (lambda e: chosen.update([e.method or "none"])) if spec.method == "auto" else None
            result = run_once(engine, request, on_event=on_event)
            tokens[label(spec)] += result.stats.tokens
            seconds[label(spec)] += result.stats.seconds
            halves[index % 2][0][label(spec)] += result.stats.tokens
            halves[index % 2][1][label(spec)] += result.stats.seconds
            if index > 0:
                later[0][label(spec)] += result.stats.tokens
                later[1][label(spec)] += result.stats.seconds
            outputs[label(spec)].append(result.tokens)
            results[label(spec)].append(result)
            if result.auto_report:
                auto_costs = result.auto_report["costs"]
                report = result.auto_report
                by_choice.update({name: round(share * report["steps"])
                                  for name, share in report["steps_by_choice"].items()})
    rates = {name: tokens[name] / seconds[name] for name in outputs}
    for name in outputs:
        line = {"engine": kind, "config": name, "tokens": tokens[name], "seconds": round(seconds[name], 3),
                "tok_per_s": round(rates[name], 2), "speedup": round(rates[name] / rates["none"], 3),
                "identical": outputs[name] == outputs["none"]}
        if not line["identical"]:
            line["divergences"] = divergences(engine, runs, results["none"], results[name])
        if name == "auto":
            steps = sum(chosen.values())
            line["steps_by_method"] = {m: round(n / steps, 3) for m, n in chosen.most_common()}
            total = sum(by_choice.values()) or 1
            line["steps_by_choice"] = {c: round(n / total, 3) for c, n in by_choice.most_common()}
            line["costs_at_end"] = auto_costs
        print(json.dumps(line), flush=True)
    fixed = {name: rate for name, rate in rates.items() if name not in ("none", "auto")}
    best = max(fixed, key=fixed.get)
    summary = {"engine": kind, "summary": True, "best_fixed": best,
               "auto_over_best_fixed": round(rates["auto"] / fixed[best], 3),
               "auto_over_none": round(rates["auto"] / rates["none"], 3),
               "best_fixed_over_none": round(fixed[best] / rates["none"], 3)}
    if later[1]["auto"] > 0:  # after a first probe taken under load, auto should be right again by its second reply
        rate = {name: later[0][name] / later[1][name] for name in outputs}
        summary["auto_over_best_fixed_from_second_reply"] = round(
            rate["auto"] / max(r for name, r in rate.items() if name not in ("none", "auto")), 3)
    split = split_best_fixed(halves, outputs)
    if split is not None:
        summary["auto_over_best_fixed_chosen_apart"] = split
    print(json.dumps(summary), flush=True)


def divergences(engine, runs: list, baseline: list, speculative: list) -> dict:
    """Where a configuration's greedy output left no speculation's, by kind (untimed): a
    near-tie (the target's top two logits within noise there, compare's classification) or a
    mismatch (a bug)."""
    kinds: Counter = Counter()
    noise = None  # this model's batched-against-single logit noise, measured at the first divergence
    for index, (prompt, base, spec) in enumerate(zip(runs, baseline, speculative)):
        pair = PromptResult("", base, spec)
        if pair.first_divergence() is not None and noise is None:
            noise = divergence_noise(engine, list(prompt), pair)
        found = classify_divergence(engine, index, list(prompt), pair, noise=noise)
        if found is not None:
            kinds[found.kind] += 1
    return dict(kinds)


def split_best_fixed(halves, outputs) -> Optional[float]:
    """Auto over the best fixed configuration chosen on the other half of the runs.

    The best of fifteen noisy rates is biased upwards: on a busy machine it is mostly the
    luckiest configuration, and auto is measured against that luck. Choosing the best fixed
    configuration on the even runs and comparing auto with it on the odd runs (and the other
    way round) gives what a user who had picked the best fixed setting in advance would get.
    The geometric mean of the two ratios; None with fewer than two runs."""
    ratios = []
    for chosen_on, measured_on in ((0, 1), (1, 0)):
        tokens, seconds = halves[chosen_on]
        if not seconds:
            return None
        rate = {name: tokens[name] / seconds[name] for name in outputs if seconds[name] > 0}
        fixed = {name: r for name, r in rate.items() if name not in ("none", "auto")}
        pick = max(fixed, key=fixed.get)
        tokens, seconds = halves[measured_on]
        if not seconds or not seconds[pick] or not seconds["auto"]:
            return None
        ratios.append((tokens["auto"] / seconds["auto"]) / (tokens[pick] / seconds[pick]))
    return round(float(np.sqrt(ratios[0] * ratios[1])), 3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="llama,torch,mtp-only")
    parser.add_argument("--prompts", default=str(assets_dir() / "prompts" / "code.jsonl"),
                        help='a JSONL prompt file, one {"prompt": ...} per line (default: the tuning prompts)')
    parser.add_argument("--n-prompts", type=int, default=8, help="how many of its prompts")
    parser.add_argument("--busy-from", type=float, default=None,
                        help="start busy loops after this fraction of the timed runs (0: from the start)")
    parser.add_argument("--busy-loops", type=int, default=2)
    parser.add_argument("--probe-costs-only", action="store_true",
                        help="auto keeps its first probe's costs (no learning from its passes), for comparison")
    parser.add_argument("--busy-probe", action="store_true",
                        help="two busy loops while auto takes its first cost probe (untimed), none after")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--ks", default="1,2,3,4,6")
    parser.add_argument("--rounds", type=int, default=1, help="times through the prompts (less noise)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--small", action="store_true", help="the small demo family (seconds to build)")
    parser.add_argument("--target", help="a GGUF target of your own instead of the demo's (engine llama; "
                                         "the real model: `specdesk models fetch smollm2` prints its path)")
    parser.add_argument("--draft", help="its draft model (default: none with --target)")
    parser.add_argument("--chat", action="store_true", help="each prompt as a user message in the chat template")
    args = parser.parse_args()
    from specdesk.app.demo.install import build_family

    if args.target:
        paths = {"target_gguf": args.target, "draft_gguf": args.draft}
        args.engines = "llama"
    else:
        paths = build_family(small=args.small, progress=lambda m: print(m, file=sys.stderr))
    prompts = load_prompts(args.prompts)[:args.n_prompts]
    print(json.dumps({"prompts": args.prompts, "n": len(prompts), "busy_from": args.busy_from,
                      "target": paths["target_gguf"], "chat": args.chat}), flush=True)
    ks = [int(k) for k in args.ks.split(",")]
    for kind in args.engines.split(","):
        if kind == "torch":
            from specdesk.engines.torch.engine import TorchEngine

            engine = TorchEngine(paths["target_hf"], n_ctx=1024, device="cpu", dtype="float32",
                                 n_threads=args.threads)
            draft = paths["draft_hf"]
        else:
            from specdesk.engines.llama.engine import LlamaEngine

            target = paths["target_gguf"]
            if kind == "mtp-only":
                from specdesk.app.demo.export_native_gguf import build_native

                target = build_native(paths)["mtp_gguf"]
            engine = LlamaEngine(target, n_ctx=1024, n_threads=args.threads)
            draft = paths["draft_gguf"]
        engine.cost_learning = not args.probe_costs_only
        busy = BusyLoops(args.busy_loops) if args.busy_from is not None else None
        try:
            bench(kind, engine, configurations(kind, draft, ks), prompts, args.max_tokens, args.rounds,
                  args.busy_from if args.busy_from is not None else 2.0, busy, args.busy_probe, args.chat)
        finally:
            if busy is not None:
                busy.stop()
            engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
