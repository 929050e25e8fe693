"""Cross-vocabulary drafting on this machine: what retokenizing costs per drafted token against
the draft model's own step, and the speedup of each cross-vocabulary pair here (greedy, the
method's own runs against plain decoding on the same prompts), the best one last.

Pairs (default): SmolLM2-135M-Instruct drafting for the demo family's targets and the demo
drafts drafting for SmolLM2. `--pair TARGET DRAFT` measures others instead (the zoo's qwen2 at
Qwen2.5-0.5B's shapes, `python -m benchmarks.zoo build --family qwen2 --quant Q4_K_M`, with
SmolLM2 as its draft: random weights, so acceptance near nothing and only the costs count).

Usage: python -m benchmarks.crossvocab [--pair TARGET DRAFT]... [--k 4] [--tokens 48] [--threads N]
prints one JSON line per pair, then {"best": ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Optional

from specdesk.app.models.crossvocab_pair import predict_files
from specdesk.app.runtime.compare import load_prompts
from specdesk.app.storage.paths import assets_dir


def default_pairs() -> list[tuple[str, str, str]]:
    """(label, target, draft) from the demo family (both sizes) and SmolLM2."""
    from specdesk.app.demo.install import build_family
    from specdesk.app.models.known import fetch

    smollm2 = str(fetch("smollm2"))
    full, small = build_family(small=False), build_family(small=True)
    return [("demo-full-target<-smollm2", full["target_gguf"], smollm2),
            ("demo-small-target<-smollm2", small["target_gguf"], smollm2),
            ("smollm2<-demo-full-draft", smollm2, full["draft_gguf"]),
            ("smollm2<-demo-small-draft", smollm2, small["draft_gguf"])]


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", nargs=2, action="append", metavar=("TARGET", "DRAFT"))
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--prompts", type=int, default=6, help="code prompts of assets/prompts/code.jsonl")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    pairs = [(f"{Path(t).name}<-{Path(d).name}", t, d) for t, d in args.pair] if args.pair else default_pairs()
    prompts = load_prompts(assets_dir() / "prompts" / "code.jsonl")[:args.prompts]
    results = []
    for label, target, draft in pairs:
        found = predict_files(target, draft, prompts, args.k, args.tokens, args.threads).to_json()
        line = {"pair": label, "retokenize_over_draft_step": round(found["retokenize_ms_per_token"]
                                                                  / max(found["draft_step_ms"], 1e-9), 4),
                **found, "load": os.getloadavg()[0]}
        results.append(line)
        print(json.dumps(line), flush=True)
    best = max(results, key=lambda r: r["measured_speedup"])
    print(json.dumps({"best": best["pair"], "measured_speedup": best["measured_speedup"],
                      "expected_speedup": best["expected_speedup"], "pays": best["pays"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
