"""scripts/setup.sh chooses llama.cpp's backend from what the machine has: each machine is
faked with stub tools on PATH (nvcc, nvidia-smi, hipcc, rocminfo, glslc) and a faked platform."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The tools --print-backend runs besides the stubs: nothing of this machine's own toolkits
# (a real CUDA toolkit, glslc) may leak into the faked machine.
SHELL_TOOLS = ("dirname", "cat")


def _stub(folder: Path, name: str, output: str = "", status: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / name
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\nexit {status}\n")
    script.chmod(0o755)


def _print_backend(tmp_path: Path, tools: dict[str, str] = {}, platform_name: str = "Linux x86_64",
                   **env: str) -> subprocess.CompletedProcess:
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    for name, output in tools.items():
        _stub(stubs, name, output)
    for tool in SHELL_TOOLS:
        if not (stubs / tool).exists():
            (stubs / tool).symlink_to(shutil.which(tool))
    environment = {"PATH": str(stubs), "HOME": str(tmp_path), "PYTHON": sys.executable,
                   "SPECDESK_PLATFORM": platform_name, **env}
    return subprocess.run([shutil.which("bash"), str(ROOT / "scripts" / "setup.sh"), "--print-backend"],
                          env=environment, capture_output=True, text=True, timeout=60)


def _choice(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, lines  # one line: the choice and its reason
    return lines[0]


NVIDIA = "GPU 0: NVIDIA GeForce RTX 4090 (UUID: GPU-0a1b2c3d)"
ROCM = "  Name:                    gfx1100\n  Marketing Name:          Radeon RX 7900 XTX"


def test_a_machine_with_no_gpu_toolkit_gets_the_cpu_build(tmp_path):
    line = _choice(_print_backend(tmp_path))
    assert line.startswith("llama.cpp backend: cpu (no GPU toolkit found")
    assert "CPU code: " in line


def test_apple_silicon_gets_metal_and_an_intel_mac_the_cpu(tmp_path):
    assert _choice(_print_backend(tmp_path, platform_name="Darwin arm64")).startswith(
        "llama.cpp backend: metal (macOS on Apple silicon")
    assert _choice(_print_backend(tmp_path, platform_name="Darwin x86_64")).startswith("llama.cpp backend: cpu (macOS on Intel")


def test_nvcc_with_an_nvidia_gpu_gets_cuda_and_without_one_the_cpu(tmp_path):
    line = _choice(_print_backend(tmp_path, {"nvcc": "", "nvidia-smi": NVIDIA}))
    assert line.startswith("llama.cpp backend: cuda (nvcc at ") and "GPU 0: NVIDIA GeForce RTX 4090" in line
    alone = tmp_path / "alone"
    alone.mkdir()
    line = _choice(_print_backend(alone, {"nvcc": ""}))
    assert line.startswith("llama.cpp backend: cpu (nvcc at ") and "no NVIDIA GPU" in line
    assert "SPECDESK_LLAMA_BACKEND" in line  # how to build for CUDA anyway


def test_hipcc_with_an_amd_gpu_gets_hip(tmp_path):
    line = _choice(_print_backend(tmp_path, {"hipcc": "", "rocminfo": ROCM}))
    assert line.startswith("llama.cpp backend: hip (hipcc at ") and "gfx1100" in line


def test_glslc_with_the_vulkan_headers_gets_vulkan(tmp_path):
    sdk = tmp_path / "vulkan-sdk"
    (sdk / "include" / "vulkan").mkdir(parents=True)
    (sdk / "include" / "vulkan" / "vulkan.h").write_text("/* the SDK's header */\n")
    gpu = "GPU0:\n    deviceType         = PHYSICAL_DEVICE_TYPE_DISCRETE_GPU\n    deviceName         = AMD Radeon RX 6800"
    line = _choice(_print_backend(tmp_path, {"glslc": "", "vulkaninfo": gpu}, VULKAN_SDK=str(sdk)))
    assert line.startswith("llama.cpp backend: vulkan (the Vulkan SDK (glslc at ") and "AMD Radeon RX 6800" in line
    cpu_only = tmp_path / "lavapipe"
    cpu_only.mkdir()
    lavapipe = gpu.replace("DISCRETE_GPU", "CPU").replace("AMD Radeon RX 6800", "llvmpipe (LLVM 15.0.6, 256 bits)")
    line = _choice(_print_backend(cpu_only, {"glslc": "", "vulkaninfo": lavapipe}, VULKAN_SDK=str(sdk)))
    assert line.startswith("llama.cpp backend: cpu (the Vulkan SDK at ") and "no GPU for it" in line


def test_cuda_is_preferred_when_several_toolkits_are_there(tmp_path):
    line = _choice(_print_backend(tmp_path, {"nvcc": "", "nvidia-smi": NVIDIA, "hipcc": "", "rocminfo": ROCM,
                                             "glslc": "", "vulkaninfo": ""}))
    assert line.startswith("llama.cpp backend: cuda ")


def test_the_backend_can_be_forced_and_a_wrong_name_is_one_line(tmp_path):
    line = _choice(_print_backend(tmp_path, SPECDESK_LLAMA_BACKEND="vulkan"))
    assert line.startswith("llama.cpp backend: vulkan (SPECDESK_LLAMA_BACKEND=vulkan)")
    done = _print_backend(tmp_path, SPECDESK_LLAMA_BACKEND="opengl")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == ["SPECDESK_LLAMA_BACKEND='opengl' is not one of cpu, cuda, metal, hip, vulkan"]


LOAD_CPU_BACKEND = """
import ctypes, os, pathlib, llama_cpp
lib = llama_cpp.llama_cpp._lib
lib.ggml_backend_reg_count.restype = ctypes.c_size_t
if lib.ggml_backend_reg_count() == 0:
    lib.ggml_backend_load_all_from_path(os.fsencode(pathlib.Path(lib._name).parent))
