"""Linears on the CPU that read their weights once for a verification's k + 1 rows.

A decode step on a CPU is bound by reading the weights: one row costs what reading every
weight matrix once costs. Speculation pays because verifying k + 1 drafted rows should cost
about the same. MKL's small-batch sgemm (what F.linear calls for float32 on x86) does not
keep that promise: it reads a weight matrix once per three rows, so four rows cost twice
what three do (the demo target on 2 cores: 14.0 ms for 3 rows, 19.6 ms for 4). oneDNN's
matmul on a weight reordered once into its own blocked layout reads it once for up to about
eight rows, but costs a fifth more than MKL for a single row. In the model the gain is smaller
than the cliff (the demo target, median of 30 passes: 4 rows 20.2 ms with the copy against
22.2 ms without, 8 rows 23.2 against 26.9 ms; 3 rows 15.5 ms either way).

So on a CPU, in float32, each linear keeps its weight for F.linear (one to three rows: decode,
k = 2 verification) and also holds the reordered copy for four rows and more (longer
verifications, DFlash blocks, prompts). The copy doubles the linears' memory, so it is made
only where the linears take at most a quarter of the free memory (and 4 GiB), and only
where a timing of the two kernels at four rows, once per process, finds the copy faster: MKL
and oneDNN differ by CPU. SPECDESK_PACKED_LINEARS=0 turns it off, =1 skips the timing.
Both kernels compute the same float32 product (they differ in summation order only).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..memory import ram_available

PACKED_MIN_ROWS = 4  # MKL reads the weights once for up to 3 rows
MAX_PACKED_BYTES = 4 << 30
CALIBRATION_BYTES = 256 << 20  # at most this much of the weights is timed
ENV = "SPECDESK_PACKED_LINEARS"

_decisions: dict[int, bool] = {}  # thread count -> whether the reordered copy pays on this CPU


def reorder(weight: torch.Tensor) -> Optional[torch.Tensor]:
    """oneDNN's blocked copy of a (out, in) float32 weight, or None where this torch lacks it."""
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
    except (AttributeError, RuntimeError):
        return None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
           packed: Optional[torch.Tensor]) -> torch.Tensor:
    """x @ weight.T + bias, through the reordered copy for PACKED_MIN_ROWS rows or more
    (inference only: oneDNN's op has no gradient). Under autocast (a training step's bfloat16
    evaluation) F.linear runs, so the product has the precision autocast gives every other
    linear; oneDNN's op is not autocast's and refuses a bfloat16 input against the float32 copy."""
    if (packed is not None and x.dtype == packed.dtype and x.numel() >= PACKED_MIN_ROWS * x.shape[-1]
            and not torch.is_grad_enabled() and not torch.is_autocast_enabled(x.device.type)):
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")
    return F.linear(x, weight, bias)


class PackedLinear(nn.Module):
    """An nn.Linear for inference with the reordered copy beside its weight. Its state dict is
    the Linear's (the copy is not a buffer)."""

    def __init__(self, source: nn.Linear, packed: torch.Tensor):
        super().__init__()
        self.in_features, self.out_features = source.in_features, source.out_features
        self.weight = source.weight
        self.bias = source.bias
        self.packed = packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.packed)


def _linears(module: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    return [(parent, name, child) for parent in module.modules()
            for name, child in parent.named_children() if type(child) is nn.Linear]


def _time_rows(weights: list[torch.Tensor], packed: list[torch.Tensor], rows: int) -> tuple[float, float]:
    """Median seconds for one pass over `weights` at `rows` rows: (F.linear, reordered copy)."""
    inputs = [torch.randn(rows, w.shape[1], dtype=w.dtype) for w in weights]
    plain, blocked = [], []
    for _ in range(5):  # alternated, so both see the same machine
        for times, run in ((plain, lambda i: F.linear(inputs[i], weights[i])),
                           (blocked, lambda i: torch.ops.mkldnn._linear_pointwise(inputs[i], packed[i], None,
                                                                                  "none", [], ""))):
            started = time.perf_counter()
            for i in range(len(weights)):
                run(i)
            times.append(time.perf_counter() - started)
    return statistics.median(plain), statistics.median(blocked)


def _copy_pays(weights: list[torch.Tensor]) -> bool:
    """Whether the reordered copy is faster at PACKED_MIN_ROWS rows on this CPU (asked once per
    thread count; a tenth faster at least, so timing noise does not decide)."""
    threads = torch.get_num_threads()
    if threads not in _decisions:
        sample, total = [], 0
        for w in weights:
            if total + w.numel() * w.element_size() > CALIBRATION_BYTES and sample:
                break
            sample.append(w)
            total += w.numel() * w.element_size()
        packed = [reorder(w) for w in sample]
        if any(p is None for p in packed):
            _decisions[threads] = False
        else:
            with torch.inference_mode():
                plain, blocked = _time_rows(sample, packed, PACKED_MIN_ROWS)
            _decisions[threads] = blocked < 0.9 * plain
    return _decisions[threads]


def pack_linears(module: nn.Module) -> bool:
    """Give `module`'s linears the reordered copy where it pays (CPU, float32, fits in memory);
    returns whether it did. Tied output heads are the model's business (Transformer.logits)."""
    setting = os.environ.get(ENV, "")
    found = _linears(module)
    if setting == "0" or not found or not torch.backends.mkldnn.is_available():
        return False
    weights = [linear.weight for _, _, linear in found]
    if any(w.device.type != "cpu" or w.dtype != torch.float32 for w in weights):
        return False
    size = sum(w.numel() * w.element_size() for w in weights)
    if size > MAX_PACKED_BYTES or size > ram_available() // 4:  # the copy must leave the machine room
        return False
    if setting != "1" and not _copy_pays(weights):
        return False
    for parent, name, source in found:
        packed = reorder(source.weight)
        if packed is None:
            return False
        setattr(parent, name, PackedLinear(source, packed))
    return True
