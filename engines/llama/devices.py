"""What the llama.cpp libraries of this install can run on: the backends they were built
with, the devices those backends see (ggml's backend device API), and the CPU code they carry.

Read once per process through llama-cpp-python's library handle and ggml's C API (ctypes,
binding.ggml_function), never by loading a model.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from .binding import ggml_function, llama_lib

# enum ggml_backend_dev_type (ggml-backend.h)
DEVICE_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}
# x86-64 micro-architecture levels by the features llama_print_system_info lists for the CPU code
X86_LEVELS = (
    ("x86-64-v4", {"AVX512"}),
    ("x86-64-v3", {"AVX2", "FMA", "F16C", "BMI2"}),
    ("x86-64-v2", {"SSE3", "SSSE3"}),
)
GPU_BACKENDS = {"CUDA": "cuda", "ROCm": "hip", "HIP": "hip", "Metal": "metal", "MTL": "metal", "Vulkan": "vulkan",
                "SYCL": "sycl", "MUSA": "musa", "CANN": "cann", "OpenCL": "opencl"}
GPU_BUILD_HINT = ("this llama.cpp is a CPU-only build: for GPU offload, set up again where the GPU's toolkit is "
                  "installed (scripts/setup.sh picks CUDA, HIP, Vulkan or Metal; SPECDESK_LLAMA_BACKEND=cuda forces one)")


@dataclass(frozen=True)
class Device:
    name: str  # ggml's device name ("CPU", "CUDA0", "RPC0[127.0.0.1:50052]" ...)
    description: str
    kind: str  # cpu, gpu, igpu, accel
    backend: str  # the backend (registry) that owns it
    free_bytes: int
    total_bytes: int

    def as_dict(self) -> dict:
        return asdict(self)


def _ggml(name: str, restype, argtypes: list):
    return ggml_function(name, restype, argtypes)


def _text(pointer: bytes | None) -> str:
    return (pointer or b"").decode("utf-8", "replace")


def llama_devices() -> list[Device]:
    """Every device the loaded ggml backends offer now (an RPC server added later adds one)."""
    count = _ggml("ggml_backend_dev_count", ctypes.c_size_t, [])
    get = _ggml("ggml_backend_dev_get", ctypes.c_void_p, [ctypes.c_size_t])
    name = _ggml("ggml_backend_dev_name", ctypes.c_char_p, [ctypes.c_void_p])
    description = _ggml("ggml_backend_dev_description", ctypes.c_char_p, [ctypes.c_void_p])
    kind = _ggml("ggml_backend_dev_type", ctypes.c_int, [ctypes.c_void_p])
    memory = _ggml("ggml_backend_dev_memory", None,
                   [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)])
    backend_reg = _ggml("ggml_backend_dev_backend_reg", ctypes.c_void_p, [ctypes.c_void_p])
    reg_name = _ggml("ggml_backend_reg_name", ctypes.c_char_p, [ctypes.c_void_p])
    devices = []
    for index in range(count()):
        device = get(index)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        memory(device, ctypes.byref(free), ctypes.byref(total))
        devices.append(Device(_text(name(device)), _text(description(device)), DEVICE_KINDS.get(kind(device), "other"),
                              _text(reg_name(backend_reg(device))), free.value, total.value))
    return devices


def _backend_names() -> list[str]:
    count = _ggml("ggml_backend_reg_count", ctypes.c_size_t, [])
    get = _ggml("ggml_backend_reg_get", ctypes.c_void_p, [ctypes.c_size_t])
    name = _ggml("ggml_backend_reg_name", ctypes.c_char_p, [ctypes.c_void_p])
    return [_text(name(get(i))) for i in range(count())]


def cpu_features(system_info: str) -> list[str]:
    """The CPU features the CPU code was compiled for, from llama_print_system_info's
    "CPU : SSE3 = 1 | AVX = 1 | ..." part."""
    features = []
    for section in system_info.split("|"):
        if "=" not in section:
            continue
        key, value = section.rsplit("=", 1)
        key = key.split(":")[-1].strip()
        if value.strip() == "1" and key:
            features.append(key)
    return features


def cpu_variant(features: list[str], machine: str) -> str:
    """The CPU code level: x86-64-v2/v3/v4 on x86-64, the machine's name elsewhere."""
    if machine.lower() not in ("x86_64", "amd64"):
        return machine
    have = set(features)
    for level, needed in X86_LEVELS:
        if needed <= have:
            return level
    return "x86-64"


