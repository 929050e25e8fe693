"""Device and dtype choice: CUDA (also ROCm, whose torch build answers to torch.cuda),
Metal (MPS) or CPU, picked automatically unless the user names one."""

from __future__ import annotations

from typing import Optional

from ..types import SpecDeskError

DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "float16", "bfloat16")


def require_torch(purpose: str = "the PyTorch engine"):
    """Import torch, or say how to install it (torch is the optional `torch` extra)."""
    try:
        import torch
    except ImportError as e:
        raise SpecDeskError(f"{purpose} needs PyTorch: pip install 'specdesk[torch]'") from e
    return torch


def _mps_available(torch) -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def choose_device(requested: str = "auto") -> str:
    torch = require_torch()
    if requested not in DEVICES:
        raise SpecDeskError(f"unknown device {requested!r}: choose one of {', '.join(DEVICES)}")
    if requested == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if _mps_available(torch) else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise SpecDeskError("device cuda was requested but torch sees no CUDA or ROCm GPU "
                            f"(torch {torch.__version__}): install a CUDA/ROCm build of torch or use --device cpu")
    if requested == "mps" and not _mps_available(torch):
        raise SpecDeskError("device mps was requested but Metal is not available here: use --device cpu")
    return requested


def device_name(device: str) -> str:
    """What the device is, in words, for reports."""
    torch = require_torch()
    if device == "cuda":
        backend = "ROCm" if getattr(torch.version, "hip", None) else "CUDA"
        return f"{backend} {torch.cuda.get_device_name(0)}"
    return {"mps": "Apple Metal (MPS)", "cpu": "CPU"}.get(device, device)


def choose_dtype(device: str, requested: Optional[str] = "auto"):
    """float32 on CPU (exact, and CPU half kernels are slow); bfloat16 where supported, else float16."""
    torch = require_torch()
    requested = requested or "auto"
    if requested not in DTYPES:
        raise SpecDeskError(f"unknown dtype {requested!r}: choose one of {', '.join(DTYPES)}")
    if requested != "auto":
        return getattr(torch, requested)
    if device == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device == "mps":
        return torch.float16
    return torch.float32


def torch_devices() -> list[dict]:
    """The devices this PyTorch can run on, with memory where torch reports it; [] without torch."""
    try:
        import torch
    except ImportError:
        return []
    import os

    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 0
    devices = [{"name": "cpu", "description": f"CPU, torch {torch.__version__}", "kind": "cpu",
                "total_bytes": int(pages)}]
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(index)
            devices.append({"name": f"cuda:{index}", "description": device_name("cuda") if index == 0
                            else torch.cuda.get_device_name(index), "kind": "gpu",
                            "free_bytes": int(free), "total_bytes": int(total)})
    if _mps_available(torch):
        devices.append({"name": "mps", "description": "Apple Metal (MPS)", "kind": "gpu"})
    return devices
