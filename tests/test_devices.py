"""What the install runs on: llama.cpp's backends, devices and CPU code, and PyTorch's devices,
as `specdesk devices`, `specdesk --version` and the About box report them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import ctypes

import pytest

from specdesk.engines.llama.binding import ggml_function
from specdesk.engines.llama.devices import (cpu_features, cpu_modules, cpu_variant, describe_build, file_holding,
                                           llama_build, llama_devices, module_file)

SYSTEM_INFO = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 0 | "
               "LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ")


def test_cpu_code_is_named_from_the_features_it_was_compiled_for():
    features = cpu_features(SYSTEM_INFO)
    assert features == ["SSE3", "SSSE3", "AVX", "AVX2", "F16C", "FMA", "BMI2", "LLAMAFILE", "OPENMP", "REPACK"]
    assert cpu_variant(features, "x86_64") == "x86-64-v3"
    assert cpu_variant(features + ["AVX512"], "x86_64") == "x86-64-v4"
    assert cpu_variant(["SSE3", "SSSE3"], "x86_64") == "x86-64-v2"
    assert cpu_variant([], "x86_64") == "x86-64"
    assert cpu_variant(features, "arm64") == "arm64"


def test_a_cpu_only_build_says_so_with_how_to_get_a_gpu_build():
    build = {"llama_cpp_python": "0.3.36", "backend": "cpu", "backends": ["CPU", "RPC"], "gpu_offload": False,
             "rpc": True, "cpu_variant": "x86-64-v3", "cpu_features": []}
    line = describe_build(build)
    assert "backend cpu, CPU code x86-64-v3, RPC; GPU offload: no" in line and "scripts/setup.sh" in line
    cuda = describe_build({**build, "backend": "cuda", "backends": ["CUDA", "CPU"], "gpu_offload": True})
    assert cuda.endswith("GPU offload: yes")


def test_the_cpu_variant_chosen_at_run_time_is_named(tmp_path):
    """A GGML_BACKEND_DL build: the variants it ships, by file, and the one mapped into the process."""
    for name in ("libggml-cpu-x64.so", "libggml-cpu-haswell.so", "libggml-cpu-skylakex.so", "libggml-base.so.0",
                 "libggml-rpc.so", "ggml-cpu-sse42.dll"):
        (tmp_path / name).write_bytes(b"")
    assert cpu_modules(tmp_path) == ["haswell", "skylakex", "sse42", "x64"]
    assert module_file("/opt/specdesk/_internal/llama_cpp/lib/libggml-cpu-haswell.so") == "haswell"
    assert module_file("/opt/specdesk/_internal/llama_cpp/lib/libggml-base.so.0") is None and module_file(None) is None
    build = {"llama_cpp_python": "0.3.36", "backend": "cpu", "backends": ["RPC", "CPU"], "gpu_offload": False,
             "rpc": True, "cpu_variant": "x86-64-v3", "cpu_features": [], "cpu_modules": ["haswell", "sse42", "x64"],
             "cpu_module": "haswell"}
    assert "CPU code x86-64-v3 (haswell, chosen at run time from 3 variants), RPC" in describe_build(build)


def test_this_install_lists_the_cpu_with_its_memory():
    devices = llama_devices()
    cpu = [d for d in devices if d.kind == "cpu"]
    assert cpu and cpu[0].total_bytes > 0 and cpu[0].backend == "CPU"
    build = llama_build()
    assert build["llama_cpp_python"] == "0.3.36" and "CPU" in build["backends"]
    assert build["cpu_variant"].startswith("x86-64") or build["cpu_variant"] == os.uname().machine
    if build["cpu_modules"]:  # run-time variants: the one loaded is one of those shipped
        assert build["cpu_module"] in build["cpu_modules"]


def test_the_variant_named_is_the_module_whose_code_runs():
    """Every module file is mapped into the process once cpu_variant has scored them, so the name
    comes from the file that holds the registered CPU backend, and agrees with the module the
    choice handed to child processes and with the features llama.cpp reports for its CPU code."""
    from specdesk.engines.llama import cpu_variant

    build = llama_build()
    if not build["cpu_modules"]:
        pytest.skip("a build with its CPU code linked in")
    every_file = {module_file(line.rsplit("/", 1)[-1]) for line in open("/proc/self/maps")} - {None}
    assert len(every_file) > 1  # the memory map alone could not tell which one runs
    assert build["cpu_module"] == module_file(os.environ[cpu_variant.ENV])
    assert build["cpu_module"] == module_file(file_holding(
        ggml_function("ggml_backend_reg_by_name", ctypes.c_void_p, [ctypes.c_char_p])(b"CPU")))
    if build["cpu_module"] in ("x64", "sse42"):
        assert "AVX2" not in build["cpu_features"]
    if build["cpu_module"] in ("skylakex", "icelake", "cooperlake", "cannonlake", "sapphirerapids", "zen4"):
        assert build["cpu_variant"] == "x86-64-v4"
    assert describe_build(build).count(f"({build['cpu_module']}, chosen at run time") == 1


def _specdesk(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdesk.ui.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_specdesk_devices_prints_json_and_version_names_the_build():
    done = _specdesk("devices", "--compact")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["llama_cpp"]["devices"][0]["kind"] == "cpu"
    assert {"backend", "cpu_variant", "gpu_offload"} <= set(report["llama_cpp"])
    assert report["torch"][0]["name"] == "cpu"
    version = _specdesk("--version")
    assert version.returncode == 0, version.stderr
    first, second = version.stdout.splitlines()[:2]
    assert first.startswith("specdesk ")
    assert "backend " in second and "CPU code " in second and "GPU offload: " in second


def test_the_about_box_names_the_backend_and_cpu_code(qtbot, tmp_path):
    from specdesk.ui.main_window import MainWindow

    window = MainWindow(settings_file=tmp_path / "settings.json", autoload=False)
    qtbot.addWidget(window)
    text = window.about_text()
    assert "backend " in text and "CPU code " in text and "Qt (PySide6)" in text
    assert window.about_action.text() == "About SpecDesk…"


def test_a_module_named_by_the_parent_is_the_one_reported(tmp_path):
    """Whatever this CPU would pick: a process told to use the SSE4.2 module (which every x86-64
    CPU of the last fifteen years runs) reports that module and its level, in --version's line."""
    if os.uname().machine != "x86_64":
        pytest.skip("x86-64 variants")
    from specdesk.engines.llama import binding

    folder = Path(binding.llama_lib().llama_cpp._lib._name).parent
    if not (folder / "libggml-cpu-sse42.so").is_file():
        pytest.skip("a build with its CPU code linked in")
    code = ("import json; from specdesk.engines.llama.devices import llama_build, describe_build; "
            "b = llama_build(); print(json.dumps([b['cpu_module'], b['cpu_variant'], b['cpu_features'], describe_build(b)]))")
    env = {**os.environ, "SPECDESK_LLAMA_CPU_MODULE": str(folder / "libggml-cpu-sse42.so"),
           "SPECDESK_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    module, level, features, line = json.loads(done.stdout.strip().splitlines()[-1])
    assert (module, level) == ("sse42", "x86-64-v2") and "AVX2" not in features
    assert "CPU code x86-64-v2 (sse42, chosen at run time" in line
