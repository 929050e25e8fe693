"""The fast paths of the host verifier (engines/speculation/verify.py: `_row_probs`, sparse
`_HostRows`, `sample` skipping zeros) against the reference computation over the whole
vocabulary (`_reference_probs`, dense rows): the same kept set, the same probabilities (bit for
bit on the top-k and full-row paths, within 1e-12 relative when the far tail is left out), and
the same seeded draws and committed tokens."""

from __future__ import annotations

from typing import Optional

import numpy as np
import pytest

from specdesk.engines.speculation import verify as V
from specdesk.engines.types import SamplingParams

SETTINGS = [
    SamplingParams(temperature=0.8, top_p=0.9),
    SamplingParams(temperature=0.8, top_k=40, top_p=0.9),
    SamplingParams(temperature=0.8, top_k=40),
    SamplingParams(temperature=1.3, top_p=0.5),
    SamplingParams(temperature=0.3, top_p=0.99),
    SamplingParams(temperature=1.0, top_k=1),
    SamplingParams(temperature=0.7, top_k=500, top_p=0.95),
]


def logit_rows(seed: int, n: int, vocab: int, scale: float, dtype=np.float32) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((n, vocab)) * scale).astype(dtype)


def dense(row: V._Row) -> np.ndarray:
    if row.ids is None:
        return row.probs
    out = np.zeros(row.vocab)
    out[row.ids] = row.probs
    return out


def assert_same_row(logits: np.ndarray, sampling: SamplingParams) -> np.ndarray:
    reference = V._reference_probs(logits, sampling)
    fast = V._row_probs(logits, sampling)
    assert fast.ids is None or np.all(np.diff(fast.ids) > 0)  # ascending ids
    got = dense(fast)
    np.testing.assert_array_equal(np.flatnonzero(got), np.flatnonzero(reference))  # the same kept set
    np.testing.assert_allclose(got, reference, rtol=1e-11, atol=0.0)
    return got


@pytest.mark.parametrize("sampling", SETTINGS, ids=str)
@pytest.mark.parametrize("vocab, scale", [(256_000, 20.0), (151_936, 20.0), (50_000, 3.0), (32_064, 8.0),
                                          (20_000, 0.05), (9_000, 1.0)])
def test_fast_rows_equal_the_reference(sampling, vocab, scale):
    for row in logit_rows(vocab + int(scale * 10), 3, vocab, scale):
        assert_same_row(row, sampling)


def test_float64_logits_and_masked_tokens():
    rows = logit_rows(4, 3, 60_000, 15.0, np.float64)
    rows[:, ::7] = -np.inf  # masked tokens
    for sampling in SETTINGS:
        for row in rows:
            assert_same_row(row, sampling)


def test_the_top_k_and_full_row_paths_are_bit_exact():
    rows = logit_rows(7, 4, 100_000, 2.0)  # flat rows: the nucleus is large, the full-row path decides
    for row in rows:
        assert V._nucleus_near_top(row, SamplingParams(temperature=0.8, top_p=0.9)) is None
        for sampling in (SamplingParams(temperature=0.8, top_p=0.9), SamplingParams(temperature=0.8, top_k=40),
                         SamplingParams(temperature=0.8, top_k=40, top_p=0.9)):
            np.testing.assert_array_equal(dense(V._row_probs(row, sampling)), V._reference_probs(row, sampling))


def test_the_tail_cut_path_is_taken_on_peaked_rows():
    sampling = SamplingParams(temperature=0.8, top_p=0.9)
    taken = sum(V._nucleus_near_top(row, sampling) is not None for row in logit_rows(8, 10, 256_000, 20.0))
    assert taken >= 8


def test_top_k_ties_at_the_kth_value_are_argpartitions_choice():
    row = logit_rows(9, 1, 200_000, 1.0)[0]
    row[np.random.default_rng(1).choice(row.size, 60, replace=False)] = 10.0  # 60 tied maxima, top_k 40
    for sampling in (SamplingParams(temperature=0.8, top_k=40), SamplingParams(temperature=0.8, top_k=40, top_p=0.5)):
        np.testing.assert_array_equal(dense(V._row_probs(row, sampling)), V._reference_probs(row, sampling))


