"""What a target pass over n tokens costs against one token's pass, on llama.cpp: one JSON line per
model x setting, beside the pass's roofline floor.

For each model and each combination of settings a child process loads the model through
SpecDesk's binding (engines/llama/binding.py), prefills a prompt and then times the pass the
engine runs to verify a draft (GgufContext.decode over n tokens with logits for every row, as
LlamaEngine.target_pass does) and the rollback after it, for n = 1..--max-n. Each round times a
block of --block passes of every size n, the sizes in a shuffled order. llama.cpp reuses a pass's
graph when the next pass has the same size and builds it again when the size changes, so a block's
first pass is the price of a size change ("switch") and the others of a pass the same size as the
one before ("steady": plain decoding, and a draft of fixed length). t(n) is the steady price; a
round's ratios t(n)/t(1) are taken within the round, and the line gives their median over
--repeats rounds with the lowest and highest round (the spread).

The floor of a pass is the larger of
- its weight bytes over the memory bandwidth measured here: every weight matrix the pass
  multiplies by (the output layer's whole vocabulary included, tied or not), the norms, and the
  KV cache rows it attends to; the bandwidth is the fastest of the reads of a buffer as large as
  the weights taken before and after the rounds of passes, with the same threads and clock
  (PyTorch's sum where PyTorch is installed, else numpy's, one thread), so a model that sits in the
  last-level cache is held to that cache's speed and a machine busy with other work is held to
  what it leaves (not between the rounds: PyTorch's thread pool then spun beside llama.cpp's and
  the first passes after each read paid for it);
- its arithmetic (2 FLOP per weight element per token, and the attention's products) over the
  peak the same setting reaches on this CPU: the best FLOP/s of passes over 16, 32 and --peak-n
  tokens (llama.cpp's batched kernels for that weight type: a verification-sized pass may run a
  kernel of its own, faster than the one prompts take, so the arithmetic is priced at the best
  the kernels do here).

With one thread the passes are timed by the process's CPU time (a pass preempted by another
program waits without counting), with more by the wall clock (their CPU time would count the
thread pool's spinning).

Fields: t_ms (median steady pass per n, ms; wall_ms and cpu_ms both), ratio and ratio_lo/ratio_hi
(steady t(n)/t(1) within a round), switch_ms (median pass right after a size change, timed as
t_ms is) and switch_over_steady, floor_ms, bound ("memory" or "compute"), over_floor
(t(n)/floor), weight_mb and weight_mb_by_type, bandwidth_gbs, peak_gflops, cpu_module (the
llama.cpp CPU module that ran), load_before/load_after (the 1-minute load average around the
line: what else ran).

Usage:
  python -m benchmarks.pass_cost --models demo,/tmp/models/smol-Q8_0.gguf [--threads 1,2]
      [--ubatch 512,16] [--extra on,off] [--flash auto,on,off] [--cpu-module auto,PATH]
      [--max-n 9] [--repeats 7] [--block 4] [--prompt-tokens 128]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT = ("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
          "for i in range(10):\n    print(i, fibonacci(i))\n")
FLASH = {"auto": -1, "off": 0, "on": 1}  # llama_flash_attn_type
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 15: "Q4_K_M", 17: "Q5_K_M",
              18: "Q6_K", 32: "BF16"}  # general.file_type (llama_ftype)


# --- what a pass reads and computes ------------------------------------------------
def pass_shape(path: str) -> dict:
    """Weight bytes and elements a target pass multiplies by, and the attention's shape, from the
    GGUF header (NextN/MTP layers, which a target pass does not run, left out)."""
    from specdesk.engines.llama.binding import gguf_header

    header = gguf_header(path)
    n_layers = int(header.arch_value("block_count"))
    nextn = int(header.arch_value("nextn_predict_layers", 0) or 0)
    tensors = header.tensor_infos
    tied = "output.weight" not in tensors
    weight_bytes = matmul_elements = 0
    by_type: dict[str, int] = {}
    for name, info in tensors.items():
        if name.startswith("blk."):
            if int(name.split(".")[1]) >= n_layers - nextn:
                continue
        elif name == "token_embd.weight" and not tied:
            continue  # only n of its rows are read
        weight_bytes += info.n_bytes
        if len(info.shape) >= 2:
            matmul_elements += info.n_elements
            by_type[info.type_name] = by_type.get(info.type_name, 0) + info.n_bytes
    n_embd = int(header.arch_value("embedding_length"))
    n_head = int(header.arch_value("attention.head_count"))
    n_head_kv = int(header.arch_value("attention.head_count_kv", n_head) or n_head)
    head_dim = int(header.arch_value("attention.key_length", n_embd // n_head) or n_embd // n_head)
    file_type = FILE_TYPES.get(header.fields.get("general.file_type"))
    return {"weight_bytes": weight_bytes, "matmul_elements": matmul_elements,
            "weight_type": file_type or max(by_type, key=by_type.get),
            "types": {name: round(size / 1e6, 1) for name, size in by_type.items()},
            "n_layers": n_layers - nextn, "n_head": n_head, "n_head_kv": n_head_kv, "head_dim": head_dim}


def pass_bytes(shape: dict, n: int, n_past: int) -> int:
    """Weights once, and the f16 keys and values of every position the pass attends to."""
    kv = 2 * 2 * shape["n_layers"] * shape["n_head_kv"] * shape["head_dim"] * (n_past + n)
    return shape["weight_bytes"] + kv


def pass_flops(shape: dict, n: int, n_past: int) -> float:
    """2 per weight element per token, and Q.K and P.V over the attended positions."""
    attention = 2 * 2 * shape["n_layers"] * shape["n_head"] * shape["head_dim"] * n * (n_past + (n + 1) / 2)
    return 2.0 * shape["matmul_elements"] * n + attention


class BandwidthProbe:
    """A read of a buffer as large as the weights, with the passes' threads: timed right before
    and right after the rounds of passes, so it sees the same machine (the same other load)."""

    def __init__(self, n_bytes: int, threads: int):
        self.n_bytes = max(n_bytes, 16 << 20)
        try:
            import torch

            torch.set_num_threads(threads)
            buffer = torch.ones(self.n_bytes // 4, dtype=torch.float32)
            self.how = f"torch.sum, {threads} threads"
        except ImportError:
            import numpy as np

            buffer = np.ones(self.n_bytes // 4, dtype=np.float32)
            self.how = "numpy.sum, 1 thread"
        self._reduce = lambda: float(buffer.sum())
        self._reduce()
        self.seconds: list[float] = []

    def read(self, cpu_time: bool, times: int = 3) -> None:
        """Time `times` reads: CPU seconds for one thread (as its passes are timed), wall seconds
        otherwise."""
        clock = time.process_time if cpu_time else time.perf_counter
        for _ in range(times):
            started = clock()
            self._reduce()
            self.seconds.append(clock() - started)

    def bytes_per_second(self) -> float:
        """The fastest read's: the bandwidth a pass could have had at its best moment."""
        return self.n_bytes / min(self.seconds)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor()


