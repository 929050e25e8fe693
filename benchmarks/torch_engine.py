"""The PyTorch engine on the demo family: one JSON line per method with its speedup over
baseline decoding and its acceptance, all at the same k, on the same prompts.

    python benchmarks/torch_engine.py [--device auto|cpu|cuda|mps] [--k 4] [--prompts 6]
                                      [--max-tokens 96] [--methods ngram,ngram-pool,draft,mtp,dflash]
                                      [--small-demo] [--temperature 0]

Each line is `specdesk compare --engine torch`'s report plus the device and dtype; a last
line sums up acceptance per method. Baseline and speculative runs alternate per prompt
(app/runtime/compare.py), so both see the same machine state.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

METHODS = ("ngram", "ngram-pool", "draft", "mtp", "dflash")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=6, help="how many prompts of assets/prompts/code.jsonl")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--small-demo", action="store_true", help="the small test family instead of the demo")
    args = parser.parse_args(argv)

    from specdesk.app.runtime.compare import compare, load_prompts
    from specdesk.app.demo.install import build_family
    from specdesk.app.storage.paths import assets_dir
    from specdesk.engines.torch.engine import TorchEngine
    from specdesk.engines.types import SamplingParams, SpecConfig

    family = build_family(small=args.small_demo)
    prompts = load_prompts(assets_dir() / "prompts" / "code.jsonl")[:args.prompts]
    started = time.perf_counter()
    engine = TorchEngine(family["target_hf"], n_ctx=512, device=args.device, dtype=args.dtype, n_threads=args.threads)
    sampling = SamplingParams(temperature=args.temperature)
    summary = {}
    for method in args.methods.split(","):
        draft = {"draft": family["draft_hf"], "dflash": family.get("dflash_hf")}.get(method)
        spec = SpecConfig(method=method, k=args.k, draft_path=draft)
        report = compare(engine, prompts, spec, sampling, args.max_tokens, engine.tokenize)
        line = {**report.to_json(), "device": engine.device_description, "dtype": str(engine.dtype).removeprefix("torch.")}
        print(json.dumps(line), flush=True)
        summary[method] = {"acceptance_rate": line["speculative"]["acceptance_rate"],
                           "mean_accepted_length": line["speculative"]["mean_accepted_length"],
                           "speedup": line["speedup"], "identical_outputs": line["identical_outputs"]}
    print(json.dumps({"summary": summary, "k": args.k, "device": engine.device_description,
                      "seconds": round(time.perf_counter() - started, 1)}), flush=True)
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
