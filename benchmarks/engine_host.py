"""What the engine process and `specdesk serve` cost against generating in-process.

Prints JSON lines:
- {"bench": "transport"}: median round trip of a call that does nothing, and the bytes of
  one pickled StepEvent (steps travel in batches of at most engine_host.SEND_INTERVAL_S);
- {"bench": "engine_host"}: tok/s in-process vs through EngineClient, same prompts, same
  requests, alternating so both see the same machine (decode timing, as `specdesk compare`);
- {"bench": "serve"}: tok/s as a client sees it, from sending the request to the last
  streamed chunk, through the `openai` client against `specdesk serve`, vs the in-process
  engine timed the same way (the prompt is cached in both after the first round).
Default: the full demo pair, method draft, k = 4, 2 threads, greedy.
Usage: python benchmarks/engine_host.py [--threads 2] [--k 4] [--max-tokens 128] [--rounds 6]
(about 6,000 tokens in all with the defaults: minutes on two quiet cores)
"""

from __future__ import annotations

import argparse
import json
import pickle
import re
import select
import signal
import statistics
import subprocess
import sys
import threading
import time

from specdesk.app.runtime.compare import load_prompts
from specdesk.app.runtime.generation import run_once
from specdesk.app.runtime.engine_client import EngineClient
from specdesk.app.storage.paths import assets_dir
from specdesk.engines.llama.engine import LlamaEngine
from specdesk.engines.types import GenerationRequest, SamplingParams, SpecConfig


def wall_run(engine, request: GenerationRequest) -> tuple[int, float, tuple]:
    started = time.perf_counter()
    result = run_once(engine, request)
    return result.stats.tokens, time.perf_counter() - started, result.tokens


def start_server(target: str, draft: str, threads: int, k: int) -> tuple[subprocess.Popen, str]:
    child = subprocess.Popen([sys.executable, "-m", "specdesk.app.main", "serve", "--target", target,
                              "--draft", draft, "--method", "draft", "--k", str(k), "--threads", str(threads),
                              "--port", "0"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and child.poll() is None:
        if select.select([child.stderr], [], [], 1.0)[0]:
            match = re.search(r"at (http://\S+/v1)", child.stderr.readline())
            if match:
                threading.Thread(target=child.stderr.read, daemon=True).start()  # keep its pipe drained
                return child, match.group(1)
    child.kill()
    raise SystemExit("specdesk serve did not start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--prompts", default=str(assets_dir() / "prompts" / "code.jsonl"))
    parser.add_argument("--n-prompts", type=int, default=4)
    args = parser.parse_args()
    if args.target is None:
        from specdesk.app.demo.install import build_family

        paths = build_family(progress=lambda m: print(m, file=sys.stderr))
        args.target, args.draft = paths["target_gguf"], args.draft or paths["draft_gguf"]
    prompts = load_prompts(args.prompts)[: args.n_prompts]
    spec = SpecConfig(method="draft", k=args.k, draft_path=args.draft)
    sampling = SamplingParams()

    local = LlamaEngine(args.target, n_threads=args.threads)
    local.load_draft(args.draft)
    host = EngineClient(args.target, n_threads=args.threads)
    host.load_draft(args.draft)
    requests = [GenerationRequest(tuple(local.tokenize(p)), max_tokens=args.max_tokens, sampling=sampling, spec=spec)
                for p in prompts]

    trips = []
    for _ in range(200):
        started = time.perf_counter()
        host.call("ping")
        trips.append(time.perf_counter() - started)
    event = next(iter(local.generate(requests[0], threading.Event())))
    print(json.dumps({"bench": "transport", "call_round_trip_us": round(statistics.median(trips) * 1e6, 1),
                      "step_event_bytes": len(pickle.dumps(("event", event), protocol=pickle.HIGHEST_PROTOCOL))}),
          flush=True)

    totals = {"in_process": [0, 0.0], "host": [0, 0.0]}
    identical = True
    for request in requests:  # warm-up: first-call allocations and the prompt cache, untimed
        run_once(local, request)
        run_once(host, request)
    for _ in range(args.rounds):
        for request in requests:
            a, b = run_once(local, request), run_once(host, request)
            identical &= a.tokens == b.tokens
            for name, result in (("in_process", a), ("host", b)):
                totals[name][0] += result.stats.tokens
                totals[name][1] += result.stats.seconds
    local_tps, host_tps = (totals[n][0] / totals[n][1] for n in ("in_process", "host"))
    print(json.dumps({"bench": "engine_host", "method": "draft", "k": args.k, "threads": args.threads,
                      "prompts": len(prompts), "rounds": args.rounds, "tokens": totals["host"][0],
                      "in_process_tok_s": round(local_tps, 2), "host_tok_s": round(host_tps, 2),
                      "host_over_in_process": round(host_tps / local_tps, 4), "identical_tokens": identical}),
          flush=True)
    host.close()

    import openai

    child, url = start_server(args.target, args.draft, args.threads, args.k)
    try:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
        model = client.models.list().data[0].id
        served = [0, 0.0]
        in_process = [0, 0.0]
        for prompt in prompts:  # warm-up
            list(client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0, stream=True))
        for _ in range(args.rounds):
            for prompt, request in zip(prompts, requests):
                tokens, seconds, _ = wall_run(local, request)
                in_process[0] += tokens
                in_process[1] += seconds
                started = time.perf_counter()
                usage = None
                for chunk in client.completions.create(model=model, prompt=prompt, max_tokens=args.max_tokens,
                                                       temperature=0, stream=True,
                                                       stream_options={"include_usage": True}):
                    usage = chunk.usage or usage
                served[0] += usage.completion_tokens
                served[1] += time.perf_counter() - started
        local_tps, served_tps = in_process[0] / in_process[1], served[0] / served[1]
        print(json.dumps({"bench": "serve", "client": "openai", "stream": True, "method": "draft", "k": args.k,
                          "threads": args.threads, "tokens": served[0],
                          "in_process_wall_tok_s": round(local_tps, 2), "serve_wall_tok_s": round(served_tps, 2),
                          "serve_over_in_process": round(served_tps / local_tps, 4)}), flush=True)
    finally:
        child.send_signal(signal.SIGINT)
        child.wait(30)
        local.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
