"""Verification of a draft against the target's logits: greedy prefix match, or speculative
sampling (Leviathan et al. 2023; Chen et al. 2023), which is lossless for temperature > 0.

Pure functions on numpy arrays. `sampling_probs` is shared by the draft side (to sample draft
tokens and report q) and the verify side (p), so both apply exactly the same transform.
`accept_walk` is the one acceptance loop of speculative sampling: `verify` runs it over rows
on the host, engines/torch/verify.py over rows on the device (`TargetRows`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol, Sequence

import numpy as np

from ..types import SamplingParams

# Nucleus search on a large row: bucket probabilities by the top bits of their float64 pattern
# (for non-negative floats, integer order is float order), find the bucket where the mass
# from the top crosses top_p, and sort only that bucket. Exact, O(V), no full sort.
_NUCLEUS_SORT_ALL_BELOW = 4096  # rows this small are simply sorted
_NUCLEUS_FAST_THRESHOLD = 1e-3  # first try {p >= 1e-3} (at most 1000 tokens): enough for peaked rows
_BUCKET_SHIFT = 46  # keep exponent + 6 mantissa bits: 64 buckets per octave
_BUCKET_FLOOR = np.array(2.0**-40).view(np.int64) >> _BUCKET_SHIFT  # all p < 2^-40 share bucket 0
# Rounding slack for "mass >= top_p", so float error never adds one more token.
_TOP_P_SLACK = 1e-9
# Below this residual mass a rejection is float noise (p == q); sample from p instead.
_RESIDUAL_EPS = 1e-12


@dataclass(frozen=True)
class VerifyResult:
    accepted: int  # draft tokens accepted, 0..k
    next_token: int  # the target's own token committed after them (correction or bonus)


def sampling_probs(logits: np.ndarray, sampling: SamplingParams) -> np.ndarray:
    """Probabilities after temperature, then top-k, then top-p, renormalised (float64).

    `logits` is (V,) or (n, V); the result has the same shape. Top-p keeps the smallest set of
    highest-probability tokens whose mass is >= top_p (at least one token); ties are broken
    towards the lower token id. Temperature 0 gives a one-hot argmax (callers use argmax
    directly for greedy; this keeps the function total).
    """
    x = np.asarray(logits)
    if x.ndim not in (1, 2) or x.shape[-1] == 0:
        raise ValueError(f"logits must be (V,) or (n, V) with V > 0, got shape {x.shape}")
    rows = x.reshape(-1, x.shape[-1])  # (n, V)
    n_rows, vocab = rows.shape

    if sampling.greedy:
        probs = np.zeros((n_rows, vocab), dtype=np.float64)
        probs[np.arange(n_rows), np.argmax(rows, axis=1)] = 1.0
        return probs.reshape(x.shape)

    if 0 < sampling.top_k < vocab:
        # Softmax over the k largest logits only; everything else stays exactly 0.
        top_idx = np.argpartition(rows, vocab - sampling.top_k, axis=1)[:, vocab - sampling.top_k:]  # (n, top_k)
        top_idx.sort(axis=1)  # token-id order, so nucleus ties break towards the lower id
        top_probs = _softmax(np.take_along_axis(rows, top_idx, axis=1), sampling.temperature)  # (n, top_k)
        if sampling.top_p < 1.0:
            for row in top_probs:
                _nucleus_inplace(row, sampling.top_p)
        probs = np.zeros((n_rows, vocab), dtype=np.float64)
        np.put_along_axis(probs, top_idx, top_probs, axis=1)
    else:
        probs = _softmax(rows, sampling.temperature)  # (n, V)
        if sampling.top_p < 1.0:
            for row in probs:
                _nucleus_inplace(row, sampling.top_p)
    return probs.reshape(x.shape)


def _softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    scaled = logits.astype(np.float64) / temperature  # (n, m)
    scaled -= scaled.max(axis=1, keepdims=True)
    np.exp(scaled, out=scaled)
    scaled /= scaled.sum(axis=1, keepdims=True)
    return scaled


def _nucleus_inplace(row: np.ndarray, top_p: float) -> None:
    """Zero everything outside the top-p nucleus of one probability row and renormalise."""
    kept = _nucleus_indices(row, top_p)
    kept_probs = row[kept]
    row[:] = 0.0
    row[kept] = kept_probs / kept_probs.sum()


def _nucleus_indices(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Indices of the smallest highest-probability set with mass >= top_p (ties: lower id first)."""
    target = top_p - _TOP_P_SLACK
    if probs.size > _NUCLEUS_SORT_ALL_BELOW:
        candidates = np.flatnonzero(probs >= _NUCLEUS_FAST_THRESHOLD)
        if candidates.size and probs[candidates].sum() >= target:
            return candidates[_top_mass_count(probs[candidates], target, 0.0)]
        return _nucleus_indices_bucketed(probs, target)
    return _top_mass_count(probs, target, 0.0)


