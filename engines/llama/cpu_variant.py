"""Which of llama.cpp's CPU modules runs on this machine: ggml's score says what the CPU reports,
a probe says what it executes.

A build with GGML_CPU_ALL_VARIANTS carries one CPU module per instruction-set level, and ggml
loads the one whose `ggml_backend_score` is highest for what CPUID reports. A virtual machine
can report more than it runs: an Intel Xeon guest that lists AMX executes `tilezero` as an
invalid opcode, and the sapphirerapids module (the only one with AMX kernels, used for
Q4_0/Q4_K/... weights) kills the process on the first quantized matrix product. So before a
process uses the module ggml chose, a child process loads that module alone and decodes a few
tokens through a small Q4_0 model written here; a module that dies is passed over for the next
best one that runs. The verdict is cached per module file and CPU (under the cache folder) and
handed to child processes in SPECDESK_LLAMA_CPU_MODULE, which also lets a user name a module.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Optional

from . import cpu_probe

ENV = "SPECDESK_LLAMA_CPU_MODULE"  # a CPU module's path: load this one, without probing
PROBE_TIMEOUT_S = 120
PREFIX, SUFFIX = ("ggml-cpu-", ".dll") if sys.platform == "win32" else ("libggml-cpu-", ".so")


def ranked(folder: Path) -> list[tuple[int, Path]]:
    """(score, path) of the CPU modules in `folder` that this CPU reports it can run, best first."""
    found = []
    for path in sorted(Path(folder).glob(f"{PREFIX}*{SUFFIX}")):
        try:
            score = getattr(ctypes.CDLL(str(path)), "ggml_backend_score")
        except (OSError, AttributeError):
            continue
        score.restype, score.argtypes = ctypes.c_int, []
        value = int(score())
        if value > 0:
            found.append((value, path))
    return sorted(found, key=lambda item: -item[0])


def _cpu_key(order: list[tuple[int, Path]]) -> str:
    """What this CPU reports, as ggml reads it: every module's score (CPUID, so an emulated CPU
    gets its own key where /proc/cpuinfo would still describe the host), and the CPU's name."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        model = next((line for line in text.splitlines() if line.startswith("model name")), "")
    except OSError:
        import platform

        model = platform.processor()
    scores = ",".join(f"{path.name}={score}" for score, path in order)
    return hashlib.sha256(f"{model}\n{scores}".encode()).hexdigest()[:16]


def _verdicts_path() -> Path:
    from ..files import cache_dir

    return cache_dir() / "llama-cpu-modules.json"


def _module_key(path: Path, cpu: str) -> str:
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{int(st.st_mtime)}:{cpu}"


def runs_here(path: Path, cpu: str) -> tuple[bool, str]:
    """Whether the CPU module at `path` decodes on this machine (cached under the CPU's key); the
    reason when not."""
    store = _verdicts_path()
    try:
        verdicts = json.loads(store.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        verdicts = {}
    key = _module_key(path, cpu)
    if key in verdicts:
        return verdicts[key]["runs"], verdicts[key]["why"]
    runs, why = probe(path)
    verdicts[key] = {"runs": runs, "why": why}
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        tmp = store.with_name(f"{store.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(verdicts, indent=1), encoding="utf-8")
        os.replace(tmp, store)
    except OSError:
        pass  # a read-only cache: probe again next time
    return runs, why


def probe(path: Path) -> tuple[bool, str]:
    """Load the module alone in a child process (cpu_probe.run) and decode through a small quantized model."""
    import subprocess

    try:
        done = subprocess.run(cpu_probe.command(str(path)), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False, f"a decode did not finish in {PROBE_TIMEOUT_S} s"
    except OSError as e:
        return False, f"the probe of {path} could not start ({e.strerror or e})"
    if done.returncode == 0:
        return True, ""
    if done.returncode < 0:
        import signal

        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        return False, f"a decode ended with {name} (an instruction this machine does not run)"
    last = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] if done.stderr else []
    return False, f"the probe of {path} failed (exit status {done.returncode}{': ' + last[0] if last else ''})"


def choose(folder: Path) -> tuple[Optional[Path], Optional[Path], list[str]]:
    """(the module ggml loads, the module to use instead or None when it runs, what was passed over)."""
    forced = os.environ.get(ENV)
    order = ranked(folder)
    if not order:
        return None, None, []
    best = order[0][1]
    if forced and any(str(path) == forced for _, path in order):  # named by a parent on this CPU, or a user
        return best, (None if Path(forced) == best else Path(forced)), []
    cpu = _cpu_key(order)
    skipped = []
    for _, path in order:
        runs, why = runs_here(path, cpu)
        if runs:
            os.environ[ENV] = str(path)  # child processes (the engine process, servers) skip the probe
            return best, (None if path == best else path), skipped
        skipped.append(f"{path.name}: {why}")
    return best, None, skipped
