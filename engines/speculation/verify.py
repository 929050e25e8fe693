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

# The per-row fast paths (`_row_probs`). Top-k: the logits are split into _TOP_K_GROUPS-strided
# groups; the k-th largest group maximum is at most the k-th largest logit, so only logits at or
# above it are partitioned (a tie at the k-th value goes to np.argpartition, as before).
_TOP_K_GROUPS = 64
# Top-p: a token whose scaled logit is more than log(V) + _TAIL_SPAN below the maximum has
# probability below e^-_TAIL_SPAN / V, so all of them together change the normaliser by less
# than e^-_TAIL_SPAN (7e-13): the nucleus is computed from the rest, and kept only when it is
# the nucleus of the full row whatever that error (else the full row is computed).
_TAIL_SPAN = 28.0
_TAIL_MARGIN = 1e-11  # how far the kept mass and probabilities must clear the top-p boundary
_SPARSE_BELOW = 8  # the tail cut is used when fewer than V / _SPARSE_BELOW tokens are near the top
_SPARSE_SAMPLE_ABOVE = 8192  # `sample` skips the zeros of a larger row when a probe finds it mostly zero
_SPARSE_PROBE = 64  # the probe: every 64th entry


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
    x = _checked(logits)
    if sampling.greedy or not _truncates(sampling, x.shape[-1]):
        return _reference_probs(x, sampling)
    rows = x.reshape(-1, x.shape[-1])  # (n, V)
    probs = np.zeros(rows.shape, dtype=np.float64)
    for out, row in zip(probs, rows):
        transformed = _row_probs(row, sampling)
        out[transformed.ids] = transformed.probs
    return probs.reshape(x.shape)


def _checked(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits)
    if x.ndim not in (1, 2) or x.shape[-1] == 0:
        raise ValueError(f"logits must be (V,) or (n, V) with V > 0, got shape {x.shape}")
    return x


def _truncates(sampling: SamplingParams, vocab: int) -> bool:
    """Whether top-k or top-p leaves a row sparse."""
    return 0 < sampling.top_k < vocab or sampling.top_p < 1.0


@dataclass(frozen=True)
class _Row:
    """One transformed row over a vocabulary of `vocab`: probs at ids (ascending token ids), 0
    elsewhere; ids None: probs is the whole (V,) row."""

    ids: Optional[np.ndarray]
    probs: np.ndarray
    vocab: int

    def index(self, token: int) -> Optional[int]:
        """Where token's probability sits in probs (None: it is 0)."""
        if not 0 <= token < self.vocab:
            return None
        if self.ids is None:
            return token
        at = int(np.searchsorted(self.ids, token))
        return at if at < self.ids.size and self.ids[at] == token else None

    def q_at(self, q_row: np.ndarray) -> np.ndarray:
        """q at this row's positions (q cut or padded with 0 to the vocabulary)."""
        if self.ids is None:
            return _fit_width(q_row, self.vocab)
        inside = self.ids < q_row.size
        return np.where(inside, q_row[np.where(inside, self.ids, 0)], 0.0)

    def with_probs(self, probs: np.ndarray) -> "_Row":
        return _Row(self.ids, probs, self.vocab)


def _row_probs(logits: np.ndarray, sampling: SamplingParams) -> _Row:
    """`sampling_probs` of one (V,) row, sparse when top-k or top-p cut it. Top-k rows and the
    top-p nucleus found from the whole row equal `_reference_probs` bit for bit; a nucleus found
    without the far tail (`_nucleus_near_top`) has the same kept set, probabilities within
    1e-12 relative."""
    vocab = logits.shape[0]
    if sampling.greedy or not _truncates(sampling, vocab):
        return _Row(None, _reference_probs(logits, sampling), vocab)
    if 0 < sampling.top_k < vocab:
        top = _top_k_ids(logits, sampling.top_k)  # ascending ids
        probs = _softmax(logits[top][None, :], sampling.temperature)[0]  # (top_k,)
        if sampling.top_p < 1.0:
            _nucleus_inplace(probs, sampling.top_p)
        kept = probs > 0
        return _Row(top[kept], probs[kept], vocab)
    if vocab <= 2 * _NUCLEUS_SORT_ALL_BELOW:
        return _sparse(_reference_probs(logits, sampling))
    return _nucleus_near_top(logits, sampling) or _nucleus_full(logits, sampling)


def _sparse(probs: np.ndarray) -> _Row:
    ids = np.flatnonzero(probs)
    return _Row(ids, probs[ids], probs.size)