def load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


# --- one model x setting, in a process of its own ----------------------------------
def use_cpu_module(path: str) -> str:
    """Load llama.cpp with the named CPU module in place of the one ggml chose (the path may lie
    outside llama.cpp's folder: a module built on its own from patched source)."""
    import ctypes

    from specdesk.engines.llama import binding, cpu_variant

    lib = binding.llama_lib()  # loads the folder's modules (and the one that runs here)
    if path == "auto":
        return os.environ.get(cpu_variant.ENV, "") or "ggml's choice"
    handle = lib.llama_cpp._lib
    reg = binding.ggml_function("ggml_backend_reg_by_name", ctypes.c_void_p, [ctypes.c_char_p], handle)(b"CPU")
    if reg:
        binding.ggml_function("ggml_backend_unload", None, [ctypes.c_void_p], handle)(reg)
    if not binding.ggml_function("ggml_backend_load", ctypes.c_void_p, [ctypes.c_char_p], handle)(os.fsencode(path)):
        raise SystemExit(f"{path}: llama.cpp could not load this CPU module")
    return path


def measure(job: dict) -> dict:
    import numpy as np

    from specdesk.engines.llama.binding import GgufContext, GgufModel

    module = use_cpu_module(job["cpu_module"])
    shape = pass_shape(job["model"])
    max_n, peak_n = job["max_n"], job["peak_n"]
    model = GgufModel(job["model"], extra_buffers=job["extra"] == "on")
    n_batch = max(job["ubatch"], peak_n, max_n)
    ctx = GgufContext(model, n_ctx=job["prompt_tokens"] + peak_n + max_n + 16, n_threads=job["threads"],
                      n_batch=n_batch, n_ubatch=job["ubatch"], flash_attn_type=FLASH[job["flash"]])
    tokens = model.tokenize(PROMPT)
    while len(tokens) < job["prompt_tokens"] + peak_n:
        tokens += tokens
    prompt, tail = tokens[:job["prompt_tokens"]], tokens[job["prompt_tokens"]:job["prompt_tokens"] + peak_n]
    ctx.decode(prompt, all_logits=False)
    n_past = ctx.n_past

    def timed(n: int) -> tuple[float, float]:
        """Wall seconds and CPU seconds of this process (every thread of llama.cpp's pool)."""
        started, cpu_started = time.perf_counter(), time.process_time()
        ctx.decode([prompt[-1], *tail[:n - 1]])  # logits for every row, as the verification pass asks
        ctx.rollback(n_past)
        return time.perf_counter() - started, time.process_time() - cpu_started

    sizes = list(range(1, max_n + 1))
    rng = np.random.default_rng(0)
    block = max(2, job.get("block", 4))  # a first pass and at least one after it
    probe = BandwidthProbe(shape["weight_bytes"], job["threads"])
    cpu_clock = job["threads"] == 1
    probe.read(cpu_time=cpu_clock)
    for _ in range(job["warmup"]):
        for n in sizes:
            timed(n)

    def block_of(n: int) -> tuple[tuple[float, float], tuple[float, float]]:
        """The first pass of a block of size n after another size, and the median of the rest."""
        first, *rest = [timed(n) for _ in range(block)]
        return first, (statistics.median(x[0] for x in rest), statistics.median(x[1] for x in rest))

    rounds, switched = [], []
    load_before = load_average()
    for _ in range(job["repeats"]):
        order = list(rng.permutation(sizes))
        seconds = {int(n): block_of(int(n)) for n in order}
        rounds.append([seconds[n][1] for n in sizes])
        switched.append([seconds[n][0] for n in sizes])
    peak_sizes = sorted({n for n in (16, 32) if n < peak_n} | {peak_n})
    peak_s = {n: statistics.median(timed(n)[cpu_clock] for _ in range(3)) for n in peak_sizes}
    probe.read(cpu_time=cpu_clock)
    load_after = load_average()
    ctx.close()
    model.close()

    wall = [statistics.median(r[i][0] for r in rounds) for i in range(max_n)]
    cpu = [statistics.median(r[i][1] for r in rounds) for i in range(max_n)]
    # One thread: its CPU time is the pass's work, whatever else the machine runs (a preempted
    # pass waits without counting); several: wall time (CPU time would count the pool's spinning).
    which = int(cpu_clock)
    t = cpu if which else wall
    switch = [statistics.median(r[i][which] for r in switched) for i in range(max_n)]
    ratios = [[r[i][which] / r[0][which] for r in rounds] for i in range(max_n)]
    peak, peak_n = max((pass_flops(shape, n, n_past) / peak_s[n], n) for n in peak_sizes)
    bandwidth = job.get("bandwidth") or probe.bytes_per_second()
    floors, bounds = [], []
    for n in sizes:
        memory_s = pass_bytes(shape, n, n_past) / bandwidth
        compute_s = pass_flops(shape, n, n_past) / peak
        floors.append(max(memory_s, compute_s))
        bounds.append("memory" if memory_s >= compute_s else "compute")
    r4 = lambda x: round(x, 4)  # noqa: E731
    return {
        "model": Path(job["model"]).name, "weight_type": shape["weight_type"], "weight_mb_by_type": shape["types"],
        "setting": {k: job[k] for k in ("threads", "ubatch", "extra", "flash")}, "cpu_module": Path(module).name,
        "timed": "cpu" if which else "wall",
        "t1_ms": r4(t[0] * 1e3), "ratio": [r4(statistics.median(x)) for x in ratios],
        "ratio_lo": [r4(min(x)) for x in ratios], "ratio_hi": [r4(max(x)) for x in ratios],
        "t_ms": [r4(x * 1e3) for x in t], "wall_ms": [r4(x * 1e3) for x in wall],
        "cpu_ms": [r4(x * 1e3) for x in cpu], "switch_ms": [r4(x * 1e3) for x in switch],
        "switch_over_steady": [r4(a / b) for a, b in zip(switch, t)], "block": block,
        "floor_ms": [r4(x * 1e3) for x in floors], "bound": bounds,
        "over_floor": [r4(a / b) for a, b in zip(t, floors)],
        "weight_mb": round(shape["weight_bytes"] / 1e6, 1), "bandwidth_gbs": round(bandwidth / 1e9, 2),
        "bandwidth_how": probe.how if not job.get("bandwidth") else "given",
        "peak_gflops": round(peak / 1e9, 1), "peak_n": peak_n, "n_past": n_past, "repeats": job["repeats"],
        "load_before": round(load_before, 2), "load_after": round(load_after, 2),
    }


