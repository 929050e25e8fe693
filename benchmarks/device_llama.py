"""SpecDesk's llama.cpp engine with every layer on a GPU: the llama.cpp part of
benchmarks/device_cuda.sh.

On the zoo's Llama-3 pair (benchmarks/zoo.py; `--family llama3-8b` is Llama-3-8B's shapes
with a two-layer draft of the same width) at `--quant`, fully offloaded to `--device`:
- one JSON line per method (none, draft, ngram, auto): decode tok/s, acceptance, tokens;
- t(k)/t(1) for k = 1..8: a target pass over k tokens over a one-token pass (on a GPU a few
  percent more than one token, on two CPU cores about twice: why k = 8 pays on one and k = 2
  on the other);
- the baseline's weight bytes x tok/s against the card's memory bandwidth (`--bandwidth-gbs`,
  else what torch reports for GPU 0): how near the memory-bound limit decoding runs;
- llama-server on the same files (`--server BINARY`, with -ngl all) as the peer.
`--dry-run` runs every step on the CPU with the small zoo (the test suite runs it, so the
script cannot rot): the same lines, CPU figures.
Usage: python benchmarks/device_llama.py [--dry-run] [--family llama3-8b] [--quant Q4_K_M]
       [--device auto] [--threads 8] [--max-tokens 128] [--prompts 3] [--server PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request
from typing import Optional

from specdesk.app.runtime.compare import load_prompts
from specdesk.app.runtime.generation import run_once
from specdesk.app.storage.paths import assets_dir
from specdesk.engines.llama.engine import LlamaEngine
from specdesk.engines.llama.placement import Placement
from specdesk.engines.types import GenerationRequest, SpecConfig

from benchmarks.speculative import pass_cost

METHODS = ("none", "draft", "ngram", "auto")


def llama3_8b():
    """Llama-3-8B's shapes on the zoo's Llama-3 vocabulary and template (random weights), with a
    two-layer draft of the same width (about 1B parameters with its 128k-token embedding); no HF
    weights (8B of them would only fill the disk). Registered here, not in the zoo's test families."""
    from benchmarks import zoo

    return zoo.Family("llama-bpe", "llama", "meta-llama-Llama-3.1-8B-Instruct.jinja",
                      zoo.Shape(4096, 32, 32, 8, 128, 14336, 2, 8192), zoo.FAMILIES["llama-bpe"].small,
                      5e5, 1e-5, tied=False, hf_note="llama3-8b: the HF folder holds the tokenizer only")


def emit(row: dict) -> None:
    print(json.dumps(row), flush=True)


