"""Layers offloaded to a real device on a machine without a GPU: llama.cpp's RPC backend,
served by this machine's CPU from a child process (engines/llama/rpc.RpcServer).

The demo target with all, some and none of its layers there gives the same greedy tokens as
the CPU alone, for no speculation, ngram, a draft model (on the device and on the CPU) and the
demo target exported with its MTP layer; the layers and bytes on each device are reported and
the per-device estimate (engines/llama/placement.offload_bytes, as app/models/pairing uses it) is within
15% of what the device allocated; a server that dies under a loaded model ends the engine
process with one line, never the caller.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from specdesk.app.runtime.backend import ChatSettings, chat_turn
from specdesk.app.runtime.engine_client import EngineClient, EngineHostDied
from specdesk.engines.llama.binding import llama_lib, validated_header
from specdesk.engines.llama.placement import model_layout
from specdesk.engines.types import GenerationRequest, SpecConfig

pytestmark = pytest.mark.skipif(not llama_lib().llama_supports_rpc(),
                                reason="this llama-cpp-python was built without GGML_RPC (scripts/setup.sh builds it)")

PROMPT = "def parse_args(argv):\n    parser = "
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def rpc_server():
    from specdesk.engines.llama.rpc import RpcServer

    with RpcServer(n_threads=1) as server:
        yield server


@pytest.fixture(scope="module")
def family(demo_family):
    from specdesk.app.demo.export_native_gguf import build_native

    return {**demo_family, **build_native(demo_family)}


def greedy_tokens(client: EngineClient, spec: SpecConfig) -> list[int]:
    request = GenerationRequest(tuple(client.tokenize(PROMPT)), max_tokens=MAX_TOKENS, spec=spec, stop_at_eos=False)
    return [t for event in client.generate(request, threading.Event()) for t in event.tokens]


def open_client(target: str, rpc_server=None, **placement) -> EngineClient:
    rpc = (rpc_server.endpoint,) if rpc_server is not None else ()
    return EngineClient(target, n_threads=1, n_ctx=512, rpc=rpc, **placement)


@pytest.fixture(scope="module")
def cpu_reference(family) -> dict[str, list[int]]:
    """Baseline greedy tokens of the demo target and of its MTP export, on the CPU alone."""
    with open_client(family["target_gguf"], device="CPU", gpu_layers="0") as client:
        target = greedy_tokens(client, SpecConfig())
    with open_client(family["mtp_gguf"], device="CPU", gpu_layers="0") as client:
        mtp = greedy_tokens(client, SpecConfig())
    return {"target": target, "mtp": mtp}


def test_specdesk_devices_lists_the_rpc_device_with_its_memory(rpc_server):
    done = subprocess.run([sys.executable, "-m", "specdesk.app.main", "devices", "--compact", "--rpc",
                           rpc_server.endpoint], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    devices = json.loads(done.stdout)["llama_cpp"]["devices"]
    rpc = [d for d in devices if d["description"] == rpc_server.endpoint]
    assert devices[0]["kind"] == "cpu"
    assert len(rpc) == 1 and rpc[0]["name"].startswith("RPC") and rpc[0]["total_bytes"] > 0 < rpc[0]["free_bytes"]


@pytest.mark.parametrize("layers", ["all", "some", "0"])
def test_greedy_output_on_the_device_equals_the_cpu(family, rpc_server, cpu_reference, layers):
    n_layers = model_layout(validated_header(family["target_gguf"])).n_layers
    gpu_layers = str(n_layers // 2) if layers == "some" else layers
    with open_client(family["target_gguf"], rpc_server, device=rpc_server.endpoint, gpu_layers=gpu_layers,
                     draft_device=rpc_server.endpoint, draft_gpu_layers="all") as client:
        client.load_draft(family["draft_gguf"])
        report = client.placement_report()
        target = report["target"]
        expected = {"all": n_layers, "some": n_layers // 2, "0": 0}[layers]
        assert target["n_gpu_layers"] == expected and target["n_layers"] == n_layers
        off_cpu = sum(size for device, size in target["allocated_bytes"].items() if device != "CPU")
        assert (off_cpu > 0) == (expected > 0) and target["allocated_bytes"]["CPU"] > 0
        for spec in (SpecConfig(), SpecConfig(method="ngram", k=4),
                     SpecConfig(method="draft", k=4, draft_path=family["draft_gguf"])):
            assert greedy_tokens(client, spec) == cpu_reference["target"], (layers, spec.method)
        draft = next(place for role, place in report.items() if role != "target")
        assert draft["device"].startswith("RPC") and draft["allocated_bytes"][draft["device"]] > 0


def test_a_draft_on_the_cpu_beside_a_target_on_the_device(family, rpc_server, cpu_reference):
    with open_client(family["target_gguf"], rpc_server, device=rpc_server.endpoint, gpu_layers="all",
                     draft_device="CPU", draft_gpu_layers="0") as client:
        client.load_draft(family["draft_gguf"])
        spec = SpecConfig(method="draft", k=4, draft_path=family["draft_gguf"])
        assert greedy_tokens(client, spec) == cpu_reference["target"]
        draft = next(place for role, place in client.placement_report().items() if role != "target")
        assert draft["device"] == "CPU" and set(draft["allocated_bytes"]) == {"CPU"}


def test_the_mtp_demo_on_the_device_equals_the_cpu(family, rpc_server, cpu_reference):
    with open_client(family["mtp_gguf"], rpc_server, device=rpc_server.endpoint, gpu_layers="all") as client:
        assert greedy_tokens(client, SpecConfig(method="mtp", k=2)) == cpu_reference["mtp"]
        assert greedy_tokens(client, SpecConfig()) == cpu_reference["mtp"]


@pytest.mark.parametrize("layers", ["all", "some"])
def test_the_per_device_estimate_is_within_15_percent_of_what_the_device_allocated(family, rpc_server, layers):
    n_layers = model_layout(validated_header(family["target_gguf"])).n_layers
    gpu_layers = "all" if layers == "all" else str(n_layers // 2)
    with open_client(family["target_gguf"], rpc_server, device=rpc_server.endpoint, gpu_layers=gpu_layers) as client:
        target = client.placement["target"]
    allocated = target["allocated_bytes"][target["device"]]
    estimated = target["estimated_device_bytes"]
    assert abs(estimated - allocated) <= 0.15 * allocated, (estimated, allocated)


def test_a_dead_rpc_server_ends_the_engine_process_with_one_line(family):
    from specdesk.engines.llama.rpc import RpcServer

    server = RpcServer(n_threads=1)
    try:
        client = open_client(family["target_gguf"], server, device=server.endpoint, gpu_layers="all")
    except BaseException:
        server.stop()
        raise
    with client:
        server.stop()  # the device goes away under a loaded model: ggml aborts the engine process
        with pytest.raises(EngineHostDied) as died:
            greedy_tokens(client, SpecConfig())
        assert "\n" not in str(died.value) and "engine process" in str(died.value)
        assert not client.alive
    assert os.getpid() and threading.main_thread().is_alive()  # the caller is still here


def test_the_app_session_says_where_models_sit_and_outlives_a_dead_server(family):
    from specdesk.app.runtime.session import Session
    from specdesk.engines.llama.rpc import RpcServer
    from specdesk.engines.types import SamplingParams, SpecDeskError

    server = RpcServer(n_threads=1)
    session = Session()
    try:
        placement = {"device": server.endpoint, "gpu_layers": "all", "draft_device": "CPU",
                     "draft_gpu_layers": "0", "rpc": (server.endpoint,)}
        outcome = session.load(family["target_gguf"], family["draft_gguf"], n_ctx=512, threads=1,
                               placement=placement)
        assert outcome.draft_error is None
        n_layers = model_layout(validated_header(family["target_gguf"])).n_layers
        assert outcome.info.placement == (f"target {n_layers}/{n_layers} layers on "
                                          f"{outcome.info.placement_report['target']['device']} "
                                          f"({server.endpoint}) · draft CPU")
        server.stop()
        with pytest.raises(EngineHostDied) as died:
            chat_turn(session, [{"role": "user", "content": "hi"}], ChatSettings(SpecConfig(), SamplingParams(), 8),
                      threading.Event())
        assert "\n" not in str(died.value)
        assert session.engine_lost()
        with pytest.raises(SpecDeskError, match=rf"^--rpc {server.endpoint}: no RPC server answers there"):
            session.load(family["target_gguf"], None, n_ctx=512, threads=1, placement=placement)
    finally:
        session.close()
        server.stop()


def test_a_zoo_target_with_some_layers_on_the_device_equals_the_cpu(rpc_server):
    """Llama-3's vocabulary and architecture (benchmarks/zoo.py, small), in F16: at a quant type
    the CPU computes with repacked weights (CPU_REPACK) and the RPC server's plain buffers with
    other kernels, so greedy output may part at a near tie there (measured: Q4_K_M after 8-19
    tokens), which is numerics, not placement."""
    from benchmarks import zoo

    files = zoo.build("llama-bpe", "F16", small=True)
    n_layers = model_layout(validated_header(files["target_gguf"])).n_layers
    spec = SpecConfig(method="draft", k=4, draft_path=files["draft_gguf"])
    with open_client(files["target_gguf"], device="CPU", gpu_layers="0") as client:
        expected = greedy_tokens(client, SpecConfig())
    with open_client(files["target_gguf"], rpc_server, device=rpc_server.endpoint, gpu_layers=str(n_layers // 2),
                     draft_device="CPU") as client:
        client.load_draft(files["draft_gguf"])
        for config in (SpecConfig(), SpecConfig(method="ngram", k=4), spec):
            assert greedy_tokens(client, config) == expected, config.method
        assert client.placement_report()["target"]["n_gpu_layers"] == n_layers // 2


def local_offload_devices() -> list[str]:
    from specdesk.engines.llama.devices import llama_devices

    return [d.name for d in llama_devices() if d.kind != "cpu" and not d.backend.upper().startswith("RPC")]


@pytest.mark.skipif(not local_offload_devices(), reason="no GPU backend device in this llama.cpp build")
@pytest.mark.parametrize("device", local_offload_devices() or ["none"])
def test_speculation_on_each_local_gpu_device_is_lossless(family, device):
    """A GPU build's own devices (CUDA, Metal, Vulkan: lavapipe runs llama.cpp's Vulkan backend on
    a CPU): every layer there, speculation's greedy tokens equal that placement's baseline (a
    GPU's kernels need not round like the CPU's, so the CPU's tokens are not the reference)."""
    with open_client(family["target_gguf"], device=device, gpu_layers="all", draft_device=device,
                     draft_gpu_layers="all") as client:
        client.load_draft(family["draft_gguf"])
        assert client.placement_report()["target"]["device"] == device
        baseline = greedy_tokens(client, SpecConfig())
        for spec in (SpecConfig(method="ngram", k=4), SpecConfig(method="draft", k=4, draft_path=family["draft_gguf"])):
            assert greedy_tokens(client, spec) == baseline, spec.method


def test_a_busy_rpc_server_is_one_line_not_a_hang(family, rpc_server):
    """rpc-server serves one client at a time: a second one is told so, and the first goes on."""
    from specdesk.engines.llama.rpc import probe
    from specdesk.engines.types import SpecDeskError

    with open_client(family["target_gguf"], rpc_server, device=rpc_server.endpoint, gpu_layers="all") as client:
        with pytest.raises(SpecDeskError, match=rf"^--rpc {rpc_server.endpoint}: the server did not answer within "
                                                r"1 s \(busy with another client"):
            probe(rpc_server.endpoint, timeout_s=1.0)
        assert len(greedy_tokens(client, SpecConfig())) == MAX_TOKENS
    assert probe(rpc_server.endpoint) == 1  # free again once the engine process let go
