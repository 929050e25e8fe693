"""Where a GGUF target and its draft sit, as the terminal and the app ask for it: the placement
options of compare, chat and serve (llama.cpp's -ngl / -dev / -ngld / -devd / --rpc), checked
before an engine process starts, and the device list of `specdesk devices`.

Values are checked here in Python, so a bad one is one line and exit status 2: a negative
layer count, an RPC address that does not answer (ggml aborts the process that asks such a
server anything), a device that is not there. What needs ggml's device list with RPC servers
added runs in a child process: a server that dies between the check and the question aborts
that child, not the CLI or the app.
"""

from __future__ import annotations

import argparse
import multiprocessing
from typing import Optional, Sequence

from specdesk.engines.types import SpecDeskError

PLACEMENT_OPTIONS = ("gpu_layers", "draft_device", "draft_gpu_layers", "rpc", "draft_weights")


def add_placement_options(parser: argparse.ArgumentParser) -> None:
    """--gpu-layers, --draft-gpu-layers, --draft-device, --draft-weights, --rpc (--device is
    add_model_options')."""
    parser.add_argument("--gpu-layers", default="auto", metavar="N",
                        help="GGUF target: layers on --device: auto (default: every layer that fits the device's "
                             "free memory with its KV cache), all, or a number; 0 keeps it on the CPU")
    parser.add_argument("--draft-device", default="auto", metavar="DEVICE",
                        help="GGUF draft model or drafter: its device (auto, CPU, or a name `specdesk devices` lists)")
    parser.add_argument("--draft-gpu-layers", default="auto", metavar="N",
                        help="GGUF draft model or drafter: layers on --draft-device (auto, all, a number, 0)")
    parser.add_argument("--draft-weights", default="q8", metavar="{q8,file}",
                        help="GGUF draft model stored in F16/BF16/F32 and run on the CPU: from a Q8_0 copy made once in "
                             "the cache (q8, the default: half the bytes a draft pass reads) or from its own file")
    add_rpc_option(parser)


def add_rpc_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rpc", default="", metavar="HOST:PORT[,HOST:PORT]",
                        help="llama.cpp RPC servers whose devices GGUF layers can go to (llama.cpp's rpc-server, "
                             "on this or another machine); they are then named like any device")


def placement_options(args, engine_kind: str = "llama") -> dict:
    """HostSpec's placement fields from parsed options, checked: one line for a bad value."""
    from specdesk.engines.llama.draft_copy import DRAFT_WEIGHTS
    from specdesk.engines.llama.placement import parse_gpu_layers
    from specdesk.engines.llama.rpc import parse_endpoints, probe

    gpu_layers = parse_gpu_layers(getattr(args, "gpu_layers", "auto"), "--gpu-layers")
    draft_gpu_layers = parse_gpu_layers(getattr(args, "draft_gpu_layers", "auto"), "--draft-gpu-layers")
    rpc = tuple(parse_endpoints(getattr(args, "rpc", "") or ""))
    draft_weights = getattr(args, "draft_weights", "q8") or "q8"
    if draft_weights not in DRAFT_WEIGHTS:
        raise SpecDeskError(f"--draft-weights {draft_weights!r} is not one of {', '.join(DRAFT_WEIGHTS)}")
    if engine_kind != "llama":
        asked = [name for name, value in (("--gpu-layers", gpu_layers), ("--draft-gpu-layers", draft_gpu_layers))
                 if value != "auto"] + (["--rpc"] if rpc else []) + (["--draft-weights"] if draft_weights != "q8" else [])
        if asked:
            raise SpecDeskError(f"{', '.join(asked)}: placement applies to GGUF models on llama.cpp; "
                                "the PyTorch engine takes --device")
        return {}
    for endpoint in rpc:
        probe(endpoint)
    return {"gpu_layers": str(gpu_layers), "draft_device": getattr(args, "draft_device", "auto") or "auto",
            "draft_gpu_layers": str(draft_gpu_layers), "rpc": rpc, "draft_weights": draft_weights}


# --- the device list -------------------------------------------------------------------
def _devices_child(conn, rpc: Sequence[str]) -> None:
    try:
        from specdesk.engines.llama.devices import llama_build, llama_devices
        from specdesk.engines.llama.rpc import add_servers

        add_servers(list(rpc))
        conn.send(("ok", {**llama_build(), "devices": [d.as_dict() for d in llama_devices()]}))
    except SpecDeskError as e:
        conn.send(("error", str(e)))


def llama_device_report(rpc: Sequence[str] = ()) -> dict:
    """llama.cpp's build and devices as `specdesk devices` prints them; with RPC servers, asked
    in a child process (ggml aborts a process whose RPC server stops answering)."""
    if not rpc:
        from specdesk.engines.llama.devices import llama_build, llama_devices

        return {**llama_build(), "devices": [d.as_dict() for d in llama_devices()]}
    from specdesk.engines.llama.rpc import probe

    for endpoint in rpc:
        probe(endpoint)
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe(duplex=False)
    process = context.Process(target=_devices_child, args=(child, list(rpc)), daemon=True)
    process.start()
    child.close()
    try:
        if not parent.poll(60):
            raise SpecDeskError(f"--rpc {','.join(rpc)}: listing the devices took over 60 s: check the servers")
        status, value = parent.recv()
    except EOFError:
        process.join(5)
        raise SpecDeskError(f"--rpc {','.join(rpc)}: llama.cpp ended while asking the servers for their devices "
                            f"(exit status {process.exitcode}): check that each server runs") from None
    finally:
        if process.is_alive():
            process.kill()
        process.join(5)
    if status != "ok":
        raise SpecDeskError(value)
    return value


def describe_placement(report: Optional[dict]) -> str:
    """One line for the status bar: "target 9/9 layers on RPC0 (127.0.0.1:50052) · draft CPU"."""
    if not report:
        return ""
    parts = []
    for role, place in report.items():
        name = "target" if role == "target" else "draft"
        if place.get("device", "CPU") == "CPU" or not place.get("n_gpu_layers"):
            where = "CPU"
        else:
            description = place.get("description") or ""
            device = place["device"] if description in ("", place["device"]) else f"{place['device']} ({description})"
            where = f"{place['n_gpu_layers']}/{place['n_layers']} layers on {device}"
        parts.append(f"{name} {where}")
    return " · ".join(parts)


def pass_cost_ratio(baseline, point) -> Optional[float]:
    """t(1 + drafted)/t(1) from a k sweep (RunStats of the baseline and of one k): a verified
    pass's mean time over a one-token pass's. About 2x at k = 4 on two CPU cores, a few
    percent more on a GPU: why a larger k pays on one placement and not on another."""
    if not baseline.passes or not point.passes or baseline.verify_s <= 0:
        return None
    return (point.verify_s / point.passes) / (baseline.verify_s / baseline.passes)


def placement_label(report: Optional[dict]) -> str:
    """The placement a measurement belongs to (app/runtime/measurements.py): "CPU", or the target's
    device and layers, e.g. "RPC0[127.0.0.1:50052] 9/9". Records written before placements
    existed count as "CPU"."""
    target = (report or {}).get("target") or {}
    if target.get("device", "CPU") == "CPU" or not target.get("n_gpu_layers"):
        return "CPU"
    return f"{target['device']}[{target.get('description', '')}] {target['n_gpu_layers']}/{target['n_layers']}"


def engine_placement_label(engine) -> str:
    """placement_label of a loaded engine (an EngineClient, or an in-process LlamaEngine)."""
    report = engine.placement_report() if hasattr(engine, "placement_report") else None
    return placement_label(report)
