"""How far a model's logits move between a batched pass and single-token passes: the arithmetic
noise a greedy divergence is judged against.

A verification pass computes the logits of k + 1 positions in one batch; plain decoding computes
each in a pass of its own. The two sum in different orders, and quantized kernels go further:
llama.cpp quantizes a batch's activations for its matrix products (Q8 blocks for Q4/Q8 weights)
in a layout that a one-row product does not use, so the same position's logits differ by up to
about a logit on real Q4 models (SmolLM2-135M Q4_1: 0.7), against a few 1e-4 in F16/F32. Where
the target's top two tokens are closer than that, the baseline and a speculative run may pick
different ones with both engines correct: the arithmetic, not a bug.

`measure_logit_noise` measures it on the model itself: on a few spans of a token sequence, the
logits of one batched pass against those of single-token passes over the same positions, and
returns the largest change of a gap between two of the leading tokens (the quantity a greedy
choice depends on).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

ROWS = 5  # a span's length: a verification at k = 4
SPANS = 3  # spans measured, spread over the sequence
LEADING = 8  # the gaps measured are among this many leading tokens of each position


def _rows(output) -> np.ndarray:
    """A pass's logits as a (rows, vocabulary) float array, whichever engine made them."""
    logits = getattr(output, "logits", output)
    if hasattr(logits, "detach"):
        logits = logits.detach().float().cpu().numpy()
    return np.asarray(logits, dtype=np.float64)


def gap_change(batched: np.ndarray, single: np.ndarray, leading: int = LEADING) -> float:
    """The most the gap between two of the `leading` tokens (by the single pass) moved between
    the passes, over the rows: max over rows of (max - min) of their differences."""
    worst = 0.0
    for b, s in zip(batched, single):
        top = np.argpartition(-s, min(leading, s.size - 1))[:leading]
        moved = b[top] - s[top]
        worst = max(worst, float(moved.max() - moved.min()))
    return worst


def measure_logit_noise(engine, tokens: Sequence[int], rows: int = ROWS, spans: int = SPANS) -> float:
    """The batched-against-single noise of `engine`'s target on `tokens` (a prompt and what the
    model wrote after it; at least rows + 2 tokens), through the engine's own passes (prefill,
    target_pass, its context's rollback) as generation runs them."""
    tokens = list(tokens)
    if len(tokens) < rows + 2:
        raise ValueError(f"the noise needs at least {rows + 2} tokens, got {len(tokens)}")
    last_start = len(tokens) - rows
    starts = sorted({int(x) for x in np.linspace(1, last_start, num=spans)})
    ctx = engine.context
    worst = 0.0
    for start in starts:
        engine.prefill(tokens[:start + 1], None)  # the context holds tokens[:start]
        n_past = ctx.n_past
        span = tokens[start:start + rows]
        batched = _rows(engine.target_pass(span, None))
        ctx.rollback(n_past)
        single = np.stack([_rows(engine.target_pass([token], None))[0] for token in span])
        ctx.rollback(n_past)
        worst = max(worst, gap_change(batched, single))
    return worst