def card_bandwidth_gbs() -> Optional[float]:
    """GPU 0's memory bandwidth from torch's device properties (DDR: two transfers a clock)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    return round(2 * clock_khz * 1e3 * bus_bits / 8 / 1e9, 1) if clock_khz and bus_bits else None


def measure_methods(engine: LlamaEngine, files: dict, prompts: list[str], args) -> dict[str, dict]:
    rows = {}
    for method in METHODS:
        spec = SpecConfig(method=method, k=args.k,
                          draft_path=files["draft_gguf"] if method in ("draft", "auto") else None)
        tokens, seconds, drafted, accepted = 0, 0.0, 0, 0
        for prompt in prompts:
            prompt_tokens = tuple(engine.tokenize(prompt))
            run_once(engine, GenerationRequest(prompt_tokens, max_tokens=2, spec=spec))  # the prompt cached
            stats = run_once(engine, GenerationRequest(prompt_tokens, max_tokens=args.max_tokens, spec=spec,
                                                       stop_at_eos=False), threading.Event()).stats
            tokens, seconds = tokens + stats.tokens, seconds + stats.seconds
            drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
        rows[method] = {"step": "method", "method": method, "k": args.k if method != "none" else 0,
                        "tok_s": round(tokens / max(seconds, 1e-9), 2), "tokens": tokens,
                        "acceptance": round(accepted / drafted, 3) if drafted else None}
        emit(rows[method])
    return rows


def measure_peer(binary: str, files: dict, prompts: list[str], args) -> dict:
    from benchmarks.native_drivers import start_server, stop_server

    child, url = start_server(binary, files["target_gguf"], threads=args.threads, n_ctx=1024)
    try:
        speeds = []
        for prompt in prompts:
            body = json.dumps({"prompt": prompt, "n_predict": args.max_tokens, "temperature": 0,
                               "ignore_eos": True}).encode()
            request = urllib.request.Request(url + "/completion", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=600) as response:
                speeds.append(json.loads(response.read())["timings"]["predicted_per_second"])
        return {"step": "llama_server", "binary": binary, "tok_s": round(sum(speeds) / len(speeds), 2)}
    finally:
        stop_server(child)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="every step on the CPU with the small zoo")
    parser.add_argument("--family", default="llama3-8b")
    parser.add_argument("--quant", default="Q4_K_M")
    parser.add_argument("--device", default="auto", help="where the layers go (default: the first GPU)")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=21, help="passes timed per width for t(k)/t(1)")
    parser.add_argument("--bandwidth-gbs", type=float, help="the card's memory bandwidth (default: from torch)")
    parser.add_argument("--server", help="a llama-server binary to run on the same files (the peer)")
    args = parser.parse_args(argv)
    from benchmarks import zoo
    from specdesk.engines.llama.devices import llama_build

    build = llama_build()
    emit({"step": "build", "backend": build["backend"], "backends": build["backends"],
          "llama_cpp_python": build["llama_cpp_python"], "dry_run": args.dry_run})
    if not args.dry_run and build["backend"] == "cpu":
        emit({"step": "error", "error": "this llama.cpp is a CPU-only build: set up a GPU build first "
                                        "(benchmarks/device_cuda.sh does)"})
        return 2
    zoo.FAMILIES.setdefault("llama3-8b", llama3_8b())
    family = "llama-bpe" if args.dry_run and args.family == "llama3-8b" else args.family
    started = time.monotonic()
    files = zoo.build(family, args.quant, small=args.dry_run)
    emit({"step": "models", "family": family, "quant": args.quant, "small": args.dry_run,
          "seconds": round(time.monotonic() - started, 1)})
    placement = Placement("CPU", 0) if args.dry_run else Placement(args.device, "all")
    prompts = load_prompts(assets_dir() / "prompts" / "code.jsonl")[:args.prompts]
    engine = LlamaEngine(files["target_gguf"], n_ctx=2048, n_threads=args.threads, placement=placement,
                         draft_placement=placement)
    try:
        engine.load_draft(files["draft_gguf"])
        report = engine.placement_report()
        emit({"step": "placement", **{("target" if role == "target" else "draft"): place
                                      for role, place in report.items()}})
        rows = measure_methods(engine, files, prompts, args)
        t1 = pass_cost(engine.context, 1, repeats=args.repeats)
        ratios = {k: round(pass_cost(engine.context, k, repeats=args.repeats) / t1, 3) for k in range(2, 9)}
        emit({"step": "pass_cost", "t1_ms": round(t1 * 1000, 3), "t_k_over_t1": ratios})
        weight_bytes = int(engine.target.size_bytes)
        bandwidth = args.bandwidth_gbs or (None if args.dry_run else card_bandwidth_gbs())
        streamed = weight_bytes * rows["none"]["tok_s"] / 1e9
        emit({"step": "bandwidth", "weight_bytes": weight_bytes, "streamed_gbs": round(streamed, 2),
              "bandwidth_gbs": bandwidth, "fraction": round(streamed / bandwidth, 3) if bandwidth else None})
    finally:
        engine.close()
    if args.server:
        emit(measure_peer(args.server, files, prompts, args))
    else:
        emit({"step": "llama_server", "skipped": "no --server binary"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
