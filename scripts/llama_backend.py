"""Which llama.cpp backend set-up builds on this machine, and the CMake arguments for it.

Runs on the system Python before any virtual environment exists, so it uses the standard
library only. scripts/setup.sh calls it; tests call it with stub compilers on PATH and a
faked platform (SPECDESK_PLATFORM="<system> <machine>", as `uname -s` and `uname -m` print).

    python3 scripts/llama_backend.py choose          # "<backend>\t<reason>"
    python3 scripts/llama_backend.py cmake-args B    # CMAKE_ARGS for backend B on this machine
    python3 scripts/llama_backend.py cpu-baseline    # "<baseline>\t<reason>"
    python3 scripts/llama_backend.py wheel-dir B PY  # the cache folder of backend B's wheel for interpreter PY

The choice: SPECDESK_LLAMA_BACKEND if set; Metal on macOS arm64; CUDA where nvcc is found
and an NVIDIA GPU is seen; HIP where hipcc is found and an AMD GPU is seen; Vulkan where
glslc and the Vulkan headers are found and a GPU is seen; otherwise the CPU. A compiler without a GPU to run
on (a CUDA toolkit on a CI runner, say) does not choose its backend: the build would take
long and could not be used here.

CPU code is never compiled for the build machine only (GGML_NATIVE=OFF). On x86-64 it is
built as run-time variants, as llama.cpp's own releases are (GGML_BACKEND_DL with
GGML_CPU_ALL_VARIANTS): one CPU module per instruction-set level, from plain x86-64 and SSE4.2
through Haswell (AVX2) to AVX-512 and AMX, and ggml loads the best one this CPU runs (SpecDesk's
binding asks it to: engines/llama/binding.load_backend_modules). Everything else (libllama,
libggml, the GPU and RPC modules) is plain x86-64. So one install runs on any x86-64 CPU and
uses what the CPU has. SPECDESK_LLAMA_CPU=variants|x86-64-v3|x86-64-v2|native overrides it: one
fixed level, or native (-march=native: this CPU only, for a developer's own build). An Intel Mac
gets x86-64-v3; elsewhere (Apple silicon, ARM Linux) the compiler's default target is used.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

BACKENDS = ("cpu", "cuda", "metal", "hip", "vulkan")
BASELINES = ("variants", "x86-64-v3", "x86-64-v2", "native")
# GGML_RPC: the RPC backend is always built: it is how layers go to another machine, and the
# offload device the tests use where there is no GPU.
# LLAVA_BUILD=OFF: llama-cpp-python's multimodal library (mtmd), which SpecDesk never loads,
# is not compiled.
COMMON = ("-DGGML_NATIVE=OFF", "-DGGML_RPC=ON", "-DLLAVA_BUILD=OFF")
X86_FEATURES = ("SSE42", "AVX", "AVX2", "FMA", "F16C", "BMI2", "AVX_VNNI", "AVX512", "AVX512_VBMI",
                "AVX512_VNNI", "AVX512_BF16", "AMX_TILE", "AMX_INT8", "AMX_BF16")
BASELINE_FEATURES = {"x86-64-v3": {"SSE42", "AVX", "AVX2", "FMA", "F16C", "BMI2"}, "x86-64-v2": {"SSE42"}}


def machine() -> tuple[str, str]:
    faked = os.environ.get("SPECDESK_PLATFORM", "").split()
    if len(faked) == 2:
        return faked[0], faked[1]
    return platform.system(), platform.machine()


def _run(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _nvidia_gpus() -> list[str]:
    if shutil.which("nvidia-smi"):
        return [line.split(" (UUID")[0] for line in _run(["nvidia-smi", "-L"]).splitlines() if line.startswith("GPU ")]
    return []


def _amd_gpus() -> list[str]:
    if shutil.which("rocminfo"):
        return sorted({word for word in _run(["rocminfo"]).split() if word.startswith("gfx") and word != "gfx000"})
    return []


def _vulkan_gpus() -> list[str]:
    """GPUs a Vulkan driver offers (lavapipe, a Vulkan driver on the CPU, is not one)."""
    if shutil.which("vulkaninfo"):
        names, kind = [], None
        for line in _run(["vulkaninfo", "--summary"]).splitlines():
            if "deviceType" in line:
                kind = line.split("=")[-1].strip()
            elif "deviceName" in line and kind and "GPU" in kind:
                names.append(line.split("=")[-1].strip())
        return names
    return [str(p) for p in sorted(Path("/dev/dri").glob("renderD*"))] if Path("/dev/dri").is_dir() else []


def _vulkan_headers() -> str | None:
    roots = [os.environ.get("VULKAN_SDK", ""), "/usr", "/usr/local", "/opt/homebrew"]
    for root in filter(None, roots):
        header = Path(root) / "include" / "vulkan" / "vulkan.h"
        if header.is_file():
            return str(header)
    return None


def _forced(variable: str, allowed: tuple[str, ...]) -> str | None:
    """An environment variable's choice, checked against what it may name."""
    forced = os.environ.get(variable, "").strip().lower()
    if forced and forced not in allowed:
        raise SystemExit(f"{variable}={forced!r} is not one of {', '.join(allowed)}")
    return forced or None


