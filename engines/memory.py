"""Memory available to a model on this machine: free RAM (per OS), and free VRAM where torch
sees a CUDA device. Kept in engines/ so an engine can refuse a context whose KV cache cannot
fit before it asks llama.cpp or torch to allocate it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class MemoryInfo:
    ram_available: int
    ram_total: int
    vram_free: Optional[int] = None  # None: no CUDA device visible to torch
    vram_total: Optional[int] = None


def _meminfo_linux() -> tuple[int, int]:
    values = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            values[key] = int(rest.split()[0]) * 1024
    return values.get("MemAvailable", values.get("MemFree", 0)), values.get("MemTotal", 0)


def _meminfo_macos() -> tuple[int, int]:
    total = int(subprocess.run(["sysctl", "-n", "hw.memsize"], capture_output=True, text=True, check=True).stdout)
    out = subprocess.run(["vm_stat"], capture_output=True, text=True, check=True).stdout
    page = int(re.search(r"page size of (\d+)", out).group(1))
    pages = {m.group(1): int(m.group(2)) for m in re.finditer(r"Pages (\w[\w ]*?):\s+(\d+)", out)}
    free = sum(pages.get(k, 0) for k in ("free", "inactive", "speculative", "purgeable"))
    return free * page, total


def _meminfo_windows() -> tuple[int, int]:
    import ctypes

    class MemoryStatus(ctypes.Structure):
        _fields_ = [("dwLength", ctypes.c_ulong), ("dwMemoryLoad", ctypes.c_ulong),
                    ("ullTotalPhys", ctypes.c_ulonglong), ("ullAvailPhys", ctypes.c_ulonglong),
                    ("ullTotalPageFile", ctypes.c_ulonglong), ("ullAvailPageFile", ctypes.c_ulonglong),
                    ("ullTotalVirtual", ctypes.c_ulonglong), ("ullAvailVirtual", ctypes.c_ulonglong),
                    ("ullAvailExtendedVirtual", ctypes.c_ulonglong)]

    status = MemoryStatus()
    status.dwLength = ctypes.sizeof(MemoryStatus)
    ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status))
    return int(status.ullAvailPhys), int(status.ullTotalPhys)


def _vram() -> tuple[Optional[int], Optional[int]]:
    """Free and total memory of CUDA device 0, only where torch is installed and sees one."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None, None
    try:
        import torch

        if not torch.cuda.is_available():
            return None, None
        free, total = torch.cuda.mem_get_info(0)
        return int(free), int(total)
    except Exception:  # noqa: BLE001 - a broken driver means no usable VRAM, not a crash
        return None, None


def available_memory() -> MemoryInfo:
    try:
        if sys.platform.startswith("linux"):
            available, total = _meminfo_linux()
        elif sys.platform == "darwin":
            available, total = _meminfo_macos()
        elif sys.platform.startswith("win"):
            available, total = _meminfo_windows()
        else:
            raise OSError(sys.platform)
    except (OSError, ValueError, AttributeError, subprocess.SubprocessError):
        page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        available = os.sysconf("SC_AVPHYS_PAGES") * page if hasattr(os, "sysconf") else 0
        total = os.sysconf("SC_PHYS_PAGES") * page if hasattr(os, "sysconf") else 0
    vram_free, vram_total = _vram()
    return MemoryInfo(available, total, vram_free, vram_total)


def ram_available() -> int:
    """Free RAM in bytes, without touching torch (0 when the OS does not say)."""
    try:
        if sys.platform.startswith("linux"):
            return _meminfo_linux()[0]
        if sys.platform == "darwin":
            return _meminfo_macos()[0]
        if sys.platform.startswith("win"):
            return _meminfo_windows()[0]
    except (OSError, ValueError, AttributeError, subprocess.SubprocessError):
        pass
    if hasattr(os, "sysconf"):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return 0