def _top_mass_count(probs: np.ndarray, target: float, mass_before: float) -> np.ndarray:
    """Positions (into probs) of the highest entries whose mass, added to mass_before, reaches target."""
    order = np.argsort(-probs, kind="stable")  # highest first, lower position on ties
    cumulative = mass_before + np.cumsum(probs[order])
    keep_count = min(int(np.searchsorted(cumulative, target, side="left")) + 1, order.size)
    return order[:keep_count]


def _nucleus_indices_bucketed(probs: np.ndarray, target: float) -> np.ndarray:
    buckets = np.maximum((probs.view(np.int64) >> _BUCKET_SHIFT) - _BUCKET_FLOOR, 0)  # (V,) monotone in p
    mass_per_bucket = np.bincount(buckets, weights=probs)
    mass_from_top = np.cumsum(mass_per_bucket[::-1])
    crossing = min(int(np.searchsorted(mass_from_top, target, side="left")), mass_from_top.size - 1)
    crossing_bucket = mass_per_bucket.size - 1 - crossing
    mass_above = float(mass_from_top[crossing - 1]) if crossing > 0 else 0.0
    above = np.flatnonzero(buckets > crossing_bucket)
    band = np.flatnonzero(buckets == crossing_bucket)
    return np.concatenate([above, band[_top_mass_count(probs[band], target, mass_above)]])


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token from a (V,) distribution (need not be normalised), with one rng.random() draw."""
    cumulative = np.cumsum(probs, dtype=np.float64)
    total = cumulative[-1]
    if not total > 0:
        raise ValueError("cannot sample from a distribution with no mass")
    index = int(np.searchsorted(cumulative, rng.random() * total, side="right"))
    if index >= cumulative.size:  # u * total rounded up to total: take the last token with mass
        index = int(np.flatnonzero(probs > 0)[-1])
    return index


def verify(
    draft_tokens: Sequence[int],
    draft_probs: Optional[np.ndarray],
    target_logits: np.ndarray,
    sampling: SamplingParams,
    rng: np.random.Generator,
) -> VerifyResult:
    """Accept a prefix of the draft and choose the target's next token.

    target_logits is (k+1, V): row i is the target's distribution at draft position i, row k
    the one after the whole draft. draft_probs is (k, V') as produced by `sampling_probs` on
    the draft side, or None for a one-hot q (n-gram proposers). V' may differ from V (padded
    embedding tables): draft mass on ids >= V is mass on tokens the target never emits.

    Greedy: the longest prefix with draft[i] == argmax(row i) (np.argmax, first max on ties).
    Sampling: accept draft[i] with probability min(1, p_i(x) / q_i(x)); on the first rejection
    sample from norm(max(0, p_i - q_i)); if every token is accepted, sample a bonus from p_k.
    rng draws, in order: one rng.random() per examined draft position, then one for the
    committed token, so a seeded run is reproducible.
    """
    k = len(draft_tokens)
    logits = np.asarray(target_logits)
    if logits.ndim != 2 or logits.shape[0] != k + 1:
        raise ValueError(f"target_logits must be (k+1, V) = ({k + 1}, V) for {k} draft tokens, got {logits.shape}")
    if draft_probs is not None and (np.ndim(draft_probs) != 2 or np.shape(draft_probs)[0] != k):
        raise ValueError(f"draft_probs must be (k, V) = ({k}, V), got {np.shape(draft_probs)}")

    if sampling.greedy:
        target_argmax = np.argmax(logits, axis=1)  # (k+1,)
        accepted = 0
        while accepted < k and int(draft_tokens[accepted]) == int(target_argmax[accepted]):
            accepted += 1
        return VerifyResult(accepted, int(target_argmax[accepted]))
    return accept_walk(draft_tokens, draft_probs, _HostRows(logits, sampling), rng)


class TargetRows(Protocol):
    """The target's k + 1 rows of probabilities after the sampling transform, wherever they
    live: what `accept_walk` reads. A row is whatever `sample` takes (a numpy array, a tensor)."""

    def token_prob(self, position: int, token: int) -> float:
        """p_position(token); 0 for an id outside the target's vocabulary."""

    def residual(self, position: int, token: int, q_row: Optional[np.ndarray]) -> Any:
        """max(0, p_position - q) (q cut or padded to the target's width); with a one-hot q
        (q_row None), p_position without `token`."""

    def row(self, position: int) -> Any: ...

    def mass(self, row: Any) -> float: ...

    def sample(self, row: Any, rng: np.random.Generator) -> int:
        """One token from a row (need not be normalised) with one rng.random() draw."""


