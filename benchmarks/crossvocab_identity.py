"""Cross-vocabulary drafting keeps the target's greedy output: every pair, 24 held-out prompts.

Pairs: each vocabulary of the small zoo (qwen2, llama-bpe, phi-3, command-r, gemma-4: real
tokenizers, untrained weights) as the target with the next one's draft, the demo target with
SmolLM2-135M-Instruct as its draft, and SmolLM2 with the demo's draft. Prompts: the 12 held-out
code and 12 held-out mixed prompts (benchmarks/heldout/), which no test reads. One JSON line per
pair and engine: prompts whose output equals plain decoding token for token, drafted and accepted
draft tokens. The suite checks fewer prompts per pair (tests/test_crossvocab.py); this is the
full bar.

    python -m benchmarks.crossvocab_identity [--engines llama,torch] [--max-tokens 24] [--skip llama:phi-3<-qwen2,...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from specdesk.app.runtime.compare import load_prompts
from specdesk.app.runtime.generation import run_once
from specdesk.engines.methods import METHODS
from specdesk.engines.speculation.proposers import crosses_vocabularies
from specdesk.engines.types import GenerationRequest, SamplingParams, SpecConfig

from . import zoo

HELDOUT = Path(__file__).resolve().parent / "heldout"
METHOD = next(name for name in METHODS if crosses_vocabularies("llama.cpp", name))


def pairs(engine: str) -> list[tuple[str, str, str]]:
    """(label, target, draft) for one engine: GGUF files for llama.cpp, HF folders for PyTorch."""
    key = "gguf" if engine == "llama" else "hf"
    paths = {name: zoo.build(name, "F16", small=True) for name in sorted(zoo.FAMILIES)}
    names = sorted(paths)
    found = [(f"{n}<-{names[(i + 1) % len(names)]}", paths[n][f"target_{key}"],
              paths[names[(i + 1) % len(names)]][f"draft_{key}"]) for i, n in enumerate(names)]
    # the small zoo writes Hugging Face folders for some families only (config.json present)
    found = [pair for pair in found if engine == "llama" or all((Path(p) / "config.json").is_file() for p in pair[1:])]
    if engine == "llama":
        from specdesk.app.demo.install import build_family
        from specdesk.app.models.known import fetch

        demo, smollm2 = build_family(small=True), str(fetch("smollm2"))
        found += [("demo<-smollm2", demo["target_gguf"], smollm2), ("smollm2<-demo", smollm2, demo["draft_gguf"])]
    # the 256k and 262k vocabularies (command-r, gemma-4) are the slowest to tokenize: last
    return sorted(found, key=lambda pair: any(big in pair[0] for big in ("command-r", "gemma-4")))


def open_engine(engine: str, target: str):
    if engine == "llama":
        from specdesk.engines.llama.engine import LlamaEngine

        return LlamaEngine(target, n_ctx=1024, n_threads=2)
    from specdesk.engines.torch.engine import TorchEngine

    return TorchEngine(target, n_ctx=1024, device="cpu")


def run(engine, tokens: list[int], spec: SpecConfig, max_tokens: int) -> tuple[list[int], dict]:
    result = run_once(engine, GenerationRequest(tuple(tokens), max_tokens=max_tokens, sampling=SamplingParams(), spec=spec))
    return list(result.tokens), {"drafted": result.stats.drafted, "accepted": result.stats.accepted}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="llama")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--skip", default="", help="comma-separated engine:pair labels already measured")
    args = parser.parse_args(argv)
    prompts = load_prompts(HELDOUT / "code.jsonl") + load_prompts(HELDOUT / "mixed.jsonl")
    failed = 0
    for engine_name in args.engines.split(","):
        for label, target, draft in pairs(engine_name):
            if f"{engine_name}:{label}" in args.skip.split(","):
                continue
            started = time.perf_counter()
            engine = open_engine(engine_name, target)
            identical, drafted, accepted, first_difference = 0, 0, 0, None
            try:
                spec = SpecConfig(method=METHOD, k=4, draft_path=draft)
                for done, prompt in enumerate(prompts, start=1):
                    tokens = list(engine.tokenize(prompt))
                    plain, _ = run(engine, tokens, SpecConfig(method="none"), args.max_tokens)
                    crossed, counts = run(engine, tokens, spec, args.max_tokens)
                    drafted, accepted = drafted + counts["drafted"], accepted + counts["accepted"]
                    if crossed == plain:
                        identical += 1
                    elif first_difference is None:
                        first_difference = prompt[:60]
                    print(f"{label}: {identical} of {done} identical", file=sys.stderr, flush=True)
            finally:
                engine.close()
            failed += identical != len(prompts)
            print(json.dumps({"engine": engine_name, "pair": label, "prompts": len(prompts), "identical": identical,
                              "drafted": drafted, "accepted": accepted, "first_difference": first_difference,
                              "max_tokens": args.max_tokens, "seconds": round(time.perf_counter() - started, 1)}),
                  flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
