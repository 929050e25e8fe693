"""Where a GGUF model's layers sit (engines/llama/placement.py, app/runtime/placement.py): the values a
user gives, the layers `auto` chooses, and one line for every bad value, from the CLI too.
The offload itself, on llama.cpp's RPC backend, is tests/test_rpc_offload.py."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest

from specdesk.app.main import main
from specdesk.engines.llama.binding import validated_header
from specdesk.engines.llama.devices import Device
from specdesk.engines.llama.placement import (Placement, buffer_device, fit_layers, model_layout, offload_bytes,
                                              parse_gpu_layers, resolve)
from specdesk.engines.llama.rpc import parse_endpoints, probe
from specdesk.engines.types import SpecDeskError

CPU_DEVICE = Device("CPU", "the processor", "cpu", "CPU", 8 << 30, 16 << 30)
GIB = 1 << 30


def gpu(free_bytes: int, name: str = "CUDA0") -> Device:
    return Device(name, "a card", "gpu", name.rstrip("0123456789"), free_bytes, 24 * GIB)


def test_gpu_layers_values():
    assert parse_gpu_layers("auto") == "auto" and parse_gpu_layers(None) == "auto" and parse_gpu_layers("") == "auto"
    assert parse_gpu_layers("all") == "all" and parse_gpu_layers("12") == 12 and parse_gpu_layers(0) == 0
    with pytest.raises(SpecDeskError, match=r"^--gpu-layers -5 is out of range: use auto"):
        parse_gpu_layers("-5")
    with pytest.raises(SpecDeskError, match=r"^--draft-gpu-layers 'many' is not a number"):
        parse_gpu_layers("many", "--draft-gpu-layers")


def test_rpc_addresses():
    assert parse_endpoints("127.0.0.1:50052, gpu-box:50053") == ["127.0.0.1:50052", "gpu-box:50053"]
    assert parse_endpoints("") == []
    for bad in ("localhost", "host:port", ":50052", "host:70000"):
        with pytest.raises(SpecDeskError, match="is not HOST:PORT"):
            parse_endpoints(bad)


def test_layout_counts_blocks_and_the_output_layer(demo_family):
    header = validated_header(demo_family["target_gguf"])
    layout = model_layout(header)
    n_block = int(header.arch_value("block_count"))
    assert layout.n_layers == n_block + 1
    assert layout.weights_bytes == sum(t.n_bytes for t in header.tensor_infos.values()) + (
        0 if "output.weight" in header.tensor_infos else layout.input_bytes)
    # n layers: the output layer first, then the blocks from the last
    assert offload_bytes(layout, 512, 0).total == 0
    assert offload_bytes(layout, 512, 1).weights == layout.output_bytes
    assert offload_bytes(layout, 512, 2).weights == layout.output_bytes + layout.blocks[-1]
    full = offload_bytes(layout, 512, layout.n_layers)
    assert full.weights == layout.weights_bytes - layout.input_bytes
    assert full.kv_cache == n_block * layout.kv_layer_bytes(512)


def test_auto_puts_every_layer_that_fits_and_the_rest_on_the_cpu(demo_family):
    header = validated_header(demo_family["target_gguf"])
    layout = model_layout(header)
    everything = offload_bytes(layout, 512, layout.n_layers).total
    assert fit_layers(layout, 512, 4 * GIB, 24 * GIB) == layout.n_layers
    # a device with room for about half of it (past auto's headroom of 5% of 24 GiB)
    half = offload_bytes(layout, 512, layout.n_layers // 2).total
    n = fit_layers(layout, 512, int(0.05 * 24 * GIB) + half, 24 * GIB)
    assert 0 < n < layout.n_layers and offload_bytes(layout, 512, n).total <= half < everything
    assert fit_layers(layout, 512, 10 << 20, 24 * GIB) == 0  # under the headroom: the CPU
    placed = resolve(Placement(), header, 512, [CPU_DEVICE, gpu(4 * GIB)])
    assert (placed.device, placed.n_gpu_layers, placed.n_layers) == ("CUDA0", layout.n_layers, layout.n_layers)
    assert placed.describe() == f"{layout.n_layers}/{layout.n_layers} layers on CUDA0 (a card)"
    assert resolve(Placement(), header, 512, [CPU_DEVICE]).describe() == "CPU"  # no offload device


def test_named_devices_and_bad_values_are_one_line(demo_family):
    header = validated_header(demo_family["target_gguf"])
    n_layers = model_layout(header).n_layers
    devices = [CPU_DEVICE, gpu(4 * GIB), Device("RPC0", "127.0.0.1:50052", "gpu", "RPC", GIB, GIB)]
    assert resolve(Placement("rpc0", 3), header, 512, devices).device == "RPC0"
    assert resolve(Placement("127.0.0.1:50052", 3), header, 512, devices).device == "RPC0"
    assert resolve(Placement("cuda", "all"), header, 512, devices).n_gpu_layers == n_layers
    assert resolve(Placement("cpu", 0), header, 512, devices).on_cpu
    assert resolve(Placement("CUDA0", 0), header, 512, devices).on_cpu
    with pytest.raises(SpecDeskError, match=rf"^--gpu-layers {n_layers + 1} is more than the {n_layers} layers"):
        resolve(Placement("CUDA0", n_layers + 1), header, 512, devices)
    with pytest.raises(SpecDeskError, match=r"^--device 'Vulkan7' is not a device here: choose auto or one of "
                                            r"CPU, CUDA0 \(a card\), RPC0 \(127.0.0.1:50052\)"):
        resolve(Placement("Vulkan7", "auto"), header, 512, devices)
    with pytest.raises(SpecDeskError, match=r"^--gpu-layers 1: there is no offload device here"):
        resolve(Placement("auto", 1), header, 512, [CPU_DEVICE])
    with pytest.raises(SpecDeskError, match=r"^--draft-gpu-layers 1: --draft-device cpu keeps every layer"):
        resolve(Placement("cpu", 1), header, 512, devices, option="--draft-device",
                layers_option="--draft-gpu-layers")


def test_buffers_are_counted_on_their_device():
    assert buffer_device("RPC0[127.0.0.1:50052]") == "RPC0"
    assert buffer_device("CUDA0") == "CUDA0"
    assert [buffer_device(n) for n in ("CPU", "CPU_Mapped", "CPU_REPACK", "CUDA_Host")] == ["CPU"] * 4


def test_an_rpc_address_nobody_serves_or_a_foreign_server_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    with pytest.raises(SpecDeskError, match=rf"^--rpc 127.0.0.1:{port}: no RPC server answers there"):
        probe(f"127.0.0.1:{port}")
    with socket.socket() as server:  # something else listens: it answers HELLO with nonsense
        server.bind(("127.0.0.1", 0))
        server.listen(1)

        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(64)
                conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
        threading.Thread(target=answer, daemon=True).start()
        with pytest.raises(SpecDeskError, match=r"no RPC server answers there|did not answer"):
            probe(f"127.0.0.1:{server.getsockname()[1]}", timeout_s=2)


def run_cli(capsys, *argv: str) -> tuple[int, list[str]]:
    code = main(list(argv))
    return code, capsys.readouterr().err.strip().splitlines()


def test_cli_bad_placement_values_are_one_line_and_exit_status_2(capsys, demo_family):
    target = demo_family["target_gguf"]
    base = ["compare", "--target", target, "--method", "ngram", "--max-tokens", "4", "--threads", "1",
            "--prompt", "def f("]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    n_layers = model_layout(validated_header(target)).n_layers
    cases = {
        "negative layers": (["--gpu-layers", "-5"], "--gpu-layers -5 is out of range"),
        "bad draft layers": (["--draft-gpu-layers", "x"], "--draft-gpu-layers 'x' is not a number"),
        "unknown device": (["--device", "Vulkan7"], "--device 'Vulkan7' is not a device here"),
        "too many layers": (["--device", "cpu", "--gpu-layers", str(n_layers + 1)],
                            f"--gpu-layers {n_layers + 1} is more than the {n_layers} layers"),
        "dead rpc": (["--rpc", dead], f"--rpc {dead}: no RPC server answers there"),
        "malformed rpc": (["--rpc", "gpu-box"], "--rpc 'gpu-box' is not HOST:PORT"),
        "unknown draft weights": (["--draft-weights", "q4"], "--draft-weights 'q4' is not one of q8, file"),
    }
    from specdesk.engines.llama.devices import llama_devices

    if all(d.kind == "cpu" for d in llama_devices()):  # a CPU-only build
        cases["no offload device"] = (["--gpu-layers", "3"], "--gpu-layers 3: there is no offload device here")
    for name, (extra, expected) in cases.items():
        code, lines = run_cli(capsys, *base, *extra)
        assert code == 2, name
        assert len(lines) == 1 and lines[0].startswith("specdesk: error: ") and expected in lines[0], (name, lines)


def test_devices_with_a_dead_rpc_server_is_one_line_from_a_real_process():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    done = subprocess.run([sys.executable, "-m", "specdesk.app.main", "devices", "--rpc", dead],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"specdesk: error: --rpc {dead}: no RPC server answers there "
                                                "(Connection refused): start one (llama.cpp's rpc-server) "
                                                "or check the address"]


def test_settings_keep_the_placement_and_refuse_bad_values():
    from specdesk.app.storage.settings import Settings

    settings, refused = Settings.checked({"device": "RPC0", "gpu_layers": "20", "draft_device": "CPU",
                                          "draft_gpu_layers": "0", "rpc_servers": "127.0.0.1:50052",
                                          "draft_weights": "file"})
    assert refused == []
    assert settings.placement() == {"device": "RPC0", "gpu_layers": "20", "draft_device": "CPU",
                                    "draft_gpu_layers": "0", "rpc": ("127.0.0.1:50052",), "draft_weights": "file"}
    settings, refused = Settings.checked({"gpu_layers": "-5", "draft_gpu_layers": 3, "rpc_servers": "gpu-box",
                                          "draft_weights": "q4"})
    assert sorted(refused) == ["draft_gpu_layers", "draft_weights", "gpu_layers", "rpc_servers"]
    assert settings.placement()["gpu_layers"] == "auto" and settings.placement()["rpc"] == ()
    assert settings.placement()["draft_weights"] == "q8"


def test_the_limits_group_edits_the_placement(qtbot):
    from specdesk.app.storage.settings import Settings
    from specdesk.ui.controls import ControlsPanel

    settings = Settings(gpu_layers="12", rpc_servers="127.0.0.1:50052")
    panel = ControlsPanel(settings)
    qtbot.addWidget(panel)
    assert panel.gpu_layers_combo.currentText() == "12" and panel.rpc_edit.text() == "127.0.0.1:50052"
    with qtbot.waitSignal(panel.models_changed, timeout=2000):  # a new placement loads the model again
        panel.draft_device_combo.setCurrentText("CPU")
        panel.draft_device_combo.lineEdit().editingFinished.emit()
    panel.gpu_layers_combo.setCurrentText("-5")
    assert panel.placement_error() == ("GPU layers -5 is out of range: use auto, all, 0 (CPU only) "
                                       "or a number of layers")
    panel.store_settings(settings)
    assert settings.gpu_layers == "12" and settings.draft_device == "auto"  # a bad value keeps the last good ones
    panel.gpu_layers_combo.setCurrentText("all")
    panel.store_settings(settings)
    assert (settings.gpu_layers, settings.draft_device) == ("all", "CPU")


def test_the_limits_group_chooses_the_draft_weights(qtbot):
    from specdesk.app.storage.settings import Settings
    from specdesk.engines.llama.draft_copy import DRAFT_WEIGHTS
    from specdesk.ui.controls import DRAFT_WEIGHT_CHOICES, ControlsPanel

    assert tuple(value for value, _ in DRAFT_WEIGHT_CHOICES) == DRAFT_WEIGHTS
    settings = Settings(draft_weights="file")
    panel = ControlsPanel(settings)
    qtbot.addWidget(panel)
    assert panel.draft_weights_combo.currentData() == "file"
    panel.mark_loaded()
    with qtbot.waitSignal(panel.models_changed, timeout=2000):  # the draft loads again from the other weights
        panel.draft_weights_combo.setCurrentIndex(panel.draft_weights_combo.findData("q8"))
        panel.draft_weights_combo.activated.emit(panel.draft_weights_combo.currentIndex())
    panel.store_settings(settings)
    assert settings.draft_weights == "q8" and settings.placement()["draft_weights"] == "q8"


def test_pass_cost_ratio_from_a_sweep():
    from specdesk.app.runtime.placement import pass_cost_ratio
    from specdesk.engines.types import RunStats

    def stats(passes: int, verify_s: float) -> RunStats:
        return RunStats(tokens=passes, seconds=verify_s, passes=passes, drafted=0, accepted=0, draft_s=0.0,
                        verify_s=verify_s, per_position_drafted=(), per_position_accepted=(),
                        accepted_length_histogram=())

    assert pass_cost_ratio(stats(10, 0.1), stats(5, 0.1)) == pytest.approx(2.0)  # a pass costs twice one token's
    assert pass_cost_ratio(stats(0, 0.0), stats(5, 0.1)) is None


def test_measurements_belong_to_their_placement(demo_family, tmp_path):
    from specdesk.app.runtime.measurements import read, record
    from specdesk.app.models.pairing import measured_on_placement
    from specdesk.app.runtime.placement import placement_label

    on_device = {"target": {"device": "RPC0", "description": "127.0.0.1:50052", "n_gpu_layers": 3, "n_layers": 3}}
    assert placement_label(on_device) == "RPC0[127.0.0.1:50052] 3/3"
    assert placement_label({"target": {"device": "CPU", "n_gpu_layers": 0}}) == placement_label(None) == "CPU"
    path = tmp_path / "measurements.jsonl"
    target, draft = demo_family["target_gguf"], demo_family["draft_gguf"]
    record(target, draft, "llama.cpp", "draft", 4, 3.0, 0.8, 64, 0.0, path, placement=placement_label(on_device))
    record(target, draft, "llama.cpp", "draft", 2, 1.2, 0.7, 64, 0.0, path)
    records = read(path) + [{"target": target, "draft": draft, "method": "draft", "k": 3, "speedup": 1.1}]
    here = measured_on_placement(records, target, 0)  # this machine: the CPU (older records count as CPU)
    assert sorted(r["k"] for r in here) == [2, 3]


def test_pairing_says_where_each_model_would_sit_per_device(demo_family):
    from specdesk.app.models.library import read_model
    from specdesk.app.models.pairing import estimate_placement, estimate_memory, pair

    report = pair(demo_family["target_gguf"], [read_model(demo_family["draft_gguf"])], records=[])
    assert report.placement.describe().startswith("target CPU · draft CPU; RAM needs ")
    assert report.to_json()["memory"]["placement"]["fits"] is True
    # on a device with room for everything: every layer there, and the RAM keeps the rest
    target, draft = read_model(demo_family["target_gguf"]), read_model(demo_family["draft_gguf"])
    memory = estimate_memory(target, draft)
    card = gpu(4 * GIB)
    placed = estimate_placement(memory, target.path, draft.path, devices=[CPU_DEVICE, card])
    n_layers = model_layout(validated_header(target.path)).n_layers
    assert placed.target["n_gpu_layers"] == n_layers and placed.draft["device"] == "CUDA0"
    ram, on_card = placed.devices
    assert on_card.device == "CUDA0" and 0 < on_card.required_bytes < card.free_bytes
    assert ram.required_bytes < memory.required_bytes and placed.fits
    assert f"target {n_layers}/{n_layers} layers on CUDA0 (a card)" in placed.describe()


def test_the_kv_cache_of_offloaded_layers_does_not_count_against_ram(demo_family):
    """llama.cpp keeps an offloaded layer's KV cache on its device: only the CPU layers' part
    must fit in free RAM (the placement already counted the rest on the device)."""
    from specdesk.engines.llama.binding import validated_header
    from specdesk.engines.llama.validate import context_problems, kv_cache_bytes

    header = validated_header(demo_family["target_gguf"])
    n_layer = header.arch_value("block_count")
    need = kv_cache_bytes(header, 512)
    short = need // 2
    assert context_problems(header, 512, short)  # all on the CPU: refused, with the bytes
    assert "KV cache" in context_problems(header, 512, short)[0]
    assert context_problems(header, 512, short, layers_on_device=n_layer) == []
    assert n_layer >= 2
    for on_device in range(n_layer + 1):  # the CPU layers' share of the KV cache is what must fit
        refused = need * (n_layer - on_device) // n_layer > short
        assert bool(context_problems(header, 512, short, layers_on_device=on_device)) == refused
    assert context_problems(header, -1, None, layers_on_device=n_layer)  # the range holds wherever it sits
