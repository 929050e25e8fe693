"""What every drafter of both engines shares: how sure a draft row is, and when to stop.

Native drafters (MTP, DFlash, EAGLE-3) draft the top-1 token of each row, as llama.cpp's
common/speculative.cpp does: q is then one-hot, so verification stays exact at any
temperature, and `draft_p_min` stops a draft at the first row whose top token is less
likely than that (its probability read after a top-10 cut, as llama.cpp's draft sampler
reports it).
"""

from __future__ import annotations

import numpy as np

DRAFT_TOP_K = 10  # the top-k cut of llama.cpp's draft sampler


def top1_prob(logits: np.ndarray, top_k: int = DRAFT_TOP_K) -> float:
    """The top token's probability after a top-k cut."""
    top = np.partition(logits, -top_k)[-top_k:] if logits.shape[0] > top_k else logits
    top = top - top.max()
    return float(1.0 / np.exp(top).sum())


def below_p_min(logits: np.ndarray, p_min: float) -> bool:
    """Whether a draft stops at this row (never when p_min is 0)."""
    return p_min > 0 and top1_prob(logits) < p_min


def confident_rows(rows: np.ndarray, p_min: float) -> int:
    """How many leading rows (n, V) of draft logits to keep: up to the first below p_min."""
    return next((i for i, row in enumerate(rows) if below_p_min(row, p_min)), rows.shape[0])
