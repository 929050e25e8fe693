"""Decode speed per placement on llama.cpp's RPC backend: this machine's CPU served over RPC
from a child process (engines/llama/rpc.RpcServer), against the CPU alone.

For each placement of the demo target (CPU only; all, half and none of its layers on the RPC
device) and each method (none, draft with the draft beside the target), one JSON line:
{"placement", "target", "draft", "method", "k", "tok_s", "tokens", "acceptance",
"t_k_over_t1": {k: t(k)/t(1)}, "allocated_bytes": {model: {device: bytes}},
"estimated_device_bytes"}. t(k)/t(1) is a target pass over k tokens over a one-token pass
(benchmarks/speculative.pass_cost): what decides whether speculation pays on a placement.

The RPC device here is the same CPU behind a socket, so every placement on it is slower than
the CPU alone: the figure is for honesty, not speed. On a machine whose RPC server has a GPU
(`--rpc HOST:PORT` instead of the local server) the same lines measure that GPU.
Usage: python benchmarks/device_rpc.py [--small] [--threads 2] [--max-tokens 64] [--prompts 2]
       [--rpc HOST:PORT] [--ks 1,2,4,8]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading

from specdesk.app.runtime.compare import load_prompts
from specdesk.app.runtime.generation import run_once
from specdesk.app.storage.paths import assets_dir
from specdesk.engines.llama.engine import LlamaEngine
from specdesk.engines.llama.placement import Placement
from specdesk.engines.types import GenerationRequest, SpecConfig

from benchmarks.speculative import pass_cost


def placements(endpoint: str, n_layers: int) -> list[tuple[str, Placement, tuple]]:
    half = str(max(1, n_layers // 2))
    return [("cpu", Placement("CPU", 0), ()),
            ("rpc-all", Placement(endpoint, "all"), (endpoint,)),
            (f"rpc-{half}", Placement(endpoint, int(half)), (endpoint,)),
            ("rpc-0", Placement(endpoint, 0), (endpoint,))]


def measure(family: dict, name: str, placement: Placement, rpc: tuple, args, prompts: list[str]) -> list[dict]:
    engine = LlamaEngine(family["target_gguf"], n_ctx=1024, n_threads=args.threads, placement=placement,
                         draft_placement=placement, rpc=rpc)
    try:
        engine.load_draft(family["draft_gguf"])
        ks = [int(k) for k in args.ks.split(",")]
        t1 = pass_cost(engine.context, 1, repeats=args.repeats)
        ratios = {k: round(pass_cost(engine.context, k, repeats=args.repeats) / t1, 3) for k in ks if k > 1}
        report = engine.placement_report()
        rows = []
        for method in ("none", "draft"):
            spec = SpecConfig(method=method, k=args.k, draft_path=family["draft_gguf"] if method == "draft" else None)
            tokens, seconds, drafted, accepted = 0, 0.0, 0, 0
            for prompt in prompts:
                request = GenerationRequest(tuple(engine.tokenize(prompt)), max_tokens=args.max_tokens, spec=spec)
                run_once(engine, GenerationRequest(request.prompt_tokens, max_tokens=2, spec=spec))  # warm: prompt cached
                stats = run_once(engine, request, threading.Event()).stats
                tokens += stats.tokens
                seconds += stats.seconds
                drafted += stats.drafted
                accepted += stats.accepted
            rows.append({"placement": name, "target": report["target"]["n_gpu_layers"],
                         "n_layers": report["target"]["n_layers"], "device": report["target"]["device"],
                         "method": method, "k": args.k if method != "none" else 0,
                         "tok_s": round(tokens / max(seconds, 1e-9), 2), "tokens": tokens,
                         "acceptance": round(accepted / drafted, 3) if drafted else None,
                         "t1_ms": round(t1 * 1000, 3), "t_k_over_t1": ratios,
                         "allocated_bytes": {("target" if role == "target" else "draft"): place["allocated_bytes"]
                                             for role, place in report.items()},
                         "estimated_device_bytes": report["target"]["estimated_device_bytes"]})
        return rows
    finally:
        engine.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="the small demo family")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--ks", default="1,2,4,8", help="pass widths for t(k)/t(1)")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--rpc", help="an RPC server to measure instead of one on this CPU")
    args = parser.parse_args(argv)
    from specdesk.app.demo.install import build_family
    from specdesk.engines.llama.binding import validated_header
    from specdesk.engines.llama.placement import model_layout
    from specdesk.engines.llama.rpc import RpcServer

    family = build_family(small=args.small)
    prompts = [p for p in load_prompts(assets_dir() / "prompts" / "code.jsonl")[:args.prompts]]
    n_layers = model_layout(validated_header(family["target_gguf"])).n_layers
    server = None if args.rpc else RpcServer(n_threads=args.threads)
    endpoint = args.rpc or server.endpoint
    try:
        for name, placement, rpc in placements(endpoint, n_layers):
            for row in measure(family, name, placement, rpc, args, prompts):
                print(json.dumps(row), flush=True)
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