class _Groups:
    """A (V,) row seen as _TOP_K_GROUPS-strided groups (column j of a (_TOP_K_GROUPS, V // that)
    view: ids j, j + V // _TOP_K_GROUPS, ...) plus the few tail ids; one vectorised pass gives
    every group's maximum, and the ids at or above a floor are then read from the groups whose
    maximum reaches it."""

    def __init__(self, logits: np.ndarray):
        self.width = logits.shape[0] // _TOP_K_GROUPS
        self.body = logits[:self.width * _TOP_K_GROUPS].reshape(_TOP_K_GROUPS, self.width)
        self.tail = logits[self.width * _TOP_K_GROUPS:]
        self.maxima = self.body.max(axis=0)  # (width,); NaN where a group holds one

    def has_nan(self) -> bool:
        return bool(np.isnan(self.maxima).any() or np.isnan(self.tail).any())

    def at_least(self, floor) -> np.ndarray:
        """The ids whose logit is >= floor, ascending."""
        columns = np.flatnonzero(self.maxima >= floor)
        rows, at = np.nonzero(self.body[:, columns] >= floor)
        ids = rows * self.width + columns[at]
        if self.tail.size:
            ids = np.concatenate([ids, self.width * _TOP_K_GROUPS + np.flatnonzero(self.tail >= floor)])
        ids.sort()
        return ids


def _top_k_ids(logits: np.ndarray, top_k: int) -> np.ndarray:
    """The ids of the top_k largest logits, ascending: np.argpartition's choice, found among the
    logits at or above the top_k-th largest group maximum when that set is unambiguous."""
    vocab = logits.shape[0]
    if top_k * 8 <= vocab // _TOP_K_GROUPS:
        groups = _Groups(logits)
        if not groups.has_nan():
            floor = np.partition(groups.maxima, groups.width - top_k)[groups.width - top_k]  # top_k logits are >= it
            candidates = groups.at_least(floor)  # ascending ids
            values = logits[candidates]
            kth = np.partition(values, values.size - top_k)[values.size - top_k]
            top = candidates[values >= kth]
            if top.size == top_k:  # else a tie at the k-th value: let argpartition pick, as before
                return top
    top = np.argpartition(logits, vocab - top_k)[vocab - top_k:]
    top.sort()
    return top


def _nucleus_near_top(logits: np.ndarray, sampling: SamplingParams) -> Optional[_Row]:
    """The top-p nucleus from the tokens within log(V) + _TAIL_SPAN (scaled) of the maximum, or
    None when too many are near it or the kept set is within rounding of another answer."""
    vocab, temperature = logits.shape[0], sampling.temperature
    top = float(logits.max())
    if not np.isfinite(top):
        return None
    span = np.log(vocab) + _TAIL_SPAN
    floor = np.asarray(top - (span + 1.0) * temperature, dtype=logits.dtype)
    if not (top - float(floor)) / temperature >= span + 0.5:  # lost to rounding (a tiny temperature)
        return None
    near = np.flatnonzero(logits >= floor)  # ascending ids; every other token is below e^-span
    if near.size * _SPARSE_BELOW > vocab:
        return None
    scaled = logits[near].astype(np.float64) / temperature
    scaled -= np.float64(logits.dtype.type(top)) / temperature  # the scaled row's maximum, as _softmax subtracts
    np.exp(scaled, out=scaled)
    scaled /= scaled.sum()
    target = sampling.top_p - _TOP_P_SLACK
    floor_p = float(np.exp(-span))  # above any token left out
    if near.size <= _NUCLEUS_SORT_ALL_BELOW:
        # Sort only the tokens >= _NUCLEUS_FAST_THRESHOLD when they reach the mass (few on a peaked row).
        pool = np.flatnonzero(scaled >= _NUCLEUS_FAST_THRESHOLD)
        if not (pool.size and scaled[pool].sum() >= target + _TAIL_MARGIN):
            pool = np.arange(near.size)
        order = pool[np.argsort(-scaled[pool], kind="stable")]  # highest first, lower id on ties
        ranked = scaled[order]
        cumulative = np.cumsum(ranked)
        count = min(int(np.searchsorted(cumulative, target, side="left")) + 1, order.size)
        kept = order[:count]
        mass, smallest = float(cumulative[count - 1]), float(ranked[count - 1])
        if count < order.size:
            largest_other = float(ranked[count])
        else:  # the pool is all kept: the next token is the largest outside it
            rest = np.delete(scaled, pool)
            largest_other = float(rest.max()) if rest.size else 0.0
        largest_other = max(largest_other, floor_p)
    else:
        kept = _nucleus_indices(scaled, sampling.top_p)  # positions into near
        kept_probs = scaled[kept]
        mass, smallest = float(kept_probs.sum()), float(kept_probs.min())
        others = np.delete(scaled, kept)
        largest_other = max(float(others.max()) if others.size else 0.0, floor_p)
    # Leaving the tail out moves every probability by < 1e-12 relative: the kept set must clear
    # the boundary by more, else the full row decides.
    if not (mass >= target + _TAIL_MARGIN and mass - smallest < target - _TAIL_MARGIN
            and smallest > largest_other * (1.0 + _TAIL_MARGIN)):
        return None
    kept.sort()
    return _Row(near[kept], scaled[kept] / mass, vocab)


