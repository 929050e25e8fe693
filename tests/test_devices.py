"""What the install runs on: llama.cpp's backends, devices and CPU code, and PyTorch's devices,
as `specdesk devices`, `specdesk --version` and the About box report them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from specdesk.engines.llama.devices import (cpu_features, cpu_modules, cpu_variant, describe_build, llama_build,
                                           llama_devices, loaded_cpu_module)

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
    build = {"llama_cpp_python": "0.3.36", "backend": "cpu", "backends": ["CPU", "RPC"], "gpu_offload": True,
             "rpc": True, "cpu_variant": "x86-64-v3", "cpu_features": []}
    line = describe_build(build)
    assert "backend cpu, CPU code x86-64-v3, RPC; GPU offload: no" in line and "scripts/setup.sh" in line
    cuda = describe_build({**build, "backend": "cuda", "backends": ["CUDA", "CPU"]})
    assert cuda.endswith("GPU offload: yes")


def test_the_cpu_variant_chosen_at_run_time_is_named(tmp_path):
    """A GGML_BACKEND_DL build: the variants it ships, by file, and the one mapped into the process."""
    for name in ("libggml-cpu-x64.so", "libggml-cpu-haswell.so", "libggml-cpu-skylakex.so", "libggml-base.so.0",
                 "libggml-rpc.so", "ggml-cpu-sse42.dll"):
        (tmp_path / name).write_bytes(b"")
    assert cpu_modules(tmp_path) == ["haswell", "skylakex", "sse42", "x64"]
    maps = ("7f00-7f10 r-xp 00000000 08:01 1 /opt/specdesk/_internal/llama_cpp/lib/libggml-base.so.0\n"
            "7f10-7f20 r-xp 00000000 08:01 2 /opt/specdesk/_internal/llama_cpp/lib/libggml-cpu-haswell.so\n")
    assert loaded_cpu_module(maps) == "haswell" and loaded_cpu_module("") is None
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