def accept_walk(draft_tokens: Sequence[int], draft_probs: Optional[np.ndarray], rows: TargetRows,
                rng: np.random.Generator) -> VerifyResult:
    """Speculative sampling over the target's rows: accept draft[i] with probability
    min(1, p_i(x) / q_i(x)); on the first rejection sample from norm(max(0, p_i - q_i)) (from
    p_i when that has no mass: p == q up to rounding); if every token is accepted, a bonus
    from row k. rng draws: one per examined position, then one for the committed token."""
    k = len(draft_tokens)
    for position in range(k):
        token = int(draft_tokens[position])
        p_token = rows.token_prob(position, token)
        if draft_probs is None:
            q_row, q_token = None, 1.0
        else:
            q_row = np.asarray(draft_probs[position], dtype=np.float64)
            q_token = q_row[token] if 0 <= token < q_row.size else 0.0
        if rng.random() * q_token < p_token:  # u < p/q without dividing by a zero q
            continue
        residual = rows.residual(position, token, q_row)
        if rows.mass(residual) <= _RESIDUAL_EPS:
            residual = rows.row(position)
        return VerifyResult(position, rows.sample(residual, rng))
    return VerifyResult(k, rows.sample(rows.row(k), rng))


class _HostRows:
    """TargetRows over numpy logits: each row's transform is computed when first read, so a
    draft rejected early costs one row."""

    sample = staticmethod(sample)

    def __init__(self, logits: np.ndarray, sampling: SamplingParams):
        self._logits, self._sampling = logits, sampling  # (k+1, V)
        self._rows: dict[int, np.ndarray] = {}

    def row(self, position: int) -> np.ndarray:
        if position not in self._rows:
            self._rows[position] = sampling_probs(self._logits[position], self._sampling)  # (V,)
        return self._rows[position]

    def token_prob(self, position: int, token: int) -> float:
        p = self.row(position)
        return p[token] if 0 <= token < p.size else 0.0

    def residual(self, position: int, token: int, q_row: Optional[np.ndarray]) -> np.ndarray:
        p = self.row(position)
        vocab = p.size
        if q_row is None:
            residual = p.copy()
            if 0 <= token < vocab:
                residual[token] = 0.0
        else:
            residual = p - _fit_width(q_row, vocab)
            np.maximum(residual, 0.0, out=residual)
        return residual

    def mass(self, row: np.ndarray) -> float:
        return float(row.sum())


def _fit_width(q_row: np.ndarray, vocab: int) -> np.ndarray:
    """q restricted to the target's vocab: cut extra ids, pad missing ones with 0."""
    if q_row.size == vocab:
        return q_row
    if q_row.size > vocab:
        return q_row[:vocab]
    return np.concatenate([q_row, np.zeros(vocab - q_row.size)])
