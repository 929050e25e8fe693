"""The PyTorch engine on the demo family: one JSON line per method with its speedup over
baseline decoding and its acceptance, all at the same k, on the same prompts.

    python benchmarks/torch_engine.py [--device auto|cpu|cuda|mps] [--k 4 | --ks 2,3,4] [--prompts 6]
                                      [--prompts-file benchmarks/heldout/code.jsonl]
                                      [--max-tokens 96] [--methods ngram,ngram-pool,draft,mtp,dflash,dspark,eagle3]
                                      [--small-demo] [--temperature 0] [--repeats 1]

Each line is `specdesk compare --engine torch`'s report plus the device and dtype; a last
line sums up acceptance per method and k, and each method's best k. Baseline and speculative runs alternate per prompt
(app/runtime/compare.py), so both see the same machine state. DSpark runs as a DFlash drafter.
With --repeats N every setting runs N times (in rounds over all settings) and the last line gives
each one's median speedup and spread.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: its own folder is on the path, the repository's root is not
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

METHODS = ("ngram", "ngram-pool", "draft", "mtp", "dflash", "dspark", "eagle3")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--ks", help="several k, comma-separated (each method's best is summed up)")
    parser.add_argument("--prompts", type=int, default=6, help="how many prompts of the prompt file")
    parser.add_argument("--prompts-file", help="JSONL prompts (default assets/prompts/code.jsonl)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--small-demo", action="store_true", help="the small test family instead of the demo")
    parser.add_argument("--repeats", type=int, default=1, help="runs of every setting (the median is reported)")
    args = parser.parse_args(argv)

    from specdesk.app.runtime.compare import compare, load_prompts
    from specdesk.app.demo.install import build_family
    from specdesk.app.storage.paths import assets_dir
    from specdesk.engines.torch.engine import TorchEngine
    from specdesk.engines.types import SamplingParams, SpecConfig

    family = build_family(small=args.small_demo)
    prompts = load_prompts(args.prompts_file or assets_dir() / "prompts" / "code.jsonl")[:args.prompts]
    ks = [int(k) for k in args.ks.split(",")] if args.ks else [args.k]
    started = time.perf_counter()
    engine = TorchEngine(family["target_hf"], n_ctx=512, device=args.device, dtype=args.dtype, n_threads=args.threads)
    sampling = SamplingParams(temperature=args.temperature)
    from benchmarks.repeats import add_run, summarize

    drafts = {"draft": family["draft_hf"], "dflash": family.get("dflash_hf"), "eagle3": family.get("eagle3_hf"),
              "dspark": family.get("dspark_hf")}
    methods = args.methods.split(",")
    for method in ("eagle3", "dspark"):
        if method in methods and drafts[method] is None:
            print(json.dumps({"method": method, "skipped": f"this family has no trained {method} drafter"}), flush=True)
            methods.remove(method)
    runs: dict[str, list[dict]] = {}
    for _ in range(args.repeats):
        for method in methods:
            for k in ks:
                spec = SpecConfig(method="dflash" if method == "dspark" else method, k=k, draft_path=drafts.get(method))
                report = compare(engine, prompts, spec, sampling, args.max_tokens, engine.tokenize)
                line = {**report.to_json(), "method": method, "device": engine.device_description,
                        "dtype": str(engine.dtype).removeprefix("torch.")}
                print(json.dumps(line), flush=True)
                add_run(runs, f"{method} k={k}", {"acceptance_rate": line["speculative"]["acceptance_rate"],
                                                  "mean_accepted_length": line["speculative"]["mean_accepted_length"],
                                                  "speedup": line["speedup"], "identical_outputs": line["identical_outputs"]})
    summary, best = summarize(runs)
    print(json.dumps({"summary": summary, "best_k": {m: {"setting": n, "speedup": summary[n]["speedup"],
                                                         "spread": summary[n]["spread"]} for m, n in best.items()},
                      "ks": ks, "repeats": args.repeats, "device": engine.device_description,
                      "seconds": round(time.perf_counter() - started, 1)}), flush=True)
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
