"""The llama.cpp engine's native drafters on the demo family: one JSON line per (method, k) with
its speedup over plain decoding of the same file, then each method's best k.

    python benchmarks/llama_native.py [--methods eagle3,mtp,dflash,draft] [--ks 2,3,4]
                                      [--prompts benchmarks/heldout/code.jsonl] [--n-prompts 6]
                                      [--max-tokens 96] [--threads 2]

EAGLE-3 and DFlash run on the demo target's GGUF with the family's drafter GGUFs; MTP runs on
the target exported with its MTP layer (glm4moe), against plain decoding of that same file.
Each line is `specdesk compare`'s report: baseline and speculative runs alternate per prompt
(app/runtime/compare.py), so both see the same machine state.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="eagle3,mtp,dflash,draft")
    parser.add_argument("--ks", default="2,3,4")
    parser.add_argument("--prompts", default="benchmarks/heldout/code.jsonl")
    parser.add_argument("--n-prompts", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    from specdesk.app.demo.export_native_gguf import build_native
    from specdesk.app.demo.install import build_family
    from specdesk.app.runtime.compare import compare, load_prompts
    from specdesk.engines.llama.engine import LlamaEngine
    from specdesk.engines.types import SamplingParams, SpecConfig

    family = build_family()
    native = build_native(family)
    prompts = load_prompts(args.prompts)[:args.n_prompts]
    started = time.perf_counter()
    summary, best = {}, {}
    for method in args.methods.split(","):
        target = native["mtp_gguf"] if method == "mtp" else family["target_gguf"]
        draft = {"dflash": native["dflash_gguf"], "eagle3": native["eagle3_gguf"], "draft": family["draft_gguf"]}.get(method)
        engine = LlamaEngine(target, n_threads=args.threads)
        for k in [int(x) for x in args.ks.split(",")]:
            report = compare(engine, prompts, SpecConfig(method=method, k=k, draft_path=draft),
                             SamplingParams(temperature=0.0), args.max_tokens, engine.tokenize)
            line = {**report.to_json(), "threads": args.threads, "drafter_source": native.get(f"{method}_source")}
            print(json.dumps(line), flush=True)
            name = f"{method} k={k}"
            summary[name] = {"speedup": line["speedup"], "acceptance_rate": line["speculative"]["acceptance_rate"],
                             "identical_outputs": line["identical_outputs"]}
            if method not in best or line["speedup"] > summary[best[method]]["speedup"]:
                best[method] = name
        engine.close()
    print(json.dumps({"summary": summary, "best_k": {m: {"setting": n, **summary[n]} for m, n in best.items()},
                      "prompts": args.prompts, "n_prompts": len(prompts), "max_tokens": args.max_tokens,
                      "threads": args.threads, "seconds": round(time.perf_counter() - started, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
