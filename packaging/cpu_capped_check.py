"""Runs a bundle's llama.cpp libraries on an emulated CPU with nothing above the baseline.

    python packaging/cpu_capped_check.py BUNDLE_DIR [--cpu Haswell-v4] [--expect-variant haswell] [--tokens 8]

QEMU user mode (`qemu-x86_64`, Debian's qemu-user) emulates the CPU model it is given: a
Haswell has AVX2, FMA, F16C and BMI2 and no AVX-512, a Nehalem SSE4.2 and no AVX, so an
instruction above the CPU that the disassembly check missed stops the run with SIGILL. A
bundle with run-time CPU variants must also load the variant made for that CPU
(--expect-variant: sse42 on a Nehalem, haswell on a Haswell). The bundle's own executable cannot be
run this way (its bootloader restarts itself with exec(), and the new image runs natively), so
this interpreter runs under QEMU with llama-cpp-python pointed at the bundle's libraries
(LLAMA_CPP_LIB_PATH): greedy decoding of the demo target, without and with the demo draft, must
give the same tokens. The demo family is derived natively first (numpy under emulation is slow).
Prints one JSON line; exit status 1 on a failure, 2 when QEMU is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping

# Variables that tell a library which CPU code to run instead of letting it read CPUID: set for
# the host (OpenBLAS's OPENBLAS_CORETYPE=Haswell on some processors), they would make numpy run
# AVX2 kernels on an emulated SSE4.2 CPU. SPECDESK_LLAMA_CPU_MODULE names the host's module.
CPU_OVERRIDES = ("OPENBLAS_CORETYPE", "MKL_DEBUG_CPU_TYPE", "MKL_ENABLE_INSTRUCTIONS", "NPY_ENABLE_CPU_FEATURES",
                 "NPY_DISABLE_CPU_FEATURES", "ATEN_CPU_CAPABILITY", "GOTOBLAS_CORETYPE", "SPECDESK_LLAMA_CPU_MODULE")
# OpenBLAS's core for a QEMU CPU model, by the model's family name (the part before "-v")
OPENBLAS_CORES = {"Nehalem": "NEHALEM", "Westmere": "NEHALEM", "SandyBridge": "SANDYBRIDGE", "IvyBridge": "SANDYBRIDGE",
                  "Haswell": "HASWELL", "Broadwell": "HASWELL", "Skylake-Client": "HASWELL",
                  "Skylake-Server": "SKYLAKEX", "Cascadelake-Server": "SKYLAKEX", "Icelake-Server": "SKYLAKEX",
                  "Cooperlake": "COOPERLAKE", "SapphireRapids": "SAPPHIRERAPIDS", "EPYC-Genoa": "ZEN"}


def emulated_env(cpu: str, host: Mapping[str, str]) -> dict[str, str]:
    """The environment for a process on the emulated `cpu`: the host's, without anything that
    names the host's CPU code, and OpenBLAS told the emulated CPU's core (or left to CPUID, which
    QEMU answers for the emulated CPU, where the model is not in the table)."""
    env = {key: value for key, value in host.items() if key not in CPU_OVERRIDES}
    family = cpu.split("-v")[0] if "-v" in cpu else cpu
    if family in OPENBLAS_CORES:
        env["OPENBLAS_CORETYPE"] = OPENBLAS_CORES[family]
    return env


def inner(target: str, draft: str, tokens: int) -> int:
    """Runs under QEMU: the generation itself."""
    from specdesk.engines.llama.devices import llama_build
    from specdesk.engines.llama.engine import LlamaEngine
    from specdesk.engines.types import GenerationRequest, SamplingParams, SpecConfig
    from specdesk.app.runtime.generation import run_once

    engine = LlamaEngine(target, n_ctx=128, n_threads=1)
    try:
        prompt = tuple(engine.tokenize("def parse_args(argv):\n    "))
        runs = [run_once(engine, GenerationRequest(prompt, tokens, SamplingParams(), spec, stop_at_eos=False)).tokens
                for spec in (SpecConfig(), SpecConfig(method="draft", k=4, draft_path=draft))]
    finally:
        engine.close()
    build = llama_build()
    print(json.dumps({"cpu_variant": build["cpu_variant"], "cpu_module": build["cpu_module"],
                      "tokens": len(runs[0]), "identical": runs[0] == runs[1]}))
    return 0 if runs[0] == runs[1] and len(runs[0]) == tokens else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--cpu", default="Haswell-v4", help="QEMU's CPU model (qemu-x86_64 -cpu help)")
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--expect-variant", help="the CPU module ggml must choose (a variants build)")
    parser.add_argument("--inner", nargs=2, metavar=("TARGET", "DRAFT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inner:
        return inner(*args.inner, args.tokens)
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        print("cpu_capped_check: qemu-x86_64 is missing: install qemu-user", file=sys.stderr)
        return 2
    libraries = args.bundle / "_internal" / "llama_cpp" / "lib"
    if not libraries.is_dir():
        print(f"cpu_capped_check: {libraries} is missing: not a built bundle", file=sys.stderr)
        return 2
    from specdesk.app.demo.install import build_family

    with tempfile.TemporaryDirectory(prefix="specdesk-cpu-check-") as work:
        os.environ["SPECDESK_CACHE_DIR"] = work
        paths = build_family(out=Path(work) / "demo")
        started = time.monotonic()
        done = subprocess.run([qemu, "-cpu", args.cpu, sys.executable, __file__, str(args.bundle), "--tokens",
                               str(args.tokens), "--inner", paths["target_gguf"], paths["draft_gguf"]],
                              env={**emulated_env(args.cpu, os.environ), "LLAMA_CPP_LIB_PATH": str(libraries),
                                   "OMP_NUM_THREADS": "1"},
                              capture_output=True, text=True)
    seconds = round(time.monotonic() - started, 1)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    print(json.dumps({"emulated_cpu": args.cpu, **result, "seconds": seconds, "exit_status": done.returncode}))
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "TCG doesn't support" not in line]
        signal = -done.returncode if done.returncode < 0 else None
        print(f"cpu_capped_check: the bundle's llama.cpp failed on an emulated {args.cpu}"
              + (f" (signal {signal}{': illegal instruction' if signal == 4 else ''})" if signal else "")
              + (f": {errors[-1]}" if errors else ""), file=sys.stderr)
        return 1
    if args.expect_variant and result.get("cpu_module") != args.expect_variant:
        print(f"cpu_capped_check: on an emulated {args.cpu} llama.cpp loaded the CPU variant "
              f"{result.get('cpu_module')!r}, not {args.expect_variant!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
