"""Compare through served engines: baseline vs speculative on OpenAI-compatible servers.

By default it builds (once, cached) and starts llama-server from the vendored llama.cpp twice
on the demo pair, with --metrics: without a draft (the baseline) and with the demo draft
(draft-simple, k tokens). Then app/serving/served.compare_served runs every prompt on both, alternating
which goes first, greedy, and prints one JSON line: the local compare's JSON (tok/s measured
from each stream, the speculative server's own acceptance, tokens per pass and per-position
acceptance, identical greedy text) plus where each arm ran.

With --endpoint URL [--baseline-endpoint URL2] it measures servers already running instead
(a vLLM or SGLang on a GPU machine; one endpoint alone needs `specdesk serve`).

Usage: python benchmarks/served.py [--small] [--k 4] [--max-tokens 128] [--prompts N] [--threads 1]
       python benchmarks/served.py --endpoint URL [--baseline-endpoint URL2] [--model ID] [--api-key KEY]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

from specdesk.app.runtime.compare import load_prompts
from specdesk.app.serving.endpoint import Endpoint
from specdesk.app.storage.paths import assets_dir
from specdesk.app.serving.served import compare_served, report_json
from specdesk.engines.types import SamplingParams


def native_drivers():
    spec = importlib.util.spec_from_file_location("native_drivers", Path(__file__).parent / "native_drivers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", help="a running speculative server instead of the demo llama-servers")
    parser.add_argument("--baseline-endpoint", help="its baseline: the same model without speculation")
    parser.add_argument("--model", help="the servers' model id (default: the first each lists)")
    parser.add_argument("--api-key", default=os.environ.get("SPECDESK_API_KEY"))
    parser.add_argument("--small", action="store_true", help="the small test family instead of the shipped one")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=0, help="use the first N prompts of assets/prompts/code.jsonl")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads per server (default 1: two servers on a small machine, llama.cpp threads spin)")
    parser.add_argument("--jobs", type=int, default=2, help="parallel compile jobs for the one-time build")
    args = parser.parse_args()

    prompts = load_prompts(assets_dir() / "prompts" / "code.jsonl")
    prompts = prompts[:args.prompts] if args.prompts else prompts
    children = []
    try:
        if args.endpoint:
            speculative = Endpoint(args.endpoint, api_key=args.api_key, model=args.model)
            baseline = Endpoint(args.baseline_endpoint, api_key=args.api_key, model=args.model) \
                if args.baseline_endpoint else None
            setup = {"servers": "given"}
        else:
            from specdesk.app.demo.install import build_family

            native = native_drivers()
            started = time.monotonic()
            binary = native.build_driver(args.jobs, native.SERVER)
            family = build_family(small=args.small)
            spec_child, spec_url = native.start_server(binary, family["target_gguf"], family["draft_gguf"], args.k,
                                                       args.threads)
            children.append((native, spec_child))
            base_child, base_url = native.start_server(binary, family["target_gguf"], None, args.k, args.threads)
            children.append((native, base_child))
            speculative, baseline = Endpoint(spec_url), Endpoint(base_url)
            setup = {"servers": "llama-server (vendored llama.cpp, CPU)", "k": args.k, "threads": args.threads,
                     "family": "small" if args.small else "shipped",
                     "build_and_start_s": round(time.monotonic() - started, 1)}
        speculative.probe()
        if baseline is not None:
            baseline.probe()
        report = compare_served(speculative, baseline, prompts, SamplingParams(), args.max_tokens)
        print(json.dumps({**report_json(report, speculative, baseline), **setup}), flush=True)
    finally:
        for native, child in children:
            native.stop_server(child)


if __name__ == "__main__":
    sys.exit(main())