def choose() -> tuple[str, str]:
    """(backend, one-line reason)."""
    forced = _forced("SPECDESK_LLAMA_BACKEND", BACKENDS)
    if forced:
        return forced, f"SPECDESK_LLAMA_BACKEND={forced}"
    system, arch = machine()
    if system == "Darwin":
        if arch == "arm64":
            return "metal", "macOS on Apple silicon: Metal"
        return "cpu", "macOS on Intel: llama.cpp's Metal backend is for Apple silicon"
    passed_over = []
    # (backend, its compiler, the GPUs it would run on, how the first is named, their vendor, what lists them)
    for backend, compiler, gpus_of, gpu, vendor, lister in (
            ("cuda", "nvcc", _nvidia_gpus, "{}", "NVIDIA", "nvidia-smi"),
            ("hip", "hipcc", _amd_gpus, "an AMD GPU ({})", "AMD", "rocminfo")):
        path = shutil.which(compiler)
        if not path:
            continue
        gpus = gpus_of()
        if gpus:
            return backend, f"{compiler} at {path} and {gpu.format(gpus[0])}"
        passed_over.append(f"{compiler} at {path} but no {vendor} GPU ({lister} lists none)")
    glslc = shutil.which("glslc")
    headers = _vulkan_headers()
    if glslc and headers:
        gpus = _vulkan_gpus()
        if gpus:
            return "vulkan", f"the Vulkan SDK (glslc at {glslc}, {headers}) and a GPU ({gpus[0]})"
        passed_over.append(f"the Vulkan SDK at {glslc} but no GPU for it (vulkaninfo lists none)")
    elif glslc:
        passed_over.append(f"glslc at {glslc} but no Vulkan headers (vulkan/vulkan.h)")
    if passed_over:
        return "cpu", "; ".join(passed_over) + " (SPECDESK_LLAMA_BACKEND=<backend> builds one anyway)"
    return "cpu", "no GPU toolkit found (nvcc, hipcc, or glslc with the Vulkan headers)"


def cpu_flags() -> set[str]:
    """The CPU's flags as /proc/cpuinfo names them (avx2, avx512_vnni, ...); empty where it has none."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_baseline() -> tuple[str, str]:
    """(baseline, reason) for the CPU code of an x86-64 build; other machines: ('default', ...)."""
    forced = _forced("SPECDESK_LLAMA_CPU", BASELINES)
    if forced:
        return forced, f"SPECDESK_LLAMA_CPU={forced}"
    system, arch = machine()
    if arch not in ("x86_64", "AMD64", "amd64"):
        return "default", f"{arch}: the compiler's default target for {system}"
    if system == "Darwin":  # ggml loads backend modules differently on Apple platforms: one fixed level
        return "x86-64-v3", "macOS on Intel: AVX2 and FMA, as on every Intel Mac since 2013"
    return "variants", ("portable: CPU variants from x86-64 to AVX-512, the best for the CPU chosen when "
                        "llama.cpp loads")


def cmake_args(backend: str) -> list[str]:
    if backend not in BACKENDS:
        raise SystemExit(f"unknown backend {backend!r}: one of {', '.join(BACKENDS)}")
    args = list(COMMON)
    baseline, _ = cpu_baseline()
    if baseline == "native":
        args[0] = "-DGGML_NATIVE=ON"
    elif baseline == "variants":
        # The modules are installed beside libllama (GGML_BACKEND_DIR, relative to the wheel's
        # root: typed STRING, since CMake would make a PATH absolute in the build folder), where
        # the binding asks ggml to load them from.
        args += ["-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON", "-DGGML_BACKEND_DIR:STRING=llama_cpp/lib"]
    elif baseline in BASELINE_FEATURES:
        wanted = BASELINE_FEATURES[baseline]
        args += [f"-DGGML_{feature}={'ON' if feature in wanted else 'OFF'}" for feature in X86_FEATURES]
    args += {"cpu": [], "cuda": ["-DGGML_CUDA=ON"], "metal": ["-DGGML_METAL=ON"], "hip": ["-DGGML_HIP=ON"],
             "vulkan": ["-DGGML_VULKAN=ON"]}[backend]
    return args


LLAMA_CPP_PYTHON = "0.3.36"


def wheel_dir(backend: str, python: str) -> Path:
    """Where set-up keeps the llama-cpp-python wheel built for `backend` and interpreter `python`:
    keyed by the version, the CMake arguments, the interpreter's version and platform, and the
    patches set-up applies to its llama.cpp (packaging/llama-patches/)."""
    interpreter = subprocess.run([python, "-c", "import sys, sysconfig; print(sys.version_info[:2], sysconfig.get_platform())"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    patches = sorted((Path(__file__).resolve().parents[1] / "packaging" / "llama-patches").glob("*.patch"))
    patched = hashlib.sha256(b"".join(p.name.encode() + b"\0" + p.read_bytes() for p in patches)).hexdigest()
    key = hashlib.sha256("\n".join([LLAMA_CPP_PYTHON, " ".join(cmake_args(backend)), interpreter,
                                    patched]).encode()).hexdigest()
    root = os.environ.get("SPECDESK_WHEEL_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") \
        / "specdesk" / "llama-wheels"
    return Path(root) / f"{backend}-{key[:16]}"


def main(argv: list[str]) -> int:
    if argv[:1] == ["choose"]:
        backend, reason = choose()
        print(f"{backend}\t{reason}")
    elif argv[:1] == ["cmake-args"] and len(argv) == 2:
        print(" ".join(cmake_args(argv[1])))
    elif argv[:1] == ["wheel-dir"] and len(argv) == 3:
        print(wheel_dir(argv[1], argv[2]))
    elif argv[:1] == ["cpu-baseline"]:
        baseline, reason = cpu_baseline()
        print(f"{baseline}\t{reason}")
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