# --- the sweep ----------------------------------------------------------------------
def resolve_model(name: str) -> str:
    if name == "demo":
        from specdesk.app.demo.install import build_family

        return build_family()["target_gguf"]
    if not Path(name).is_file():
        raise SystemExit(f"{name}: no such GGUF file")
    return name


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="demo", help="comma-separated GGUF paths; 'demo' is the demo target")
    parser.add_argument("--threads", default="2")
    parser.add_argument("--ubatch", default="512", help="n_ubatch values (n_batch is at least --peak-n)")
    parser.add_argument("--extra", default="on", help="on,off: the CPU backend's repacked weight buffers")
    parser.add_argument("--flash", default="auto", help="auto,on,off: flash attention")
    parser.add_argument("--cpu-module", default="auto", help="'auto' or paths of libggml-cpu-*.so modules")
    parser.add_argument("--max-n", type=int, default=9)
    parser.add_argument("--peak-n", type=int, default=64, help="the largest pass whose FLOP/s may price the arithmetic (16 and 32 are timed too; the best prices it)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--block", type=int, default=4,
                        help="passes of one size in a row (the first pays for the size change)")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(json.loads(args.child))), flush=True)
        return
    split = lambda text: [x for x in text.split(",") if x]  # noqa: E731
    models = [resolve_model(m) for m in split(args.models)]
    started = time.time()
    print(json.dumps({"cpu": cpu_name(), "cores": os.cpu_count(), "load": round(load_average(), 2)}), flush=True)
    for model, threads, ubatch, extra, flash, module in itertools.product(
            models, [int(x) for x in split(args.threads)], [int(x) for x in split(args.ubatch)],
            split(args.extra), split(args.flash), split(args.cpu_module)):
        job = {"model": model, "threads": threads, "ubatch": ubatch, "extra": extra, "flash": flash,
               "cpu_module": module, "max_n": args.max_n, "peak_n": args.peak_n, "repeats": args.repeats,
               "block": args.block, "warmup": args.warmup, "prompt_tokens": args.prompt_tokens, "bandwidth": None}
        env = dict(os.environ)
        done = subprocess.run([sys.executable, "-m", "benchmarks.pass_cost", "--child", json.dumps(job)],
                              capture_output=True, text=True, env=env)
        if done.returncode != 0:
            print(json.dumps({"model": Path(model).name, "setting": job, "error": done.stderr.strip()[-400:]}),
                  flush=True)
            continue
        print(done.stdout.strip().splitlines()[-1], flush=True)
    print(json.dumps({"summary": True, "seconds": round(time.time() - started, 1)}), flush=True)


if __name__ == "__main__":
    main()
