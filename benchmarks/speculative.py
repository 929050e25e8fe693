"""Speculative decoding on the demo pair (or any GGUF pair): speedup vs the theoretical bound.

Prints one JSON line per (method, k): the compare report's figures plus
- `per_token_acceptance` a: the maximum-likelihood per-token acceptance of a geometric
  model, sum(L) / (sum(L) + passes that stopped short of k), where L is a pass's accepted
  run (a slot with no draft counts as a rejection, as it costs the same speedup);
- `bound`: expected tokens per pass (1 - a^(k+1)) / (1 - a) (Leviathan et al. 2023) times
  the cost of one baseline token, over the cost of a pass: mean drafted tokens x one draft
  step + one target pass over (mean drafted + 1) tokens, each measured in isolation;
- `achieved_over_bound`: measured speedup / bound.
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

from specdesk.app.compare import compare, load_prompts
from specdesk.app.paths import assets_dir
from specdesk.engines.llama.binding import GgufContext
from specdesk.engines.llama.engine import LlamaEngine
from specdesk.engines.spec.stats import expected_tokens_per_pass
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
            bound_geometric = expected_tokens_per_pass(a, k) * target_cost[1] / step_cost
            # The same cost model on the passes that actually ran (their drafted and committed
            # counts): the speedup with no overhead beyond the target passes and draft steps
            # measured in isolation. achieved / bound is what the implementation keeps of it.
            ideal_s = sum(target_cost[min(1 + d, max(target_cost))] + d * per_draft for d, _, _ in passes)
            bound = sum(c for _, _, c in passes) * target_cost[1] / ideal_s
            row = report.to_json()
            row.update({"per_token_acceptance": round(a, 4), "mean_drafted": round(mean_drafted, 3),
                        "bound": round(bound, 4), "achieved_over_bound": round(report.speedup / bound, 4),
                        "bound_geometric": round(bound_geometric, 4), "threads": args.threads,
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
