"""The llama.cpp engine's native drafters on the demo family: one JSON line per (method, k) with
its speedup over plain decoding of the same file, then each method's best k.

    python benchmarks/llama_native.py [--methods eagle3,mtp,dflash,dspark,draft] [--ks 1,2,3,4]
                                      [--prompts benchmarks/heldout/code.jsonl] [--n-prompts 6]
                                      [--max-tokens 96] [--threads 2] [--repeats 1] [--draft-weights q8,file]

EAGLE-3, DFlash and DSpark run on the demo target's GGUF with the family's drafter GGUFs (DSpark
as a DFlash drafter); MTP runs on the target exported with its MTP layer (glm4moe), against
plain decoding of that same file. Each line is `specdesk compare`'s report: baseline and
speculative runs alternate per prompt (app/runtime/compare.py), so both see the same machine
state. With --repeats N every setting runs N times (rounds over all settings, so a slow spell
of the machine touches each of them) and the last line gives each one's median and spread.
`--draft-weights q8,file` runs the draft model from its Q8_0 copy and from its own file
(engines/llama/draft_copy.py) as two settings.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: its own folder is on the path, the repository's root is not
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="eagle3,mtp,dflash,dspark,draft")
    parser.add_argument("--ks", default="1,2,3,4", help="draft lengths; k = 1 is where a drafter whose later rows are rarely accepted (MTP) does best")
    parser.add_argument("--prompts", default="benchmarks/heldout/code.jsonl")
    parser.add_argument("--n-prompts", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="runs of every setting (the median is reported)")
    parser.add_argument("--draft-weights", default="q8",
                        help="the draft model's weights on the CPU, one or several of q8 (a Q8_0 copy of a float "
                             "draft, the default) and file (the file as it is); each is a setting of its own, and "
                             "with --repeats the settings run in turn, in the opposite order every other repeat")
    args = parser.parse_args(argv)

    from specdesk.app.demo.export_native_gguf import build_native
    from specdesk.app.demo.install import build_family
    from specdesk.app.runtime.compare import compare, load_prompts
    from specdesk.engines.llama.engine import LlamaEngine
    from specdesk.engines.types import SamplingParams, SpecConfig

    from benchmarks.repeats import add_run, summarize

    family = build_family()
    native = build_native(family)
    prompts = load_prompts(args.prompts)[:args.n_prompts]
    started = time.perf_counter()
    runs: dict[str, list[dict]] = {}
    drafts = {"dflash": native["dflash_gguf"], "eagle3": native["eagle3_gguf"], "dspark": native.get("dspark_gguf"),
              "draft": family["draft_gguf"]}
    methods = args.methods.split(",")
    if "dspark" in methods and not drafts["dspark"]:
        print(json.dumps({"method": "dspark", "skipped": "this family has no DSpark drafter"}), flush=True)
        methods.remove("dspark")
    weights = args.draft_weights.split(",")
    settings = [(m, w) for m in methods for w in (weights if m == "draft" else ["q8"])]
    for repeat in range(args.repeats):
        for method, draft_weights in (settings if repeat % 2 == 0 else settings[::-1]):  # neither always first
            target = native["mtp_gguf"] if method == "mtp" else family["target_gguf"]
            engine = LlamaEngine(target, n_threads=args.threads, draft_weights=draft_weights)
            name = f"{method} ({draft_weights})" if method == "draft" and len(weights) > 1 else method
            for k in [int(x) for x in args.ks.split(",")]:
                runs_as = "dflash" if method == "dspark" else method
                report = compare(engine, prompts, SpecConfig(method=runs_as, k=k, draft_path=drafts.get(method)),
                                 SamplingParams(temperature=0.0), args.max_tokens, engine.tokenize)
                line = {**report.to_json(), "method": method, "threads": args.threads,
                        "drafter_source": native.get(f"{method}_source", "trained" if method == "dspark" else None),
                        **({"draft_weights": draft_weights} if method == "draft" else {})}
                print(json.dumps(line), flush=True)
                add_run(runs, f"{name} k={k}", {"speedup": line["speedup"],
                                                "acceptance_rate": line["speculative"]["acceptance_rate"],
                                                "identical_outputs": line["identical_outputs"]})
            engine.close()
    summary, best = summarize(runs)
    print(json.dumps({"summary": summary, "best_k": {m: {"setting": n, **summary[n]} for m, n in best.items()},
                      "prompts": args.prompts, "n_prompts": len(prompts), "max_tokens": args.max_tokens,
                      "threads": args.threads, "repeats": args.repeats,
                      "seconds": round(time.perf_counter() - started, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