lib.ggml_backend_reg_get.restype = ctypes.c_void_p
lib.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
lib.ggml_backend_reg_name.restype = ctypes.c_char_p
lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
names = [lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)).decode() for i in range(lib.ggml_backend_reg_count())]
print(llama_cpp.__version__, *names)
"""


def _cmake_args(backend: str, **env: str) -> list[str]:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "llama_backend.py"), "cmake-args", backend],
                          env={**os.environ, "SPECDESK_PLATFORM": "Linux x86_64", **env},
                          capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_every_build_has_portable_cpu_code_and_the_rpc_backend():
    for backend in ("cpu", "cuda", "hip", "vulkan"):
        args = _cmake_args(backend, SPECDESK_LLAMA_CPU="x86-64-v3")
        assert {"-DGGML_NATIVE=OFF", "-DGGML_RPC=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_AVX512=OFF",
                "-DGGML_AVX_VNNI=OFF", "-DGGML_AMX_INT8=OFF"} <= set(args), args
    assert "-DGGML_CUDA=ON" in _cmake_args("cuda") and "-DGGML_CUDA=ON" not in _cmake_args("cpu")
    v2 = _cmake_args("cpu", SPECDESK_LLAMA_CPU="x86-64-v2")
    assert {"-DGGML_SSE42=ON", "-DGGML_AVX=OFF", "-DGGML_AVX2=OFF", "-DGGML_FMA=OFF"} <= set(v2)
    assert "-DGGML_NATIVE=ON" in _cmake_args("cpu", SPECDESK_LLAMA_CPU="native")
    # by default on x86-64: every CPU level as a module, the best loaded at run time
    for backend in ("cpu", "cuda"):
        args = _cmake_args(backend, SPECDESK_LLAMA_CPU="")
        assert {"-DGGML_NATIVE=OFF", "-DGGML_RPC=ON", "-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON",
                "-DGGML_BACKEND_DIR:STRING=llama_cpp/lib", "-DLLAVA_BUILD=OFF"} <= set(args), args
        assert not [arg for arg in args if arg.startswith("-DGGML_AVX")], args
    arm = subprocess.run([sys.executable, str(ROOT / "scripts" / "llama_backend.py"), "cmake-args", "cpu"],
                         env={**os.environ, "SPECDESK_PLATFORM": "Linux aarch64", "SPECDESK_LLAMA_CPU": ""},
                         capture_output=True, text=True, check=True).stdout.split()
    assert arm == ["-DGGML_NATIVE=OFF", "-DGGML_RPC=ON", "-DLLAVA_BUILD=OFF"]
    intel_mac = subprocess.run([sys.executable, str(ROOT / "scripts" / "llama_backend.py"), "cmake-args", "cpu"],
                               env={**os.environ, "SPECDESK_PLATFORM": "Darwin x86_64", "SPECDESK_LLAMA_CPU": ""},
                               capture_output=True, text=True, check=True).stdout.split()
    assert "-DGGML_AVX2=ON" in intel_mac and "-DGGML_BACKEND_DL=ON" not in intel_mac


@pytest.mark.skipif(shutil.which("cmake") is None and not (ROOT / ".venv").exists(), reason="no build tools")
def test_a_failed_gpu_build_ends_in_a_working_cpu_install(tmp_path):
    """SPECDESK_LLAMA_BACKEND=cuda with an nvcc that cannot compile: CMake fails, set-up says so
    in one line and installs the CPU build, which imports. The CPU wheel comes from the cache
    the README's set-up filled (a copy of it, so the failure is not remembered there)."""
    venv_python = ROOT / ".venv" / "bin" / "python"
    backend_script = ROOT / "scripts" / "llama_backend.py"
    env = {**os.environ, "SPECDESK_PLATFORM": "", "SPECDESK_LLAMA_BACKEND": ""}
    cpu_wheels = Path(subprocess.run([sys.executable, str(backend_script), "wheel-dir", "cpu", str(venv_python)],
                                     env=env, capture_output=True, text=True, check=True).stdout.strip())
    if not list(cpu_wheels.glob("llama_cpp_python-*.whl")):
        pytest.skip(f"no cached CPU wheel in {cpu_wheels}: run scripts/setup.sh first")
    cache = tmp_path / "wheels"
    shutil.copytree(cpu_wheels, cache / cpu_wheels.name)
    _stub(tmp_path / "bin", "nvcc", "nvcc fatal: this is not a CUDA compiler", status=1)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], capture_output=True, text=True, timeout=900,
                          env={**env, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
                               "SPECDESK_LLAMA_BACKEND": "cuda", "CUDACXX": str(tmp_path / "bin" / "nvcc"),
                               "SPECDESK_VENV": str(venv),
                               "SPECDESK_WHEEL_CACHE": str(cache), "SPECDESK_SETUP_LLAMA_ONLY": "1",
                               "PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr[-3000:]
    fallback = [line for line in done.stderr.splitlines() if "falling back" in line]
    assert fallback == ["setup: falling back to the CPU build of llama.cpp (the cuda build failed, see above)"]
    assert (venv / ".specdesk-llama").read_text().split() == ["cuda", "cpu"]
    # the CPU build loads and has its CPU backend (loading the modules of a GGML_BACKEND_DL build
    # as engines/llama/binding.load_backend_modules does)
    works = subprocess.run([str(venv / "bin" / "python"), "-c", LOAD_CPU_BACKEND], capture_output=True, text=True,
                           timeout=120)
    assert works.returncode == 0 and works.stdout.split()[0] == "0.3.36" and "CPU" in works.stdout.split()[1:], \
        (works.stdout, works.stderr)
