"""SpecDesk's llama.cpp engine on the real-shaped zoo (benchmarks/zoo.py): one JSON line per
family x quant.

- t_ratio: the target pass cost t(k + 1 tokens) / t(1 token) for k = 1..8 drafted tokens, from
  the target passes of draft runs at each k (median seconds per pass);
- overhead_us / overhead_share: SpecDesk's per-step time beyond the target and draft passes
  (verify, logits copy, bookkeeping, event), median over the steps of a greedy draft run, in
  microseconds and as a share of a one-token target pass; overhead_topp_* the same sampling
  at temperature 0.8, top-p 0.9;
- acceptance / speedup: for the high and low acceptance drafts (k = 4), speedup = speculative
  tok/s / baseline tok/s, both decode-only and within this run;
- peer_tok_s / ours_over_peer: llama.cpp's own llama-speculative-simple (built once from the
  vendored source, as benchmarks/native_drivers.py does) on the same target, high draft, k,
  threads and prompt, decode-only; SpecDesk tok/s over it;
- identical: greedy speculative tokens equal baseline's for both drafts (random weights leave
  an occasional near-tie, top-2 gap under batch rounding, where a k-token pass may pick the
  other token; the tests hold identity on their prompts).

Usage: python -m benchmarks.real_shapes [--families qwen2,llama-bpe] [--quants F16,Q4_K_M]
       [--small] [--threads 2] [--max-tokens 48] [--no-peer]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

from benchmarks import zoo
from benchmarks.native_drivers import build_driver, run_native, run_specdesk
from specdesk.engines.llama.engine import LlamaEngine
from specdesk.engines.types import GenerationRequest, SamplingParams, SpecConfig

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle. Once upon a time"


class TimedTarget:
    """Times the engine's target passes (its StepTarget hook) without changing what they do."""

    def __init__(self, engine: LlamaEngine):
        self.passes: list[tuple[int, float]] = []  # (tokens in the pass, seconds)
        inner = engine.target_pass

        def timed(tokens, proposer):
            started = time.perf_counter()
            output = inner(tokens, proposer)
            self.passes.append((len(tokens), time.perf_counter() - started))
            return output
        engine.target_pass = timed


def decode(engine: LlamaEngine, timer: TimedTarget, prompt: tuple, spec: SpecConfig, max_tokens: int,
           sampling: SamplingParams = SamplingParams()) -> dict:
    """One generation after a warm-up that puts the prompt in the cache; per-step timings."""
    for _ in engine.generate(GenerationRequest(prompt, max_tokens=1, spec=spec, sampling=sampling), threading.Event()):
        pass
    timer.passes.clear()
    tokens, steps, overheads = [], 0, []
    drafted = accepted = 0
    started = last = time.perf_counter()
    for event in engine.generate(GenerationRequest(prompt, max_tokens=max_tokens, spec=spec, sampling=sampling,
                                                   stop_at_eos=False), threading.Event()):
        now = time.perf_counter()
        target_s = timer.passes[steps][1] if steps < len(timer.passes) else 0.0
        overheads.append((now - last) - event.draft_s - target_s)
        last = now
        steps += 1
        tokens.extend(event.tokens)
        drafted += event.drafted
        accepted += event.accepted
    seconds = time.perf_counter() - started
    return {"tokens": tokens, "tok_s": len(tokens) / seconds, "acceptance": accepted / drafted if drafted else None,
            "overhead_s": statistics.median(overheads[1:] or overheads), "passes": list(timer.passes)}


def measure(family: str, quant: str, small: bool, threads: int, max_tokens: int, peer: bool) -> dict:
    paths = zoo.build(family, quant, small=small)
    engine = LlamaEngine(paths["target_gguf"], n_ctx=2048, n_threads=threads)
    timer = TimedTarget(engine)
    prompt = tuple(engine.tokenize(PROMPT))
    base = decode(engine, timer, prompt, SpecConfig(method="none", k=0), max_tokens)
    one_pass = statistics.median(s for n, s in base["passes"] if n == 1)
    t_ratio = {}
    for k in range(1, 9):
        run = decode(engine, timer, prompt, SpecConfig(method="draft", k=k, draft_path=paths["draft_gguf"]), 12)
        sizes = [s for n, s in run["passes"] if n == k + 1]
        if sizes:
            t_ratio[str(k)] = round(statistics.median(sizes) / one_pass, 3)
    runs = {level: decode(engine, timer, prompt, SpecConfig(method="draft", k=4, draft_path=paths[key]), max_tokens)
            for level, key in (("high", "draft_gguf"), ("low", "draft_low_gguf"))}
    top_p = decode(engine, timer, prompt, SpecConfig(method="draft", k=4, draft_path=paths["draft_gguf"]), max_tokens,
                   SamplingParams(temperature=0.8, top_p=0.9, seed=1))
    line = {"family": family, "quant": quant, "small": small, "params": paths["params"], "vocab": paths["vocab_size"],
            "threads": threads, "t_ratio": t_ratio,
            "overhead_us": round(runs["high"]["overhead_s"] * 1e6, 1),
            "overhead_share": round(runs["high"]["overhead_s"] / one_pass, 4),
            "overhead_topp_us": round(top_p["overhead_s"] * 1e6, 1),
            "overhead_topp_share": round(top_p["overhead_s"] / one_pass, 4),
            "acceptance": {level: round(r["acceptance"], 3) for level, r in runs.items()},
            "speedup": {level: round(r["tok_s"] / base["tok_s"], 3) for level, r in runs.items()},
            "baseline_tok_s": round(base["tok_s"], 2),
            "identical": all(r["tokens"] == base["tokens"] for r in runs.values())}
    if peer:
        binary = build_driver()
        files = {"target_gguf": paths["target_gguf"], "draft_gguf": paths["draft_gguf"],
                 "dflash_gguf": None, "eagle3_gguf": None}
        native = run_native(binary, "draft", files, PROMPT, 4, max_tokens, threads, 2048)
        ours = run_specdesk(engine, "draft", files, PROMPT, 4, max_tokens)
        peer_tok_s = native["tokens"] / native["seconds"]
        line.update(peer_tok_s=round(peer_tok_s, 2), ours_tok_s=round(ours["tokens"] / ours["seconds"], 2),
                    ours_over_peer=round(ours["tokens"] / ours["seconds"] / peer_tok_s, 3),
                    peer_acceptance=round(native["accepted"] / native["drafted"], 3) if native["drafted"] else None)
    engine.close()
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default="qwen2,llama-bpe")
    parser.add_argument("--quants", default="F16,Q4_K_M")
    parser.add_argument("--small", action="store_true", help="the test suite's narrow models (a quick check)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--no-peer", action="store_true", help="skip llama.cpp's own driver")
    args = parser.parse_args()
    for family in args.families.split(","):
        for quant in args.quants.split(","):
            print(json.dumps(measure(family, quant, args.small, args.threads, args.max_tokens, not args.no_peer)),
                  flush=True)


if __name__ == "__main__":
    main()