CPU_MODULE = re.compile(r"^(?:lib)?ggml-cpu-([\w-]+)\.(?:so|dll|dylib)$")


def cpu_modules(folder: Path) -> list[str]:
    """The CPU variants a GGML_BACKEND_DL build carries ("x64", "sse42", "haswell" ...), by file."""
    try:
        return sorted(m.group(1) for m in map(CPU_MODULE.match, (p.name for p in folder.iterdir())) if m)
    except OSError:
        return []


def module_file(name: str | None) -> str | None:
    """The CPU variant a module file's name says ("zen4" for libggml-cpu-zen4.so), or None."""
    match = CPU_MODULE.match(Path(name).name) if name else None
    return match.group(1) if match else None


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def file_holding(address: int) -> str | None:
    """The shared library whose image holds `address` (dladdr), or None where it cannot be asked."""
    if not address or sys.platform == "win32":
        return None
    for library in (None, "libdl.so.2"):
        try:
            dladdr = ctypes.CDLL(library).dladdr
        except (OSError, AttributeError):
            continue
        dladdr.restype, dladdr.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        info = _DlInfo()
        if dladdr(ctypes.c_void_p(address), ctypes.byref(info)) and info.dli_fname:
            return os.fsdecode(info.dli_fname)
        return None
    return None


def loaded_cpu_module() -> str | None:
    """The CPU variant ggml's registered CPU backend comes from: the file holding its registry
    entry. Every module file may be mapped into the process (cpu_variant.ranked scores each one),
    so the process's memory map cannot say which one runs."""
    reg = _ggml("ggml_backend_reg_by_name", ctypes.c_void_p, [ctypes.c_char_p])(b"CPU")
    return module_file(file_holding(reg))


@functools.lru_cache(maxsize=1)
def llama_build() -> dict:
    """The llama.cpp build of this install: backends, GPU offload, CPU code."""
    import platform

    llama_cpp = llama_lib()
    backends = _backend_names()
    features = cpu_features(_text(llama_cpp.llama_print_system_info()))
    gpu = sorted({GPU_BACKENDS[name] for name in backends if name in GPU_BACKENDS})
    modules = cpu_modules(Path(llama_cpp.llama_cpp._lib._name).parent)
    return {
        "llama_cpp_python": getattr(llama_cpp, "__version__", "unknown"),
        "backend": gpu[0] if gpu else "cpu",
        "backends": backends,
        # llama_supports_gpu_offload is also true for the RPC backend alone: offload to a GPU needs a GPU backend
        "gpu_offload": bool(gpu) and bool(llama_cpp.llama_supports_gpu_offload()),
        "rpc": "RPC" in backends,
        "cpu_variant": cpu_variant(features, platform.machine()),
        "cpu_features": features,
        # GGML_BACKEND_DL builds: the variants shipped, and the one chosen at run time for this CPU
        "cpu_modules": modules,
        "cpu_module": loaded_cpu_module() if modules else None,
    }


def describe_build(build: dict) -> str:
    """One line: "llama.cpp 0.3.36: CPU (x86-64-v3), RPC; GPU offload: no (...)"."""
    offload = "yes" if build["gpu_offload"] else "no"
    code = build["cpu_variant"]
    if build.get("cpu_modules"):
        chosen = f"{build['cpu_module']}, " if build.get("cpu_module") else ""
        code += f" ({chosen}chosen at run time from {len(build['cpu_modules'])} variants)"
    line = (f"llama.cpp (llama-cpp-python {build['llama_cpp_python']}): backend {build['backend']}, "
            f"CPU code {code}{', RPC' if build['rpc'] else ''}; GPU offload: {offload}")
    return line if offload == "yes" else f"{line} ({GPU_BUILD_HINT})"
