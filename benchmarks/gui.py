"""The desktop app under load: throughput through the GUI against the CLI path, the longest
event-loop stall, resident memory with the full demo pair, and growth over generate-and-stop
cycles. Prints one JSON object per measurement and a summary.

    python benchmarks/gui.py [--prompts N] [--cycles 200] [--method draft --k 3]

Offscreen Qt (no display needed). Throughput is compared within one run: each prompt goes
through the app (worker thread, streaming signals, 30 Hz repaints of chat and charts) and
through the CLI's code path (`run_once` on an engine in this thread), alternating which goes
first, on the same settings.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def wait(app, signal, accept, timeout_s: float = 600.0):
    from specdesk.ui.screenshot import wait_signal

    return wait_signal(app, signal, accept, timeout_s)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=8, help="prompts from assets/prompts/code.jsonl")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--method", default="draft")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cycles", type=int, default=200, help="generate-and-stop cycles for the memory check")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="specdesk-gui-bench-"))
    os.environ["SPECDESK_CONFIG_DIR"] = str(scratch / "config")
    os.environ["SPECDESK_DATA_DIR"] = str(scratch / "data")

    from PySide6.QtCore import QTimer

    from specdesk.app.runtime.compare import load_prompts
    from specdesk.app.runtime.generation import run_once
    from specdesk.app.demo.install import build_family
    from specdesk.app.storage.paths import assets_dir
    from specdesk.app.runtime.session import chat_tokens
    from specdesk.app.storage.settings import Settings
    from specdesk.engines.llama.engine import LlamaEngine
    from specdesk.engines.types import GenerationRequest, SamplingParams, SpecConfig
    from specdesk.ui.app import make_app
    from specdesk.ui.main_window import MainWindow

    family = build_family(small=False)
    prompts = load_prompts(assets_dir() / "prompts" / "code.jsonl")[: args.prompts]
    rss_start = rss_bytes()
    app = make_app([])
    settings = Settings(target_path=family["target_gguf"], draft_path=family["draft_gguf"], method=args.method,
                        k=args.k, threads=args.threads, max_tokens=args.max_tokens, n_ctx=2048)
    window = MainWindow(settings, autoload=False)
    window.report_error = lambda message: print(json.dumps({"error": message}), file=sys.stderr)
    window.resize(1280, 800)
    window.show()
    window.load_models()
    wait(app, window.worker.finished, lambda r: r.kind == "load")

    gaps: list[float] = []
    last = [time.perf_counter()]

    def probe():
        now = time.perf_counter()
        gaps.append(now - last[0])
        last[0] = now

    probe_timer = QTimer()
    probe_timer.setInterval(10)
    probe_timer.timeout.connect(probe)

    gui_cpu = [0.0, 0.0]  # GUI-thread CPU seconds, wall seconds of the runs

    def through_gui(prompt: str):
        window.new_chat()
        last[0] = time.perf_counter()
        probe_timer.start()
        cpu, wall = time.thread_time(), time.perf_counter()
        window.chat_view.input.setPlainText(prompt)
        window.chat_view.send_button.click()
        (result,) = wait(app, window.worker.finished, lambda r: r.kind == "chat")
        gui_cpu[0] += time.thread_time() - cpu
        gui_cpu[1] += time.perf_counter() - wall
        probe_timer.stop()
        return result.value.result.stats

    spec = SpecConfig(method=args.method, k=args.k,
                      draft_path=family["draft_gguf"] if args.method == "draft" else None)
    sampling = SamplingParams()
    cli_engine = LlamaEngine(family["target_gguf"], n_ctx=2048, n_threads=args.threads)

    def through_cli(prompt: str):
        cli_engine.reset_chat()
        tokens, _ = chat_tokens(cli_engine, [{"role": "user", "content": prompt}], args.max_tokens)
        request = GenerationRequest(tuple(tokens), max_tokens=args.max_tokens, sampling=sampling, spec=spec)
        return run_once(cli_engine, request, threading.Event()).stats

    through_gui(prompts[0])  # warm both paths up
    through_cli(prompts[0])
    gaps.clear()
    gui_cpu[:] = [0.0, 0.0]
    totals = {"gui": [0, 0.0], "cli": [0, 0.0]}
    for i, prompt in enumerate(prompts):
        order = (("gui", through_gui), ("cli", through_cli))
        for label, run in (order if i % 2 == 0 else order[::-1]):
            stats = run(prompt)
            totals[label][0] += stats.tokens
            totals[label][1] += stats.seconds
    gui_tps = totals["gui"][0] / totals["gui"][1]
    cli_tps = totals["cli"][0] / totals["cli"][1]
    throughput = {"method": args.method, "k": args.k, "prompts": len(prompts), "max_tokens": args.max_tokens,
                  "gui_tok_s": round(gui_tps, 2), "cli_tok_s": round(cli_tps, 2),
                  "gui_over_cli": round(gui_tps / cli_tps, 4), "max_event_loop_stall_ms": round(max(gaps) * 1000, 1),
                  "gui_thread_cpu_share": round(gui_cpu[0] / gui_cpu[1], 4)}
    print(json.dumps({"throughput": throughput}), flush=True)
    cli_engine.close()

    # Memory: the app with the full demo pair loaded, then generate-and-stop cycles.
    rss_loaded = rss_warm = rss_bytes()
    stopped = 0
    for cycle in range(args.cycles):
        window.new_chat()
        window.chat_view.input.setPlainText(prompts[cycle % len(prompts)])
        window.chat_view.send_button.click()
        wait(app, window.worker.stream, lambda batch: True)
        window.stop()
        (result,) = wait(app, window.worker.finished, lambda r: r.kind == "chat")
        stopped += result.value.result.finish_reason == "cancelled"
        if cycle == min(9, args.cycles - 1):
            rss_warm = rss_bytes()  # after the first cycles have filled caches and arenas
    rss_end = rss_bytes()
    memory = {"rss_process_start_bytes": rss_start, "rss_loaded_bytes": rss_loaded,
              "under_800_mb": rss_loaded < 800 * 2**20, "cycles": args.cycles, "cycles_stopped": stopped,
              "rss_after_10_cycles_bytes": rss_warm, "rss_after_cycles_bytes": rss_end,
              "growth_over_cycles_bytes": rss_end - rss_loaded,
              "growth_after_warmup_bytes": rss_end - rss_warm,
              "growth_under_50_mb": rss_end - rss_loaded < 50 * 2**20}
    print(json.dumps({"memory": memory}), flush=True)
    window.close()
    app.processEvents()
    return 0


if __name__ == "__main__":
    sys.exit(main())
