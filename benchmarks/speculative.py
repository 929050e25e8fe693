"""Speculative decoding on the demo pair (or any GGUF pair): speedup vs a cost model of the passes that ran.

Prints one JSON line per (method, k): the compare report's figures plus
- `per_token_acceptance` a: the maximum-likelihood per-token acceptance of a geometric
  model, sum(L) / (sum(L) + passes that stopped short of k), where L is a pass's accepted
  run (a slot with no draft counts as a rejection, as it costs the same speedup);
- `model_speedup`: what a cost model predicts for the passes that actually ran: their
  committed tokens x t(1) over the sum of t(1 + drafted) + drafted x t(draft step), with the
  target pass costs t(n) and the draft step measured in isolation (`cost_model_speedup`).
  It is an estimate, not an upper bound: a run can beat it when its passes run faster than
  the isolated measurements (warm caches, a quieter moment);
- `achieved_over_model`: measured speedup / model_speedup, what the implementation keeps;
- `model_speedup_geometric`: Leviathan et al.'s estimate from the geometric acceptance a:
  (1 - a^(k+1)) / (1 - a) tokens per pass at mean drafted x t(draft step) + t(mean drafted + 1).
A final line reports peak resident memory of a baseline and a speculative process.
Usage: python benchmarks/speculative.py [--methods draft,ngram,ngram-pool] [--ks 1,2,4,6,8]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from specdesk.app.runtime.compare import compare, load_prompts
from specdesk.app.storage.paths import assets_dir
from specdesk.engines.llama.binding import GgufContext
from specdesk.engines.llama.engine import LlamaEngine
from specdesk.engines.speculation.stats import expected_tokens_per_pass
from specdesk.engines.types import GenerationRequest, SamplingParams, SpecConfig


def pass_cost(context: GgufContext, n_tokens: int, position: int = 128, repeats: int = 41) -> float:
    """Median seconds of one decode of n_tokens at `position`, rolled back after each."""
    context.rollback(0)
    context.decode([1] * position, all_logits=False)
    times = []
    for _ in range(repeats + 2):
        started = time.perf_counter()
        context.decode([7] * n_tokens, all_logits=True)
        times.append(time.perf_counter() - started)
        context.rollback(position)
    context.rollback(0)
    return statistics.median(times[2:])


def cost_model_speedup(passes: list[tuple[int, int]], target_cost: dict[int, float], draft_step_s: float) -> float:
    """The speedup the passes that ran would give with no cost but target passes and draft steps.

    `passes` holds (drafted, committed) per speculative pass; `target_cost[n]` is one target pass
    over n tokens (passes over more tokens than measured cost the largest measured one). Baseline
    commits one token per t(1), so: sum(committed) x t(1) / sum(t(1 + drafted) + drafted x step).
    """
    if not passes:
        raise ValueError("no passes to model")
    largest = max(target_cost)
    model_s = sum(target_cost[min(1 + drafted, largest)] + drafted * draft_step_s for drafted, _ in passes)
    return sum(committed for _, committed in passes) * target_cost[1] / model_s


def geometric_acceptance(runs: list[tuple[int, int]], k: int) -> float:
    """runs: (drafted, accepted) per pass."""
    accepted = sum(a for _, a in runs)
    short = sum(1 for _, a in runs if a < k)
    return accepted / (accepted + short) if accepted + short else 0.0


def interpolate(costs: dict[int, float], n: float) -> float:
    lo = int(np.floor(n))
    hi = min(lo + 1, max(costs))
    return costs[lo] + (costs[hi] - costs[lo]) * (n - lo)


def memory_probe(target: str, draft: str | None, method: str, prompts: list[str], threads: int) -> None:
    engine = LlamaEngine(target, n_threads=threads)
    spec = SpecConfig(method=method, k=4, draft_path=draft) if method != "none" else SpecConfig()
    for prompt in prompts:
        request = GenerationRequest(tuple(engine.tokenize(prompt)), max_tokens=64, spec=spec)
        for _ in engine.generate(request, threading.Event()):
            pass
    print(json.dumps({"peak_rss_bytes": peak_rss_bytes()}))


def peak_rss_bytes() -> int:
    """This process's peak resident set. Linux keeps ru_maxrss across exec (a child started
    from a large parent would report the parent's peak), so VmHWM is read where it exists."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--methods", default="draft,ngram,ngram-pool")
    parser.add_argument("--ks", default="1,2,4,6,8")
    parser.add_argument("--prompts", default=str(assets_dir() / "prompts" / "code.jsonl"))
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--memory-probe", choices=["none", "draft"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.target is None:
        from specdesk.app.demo.install import build_family

        paths = build_family(progress=lambda m: print(m, file=sys.stderr))
        args.target, args.draft = paths["target_gguf"], args.draft or paths["draft_gguf"]
    prompts = load_prompts(args.prompts)
    if args.memory_probe:
        memory_probe(args.target, args.draft, args.memory_probe, prompts[:4], args.threads)
        return 0

    engine = LlamaEngine(args.target, n_threads=args.threads)
    target_cost = {n: pass_cost(engine.context, n) for n in range(1, 10)}
    draft_step = 0.0
    if args.draft:
        draft_step = pass_cost(engine.load_draft(args.draft), 1)
    print(json.dumps({"costs": {"target_pass_s": {str(n): round(c, 6) for n, c in target_cost.items()},
                                "draft_step_s": round(draft_step, 6),
                                "draft_over_target": round(draft_step / target_cost[1], 4)}}), flush=True)
    sampling = SamplingParams()
    for method in args.methods.split(","):
        for k in [int(x) for x in args.ks.split(",")]:
            spec = SpecConfig(method=method, k=k, draft_path=args.draft if method == "draft" else None)
            passes: list[tuple[int, int, int]] = []  # (drafted, accepted, committed) per speculative pass

            def on_event(label, index, event, passes=passes):
                if label == "speculative":
                    passes.append((event.drafted, event.accepted, len(event.tokens)))

            report = compare(engine, prompts, spec, sampling, args.max_tokens, engine.tokenize, on_event=on_event)
            a = geometric_acceptance([(d, acc) for d, acc, _ in passes], k)
            mean_drafted = sum(d for d, _, _ in passes) / max(1, len(passes))
            per_draft = draft_step if method == "draft" else 0.0
            # Leviathan et al.'s expected speedup: geometric acceptance a, k drafted every pass.
            step_cost = mean_drafted * per_draft + interpolate(target_cost, mean_drafted + 1)
            model_geometric = expected_tokens_per_pass(a, k) * target_cost[1] / step_cost
            model = cost_model_speedup([(d, c) for d, _, c in passes], target_cost, per_draft)
            row = report.to_json()
            row.update({"per_token_acceptance": round(a, 4), "mean_drafted": round(mean_drafted, 3),
                        "model_speedup": round(model, 4), "achieved_over_model": round(report.speedup / model, 4),
                        "model_speedup_geometric": round(model_geometric, 4), "threads": args.threads,
                        "max_tokens": args.max_tokens})
            print(json.dumps(row), flush=True)
    engine.close()

    peaks = {}
    for method in ("none", "draft"):
        out = subprocess.run([sys.executable, __file__, "--target", args.target, "--draft", args.draft or "",
                              "--memory-probe", method, "--threads", str(args.threads)],
                             capture_output=True, text=True, check=True)
        peaks[method] = json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_bytes"]
    draft_bytes = Path(args.draft).stat().st_size if args.draft else 0
    probe = LlamaEngine(args.target, n_threads=1)
    draft_kv = probe.load_draft(args.draft).model.kv_cache_bytes(probe.n_ctx) if args.draft else 0
    allowed = draft_bytes + draft_kv + 50 * 2**20
    probe.close()
    added = peaks["draft"] - peaks["none"]
    print(json.dumps({"memory": {"baseline_peak_rss_bytes": peaks["none"], "draft_peak_rss_bytes": peaks["draft"],
                                 "added_bytes": added, "draft_file_bytes": draft_bytes, "draft_kv_cache_bytes": draft_kv,
                                 "allowed_added_bytes": allowed, "within_allowance": added <= allowed}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