def test_nucleus_boundary_within_rounding_falls_back_to_the_full_row():
    # Two tokens of equal probability far above the rest: top_p exactly at their first's mass
    # puts the boundary within rounding; the answer must still be the reference's.
    row = logit_rows(10, 1, 256_000, 1.0)[0]
    row[[5, 9]] = 60.0
    for top_p in (0.5, 0.5 + 1e-12, 0.5 - 1e-12, 1.0 - 1e-12):
        assert_same_row(row, SamplingParams(temperature=1.0, top_p=top_p))


def test_sampling_probs_batches_are_the_fast_rows():
    rows = logit_rows(11, 4, 64_000, 12.0)
    for sampling in SETTINGS:
        batched = V.sampling_probs(rows, sampling)
        for row, probs in zip(rows, batched):
            np.testing.assert_array_equal(dense(V._row_probs(row, sampling)), probs)


def test_sample_skipping_zeros_draws_the_dense_token():
    rng = np.random.default_rng(12)
    for _ in range(50):
        probs = np.zeros(100_000)
        ids = rng.choice(probs.size, int(rng.integers(1, 300)), replace=False)
        probs[ids] = rng.random(ids.size)
        seed = int(rng.integers(1 << 30))
        cumulative = np.cumsum(probs)
        expected = int(np.searchsorted(cumulative, np.random.default_rng(seed).random() * cumulative[-1], side="right"))
        assert V.sample(probs, np.random.default_rng(seed)) == expected


class DenseRows:
    """The host rows as they were: dense (V,) rows from the reference transform."""

    def __init__(self, logits, sampling):
        self.logits, self.sampling, self.rows = logits, sampling, {}

    def row(self, position):
        if position not in self.rows:
            self.rows[position] = V._reference_probs(self.logits[position], self.sampling)
        return self.rows[position]

    def token_prob(self, position, token):
        p = self.row(position)
        return p[token] if 0 <= token < p.size else 0.0

    def residual(self, position, token, q_row: Optional[np.ndarray]):
        p = self.row(position)
        if q_row is None:
            residual = p.copy()
            if 0 <= token < p.size:
                residual[token] = 0.0
            return residual
        return np.maximum(p - V._fit_width(q_row, p.size), 0.0)

    def mass(self, row):
        return float(row.sum())

    def sample(self, row, rng):
        cumulative = np.cumsum(row)  # the plain dense draw
        index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
        return index if index < row.size else int(np.flatnonzero(row > 0)[-1])


@pytest.mark.parametrize("sampling", [SETTINGS[0], SETTINGS[1], SETTINGS[3]], ids=str)
@pytest.mark.parametrize("draft_width", [0, -10, 10])  # q as wide as the target, narrower, wider
def test_verify_commits_what_the_dense_reference_commits(sampling, draft_width):
    vocab, k = 40_000, 4
    accepted = rejected = 0
    for case in range(30):
        logits = logit_rows(100 + case, k + 1, vocab, 6.0)
        width = vocab + min(draft_width, 0)
        draft_logits = logits[:k, :width] + logit_rows(200 + case, k, vocab, 3.0)[:, :width]
        if draft_width > 0:
            draft_logits = np.concatenate([draft_logits, np.full((k, draft_width), -5.0, np.float32)], axis=1)
        q = V._reference_probs(draft_logits, sampling)
        draft = [int(np.argmax(row)) for row in q]
        for one_hot in (False, True):
            probs = None if one_hot else q
            fast_rng, dense_rng = np.random.default_rng(case), np.random.default_rng(case)
            got = V.verify(draft, probs, logits, sampling, fast_rng)
            assert got == V.accept_walk(draft, probs, DenseRows(logits, sampling), dense_rng)
            assert fast_rng.bit_generator.state == dense_rng.bit_generator.state  # the same draws
            accepted += got.accepted
            rejected += got.accepted < k
    assert accepted > 0 and rejected > 0  # both branches ran