def _nucleus_full(logits: np.ndarray, sampling: SamplingParams) -> _Row:
    """`_reference_probs` of one top-p row (no top-k) as a sparse row, bit for bit, dividing by
    the normaliser only the tokens the nucleus search reads."""
    scaled = logits[None, :].astype(np.float64) / sampling.temperature  # (1, V), as _softmax
    scaled -= scaled.max(axis=1, keepdims=True)
    np.exp(scaled, out=scaled)
    total = scaled.sum(axis=1, keepdims=True)
    weights, total = scaled[0], total[0]
    target = sampling.top_p - _TOP_P_SLACK
    # {probs >= threshold} without dividing the row: weight / total is monotone in weight.
    near = np.flatnonzero(weights >= _NUCLEUS_FAST_THRESHOLD * total[0] * (1.0 - 1e-9))
    near_probs = weights[near] / total
    selected = near_probs >= _NUCLEUS_FAST_THRESHOLD
    candidates, candidate_probs = near[selected], near_probs[selected]
    if candidates.size and candidate_probs.sum() >= target:
        kept = candidates[_top_mass_count(candidate_probs, target, 0.0)]
        probs = weights[kept] / total
    else:
        weights /= total
        kept = _nucleus_indices_bucketed(weights, target)
        probs = weights[kept]
    probs = probs / probs.sum()
    order = np.argsort(kept)
    return _Row(kept[order], probs[order], logits.shape[0])


def _reference_probs(logits: np.ndarray, sampling: SamplingParams) -> np.ndarray:
    """`sampling_probs` computed over the whole vocabulary, row by row as written (same
    arguments, same result): the definition the fast paths of `_row_probs` are held to
    (tests/test_verify_fast.py), and their fallback."""
    x = _checked(logits)
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
    probs = np.asarray(probs)
    if probs.size > _SPARSE_SAMPLE_ABOVE and np.count_nonzero(probs[::_SPARSE_PROBE]) * 4 < probs[::_SPARSE_PROBE].size:
        # Mostly zeros (top-k / top-p): the cumulative sum skips them; adding 0 changes no partial
        # sum, so the draw picks the same token.
        with_mass = np.flatnonzero(probs)
        if with_mass.size:
            return int(with_mass[sample(probs[with_mass], rng)])
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
    draft rejected early costs one row. Rows are `_Row`s: after top-k or top-p only the kept
    tokens, so a token's probability, the residual (zero wherever p is), its mass and a draw
    cost the nucleus, not the vocabulary; a draw picks the token the dense row would."""

    def __init__(self, logits: np.ndarray, sampling: SamplingParams):
        self._logits, self._sampling = logits, sampling  # (k+1, V)
        self._rows: dict[int, _Row] = {}

    def row(self, position: int) -> _Row:
        if position not in self._rows:
            self._rows[position] = _row_probs(self._logits[position], self._sampling)
        return self._rows[position]

    def token_prob(self, position: int, token: int) -> float:
        p = self.row(position)
        at = p.index(token)
        return p.probs[at] if at is not None else 0.0

    def residual(self, position: int, token: int, q_row: Optional[np.ndarray]) -> _Row:
        p = self.row(position)
        if q_row is None:
            residual = p.probs.copy()
            at = p.index(token)
            if at is not None:
                residual[at] = 0.0
        else:
            residual = p.probs - p.q_at(q_row)
            np.maximum(residual, 0.0, out=residual)
        return p.with_probs(residual)

    def mass(self, row: _Row) -> float:
        return float(row.probs.sum())

    def sample(self, row: _Row, rng: np.random.Generator) -> int:
        index = sample(row.probs, rng)
        return index if row.ids is None else int(row.ids[index])


def _fit_width(q_row: np.ndarray, vocab: int) -> np.ndarray:
    """q restricted to the target's vocab: cut extra ids, pad missing ones with 0."""
    if q_row.size == vocab:
        return q_row
    if q_row.size > vocab:
        return q_row[:vocab]
    return np.concatenate([q_row, np.zeros(vocab - q_row.size)])
