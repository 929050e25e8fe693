"""The training steps' arithmetic: float32, or bfloat16 autocast (mixed precision) where it is faster.

The weights, their gradients and AdamW's moments stay float32 either way; under autocast the
matrix products of a training step's forward run in bfloat16 and its losses (log-softmax, KL)
in float32, as mixed-precision training does on GPUs. A step is dominated by the products with
the target's output head (rows x hidden x vocabulary, three times for an unrolled head), so it
pays wherever bfloat16 products are fast: CUDA GPUs that support bfloat16, and CPUs with AMX or
AVX-512 BF16 (oneDNN), where a product of training size runs several times faster than in
float32. On other CPUs bfloat16 is emulated and slower, so `auto` times one product of
training size both ways and keeps float32 unless bfloat16 is at least twice as fast.

Held-out evaluations run in the same precision as the steps (the trainer's comparison with a
reference head too): a product's rounding can flip a near-tie argmax, so figures taken in
bfloat16 and in float32 differ by a little, and two heads are compared in one precision.
"""

from __future__ import annotations

import contextlib
import time
from typing import Optional

import torch

PRECISIONS = ("auto", "float32", "bfloat16")
MIN_GAIN = 2.0  # bfloat16 products at least this much faster than float32 ones, or float32

_timed: dict[tuple[str, int], float] = {}  # (device, threads) -> float32 time / bfloat16 time


def _product_gain(device: str) -> float:
    """How many times faster a training-sized product runs under bfloat16 autocast than in float32."""
    key = (device, torch.get_num_threads())
    if key not in _timed:
        generator = torch.Generator().manual_seed(0)
        # rows x hidden x vocabulary, as the products with an output head are
        x = torch.randn(1024, 768, generator=generator).to(device)
        w = torch.randn(4096, 768, generator=generator).to(device)

        def seconds(autocast: bool) -> float:
            context = torch.autocast(device, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
            best = float("inf")
            with torch.no_grad(), context:
                for _ in range(5):
                    started = time.perf_counter()
                    torch.nn.functional.linear(x, w).sum().item()  # .item(): waits for a GPU as well
                    best = min(best, time.perf_counter() - started)
            return best

        seconds(True), seconds(False)  # the first calls set kernels up
        _timed[key] = seconds(False) / max(seconds(True), 1e-9)
    return _timed[key]


def choose_precision(device: str, requested: str = "auto") -> Optional[torch.dtype]:
    """The autocast dtype for training steps on `device` ("cpu", "cuda", "mps"), or None for float32."""
    if requested not in PRECISIONS:
        raise ValueError(f"unknown precision {requested!r}: choose one of {', '.join(PRECISIONS)}")
    if requested == "float32":
        return None
    if requested == "bfloat16":
        return torch.bfloat16
    if device == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    if device == "cpu":
        return torch.bfloat16 if _product_gain("cpu") >= MIN_GAIN else None
    return None  # Metal: float32 (its bfloat16 support depends on the OS version)


def precision_name(dtype: Optional[torch.dtype]) -> str:
    return "float32" if dtype is None else f"{str(dtype).removeprefix('torch.')} autocast"


def autocast(device: str, dtype: Optional[torch.dtype]):
    """The context a training step's forward runs in."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device, dtype=dtype)
