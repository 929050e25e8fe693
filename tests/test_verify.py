"""Verification: sampling transform on literal logits, greedy prefixes on hand-built logits,
seeded determinism, and a chi-square check that speculative sampling is lossless."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from specdesk.engines.speculation.verify import VerifyResult, sample, sampling_probs, verify
from specdesk.engines.types import SamplingParams

VOCAB = 8


def logits_from_probs(probs) -> np.ndarray:
    return np.log(np.asarray(probs, dtype=np.float64))


def peaked_rows(argmaxes, vocab=VOCAB) -> np.ndarray:
    """(len(argmaxes), vocab) logits whose row i has its maximum at argmaxes[i]."""
    rows = np.zeros((len(argmaxes), vocab))
    rows[np.arange(len(argmaxes)), argmaxes] = 5.0
    return rows


# --- sampling_probs -------------------------------------------------------------------------


def test_temperature_only_is_softmax_of_scaled_logits():
    logits = np.array([1.0, 2.0, 0.5, -1.0])
    probs = sampling_probs(logits, SamplingParams(temperature=0.5))
    expected = np.exp(logits / 0.5) / np.exp(logits / 0.5).sum()
    assert probs.dtype == np.float64
    np.testing.assert_allclose(probs, expected)


def test_top_k_keeps_the_k_largest_logits():
    probs = sampling_probs(np.array([1.0, 3.0, 2.0, 0.0]), SamplingParams(temperature=1.0, top_k=2))
    expected = np.array([0.0, np.e**3, np.e**2, 0.0]) / (np.e**3 + np.e**2)
    np.testing.assert_allclose(probs, expected)


@pytest.mark.parametrize(
    "top_p, kept",
    [(0.8, [0, 1]), (0.81, [0, 1, 2]), (0.5, [0]), (1e-6, [0]), (1.0, [0, 1, 2, 3])],
)
def test_top_p_keeps_the_smallest_set_reaching_the_mass(top_p, kept):
    base = np.array([0.5, 0.3, 0.15, 0.05])
    probs = sampling_probs(logits_from_probs(base), SamplingParams(temperature=1.0, top_p=top_p))
    expected = np.zeros(4)
    expected[kept] = base[kept] / base[kept].sum()
    np.testing.assert_allclose(probs, expected, atol=1e-12)


def test_top_k_applies_before_top_p():
    base = np.array([0.5, 0.3, 0.15, 0.05])
    probs = sampling_probs(logits_from_probs(base), SamplingParams(temperature=1.0, top_k=3, top_p=0.8))
    # after top-k: [0.526, 0.316, 0.158]; 0.526 < 0.8 <= 0.842 -> two tokens
    np.testing.assert_allclose(probs, [0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0])


def test_top_p_ties_keep_the_lower_token_id():
    probs = sampling_probs(np.array([0.0, 1.0, 1.0, 1.0]), SamplingParams(temperature=1.0, top_p=0.2))
    np.testing.assert_allclose(probs, [0.0, 1.0, 0.0, 0.0])


def test_batched_rows_match_single_rows():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((5, 50)) * 3
    sampling = SamplingParams(temperature=0.7, top_k=20, top_p=0.9)
    batched = sampling_probs(logits, sampling)
    assert batched.shape == (5, 50)
    for row, probs in zip(logits, batched):
        np.testing.assert_array_equal(sampling_probs(row, sampling), probs)
    np.testing.assert_allclose(batched.sum(axis=1), 1.0)


@pytest.mark.parametrize("scale", [0.05, 1.0, 4.0, 12.0])
def test_large_vocab_nucleus_matches_a_full_sort(scale):
    rng = np.random.default_rng(int(scale * 100))
    vocab = 20_000
    logits = rng.standard_normal(vocab) * scale
    logits[rng.integers(0, vocab, 200)] = logits[0]  # ties across the nucleus boundary
    for top_p in (0.3, 0.9, 0.999):
        probs = sampling_probs(logits, SamplingParams(temperature=1.0, top_p=top_p))
        full = np.exp(logits - logits.max())
        full /= full.sum()
        order = np.argsort(-full, kind="stable")
        keep = min(int(np.searchsorted(np.cumsum(full[order]), top_p - 1e-9)) + 1, vocab)
        expected_support = np.sort(order[:keep])
        np.testing.assert_array_equal(np.flatnonzero(probs), expected_support)
        np.testing.assert_allclose(probs[expected_support], full[expected_support] / full[expected_support].sum())


def test_greedy_params_give_one_hot_argmax():
    probs = sampling_probs(np.array([[0.0, 2.0, 2.0], [3.0, 1.0, 0.0]]), SamplingParams())
    np.testing.assert_array_equal(probs, [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


def test_sample_never_returns_a_zero_probability_token():
    rng = np.random.default_rng(0)
    probs = np.array([0.0, 0.25, 0.0, 0.75, 0.0])
    draws = {sample(probs, rng) for _ in range(200)}
    assert draws == {1, 3}


# --- greedy verification ----------------------------------------------------------------------


@pytest.mark.parametrize("accepted", [0, 1, 2, 3])
def test_greedy_accepts_the_argmax_matching_prefix(accepted):
    target_argmax = [4, 2, 7, 1]  # rows 0..3; row 3 follows all three drafts
    draft = [4, 2, 7]
    draft = draft[:accepted] + [(t + 1) % VOCAB for t in draft[accepted:]]
    result = verify(draft, None, peaked_rows(target_argmax), SamplingParams(), np.random.default_rng(0))
    assert result == VerifyResult(accepted=accepted, next_token=target_argmax[accepted])


def test_greedy_stops_at_the_first_mismatch_even_if_later_tokens_match():
    result = verify([4, 0, 7], None, peaked_rows([4, 2, 7, 1]), SamplingParams(), np.random.default_rng(0))
    assert result == VerifyResult(accepted=1, next_token=2)


def test_greedy_with_no_draft_is_argmax_of_the_only_row():
    result = verify([], None, peaked_rows([6]), SamplingParams(), np.random.default_rng(0))
    assert result == VerifyResult(accepted=0, next_token=6)


def test_greedy_ties_take_the_first_maximum():
    logits = np.array([[1.0, 3.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert verify([2], None, logits, SamplingParams(), np.random.default_rng(0)) == VerifyResult(0, 1)
    assert verify([1], None, logits, SamplingParams(), np.random.default_rng(0)) == VerifyResult(1, 0)


def test_greedy_ignores_draft_probs_and_uses_no_randomness():
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    draft_probs = np.full((2, VOCAB), 1.0 / VOCAB)
    assert verify([4, 2], draft_probs, peaked_rows([4, 2, 5]), SamplingParams(), rng) == VerifyResult(2, 5)
    assert rng.bit_generator.state == state


def test_shape_errors_name_the_expected_shape():
    with pytest.raises(ValueError, match=r"\(3, V\)"):
        verify([1, 2], None, np.zeros((2, VOCAB)), SamplingParams(), np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"\(2, V\)"):
        verify([1, 2], np.zeros((1, VOCAB)), np.zeros((3, VOCAB)), SamplingParams(1.0), np.random.default_rng(0))


# --- sampling verification --------------------------------------------------------------------


def test_sampling_with_a_seeded_rng_is_reproducible():
    rng = np.random.default_rng(11)
    target = rng.standard_normal((4, VOCAB))
    draft_probs = sampling_probs(rng.standard_normal((3, VOCAB)), SamplingParams(temperature=0.9))
    sampling = SamplingParams(temperature=0.9, top_p=0.95)

    def run(seed):
        gen = np.random.default_rng(seed)
        return [verify([1, 5, 2], draft_probs, target, sampling, gen) for _ in range(50)]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_draft_equal_to_target_is_always_accepted():
    rng = np.random.default_rng(5)
    sampling = SamplingParams(temperature=1.0)
    target = rng.standard_normal((4, VOCAB))
    draft_probs = sampling_probs(target[:3], sampling)  # q == p on every row
    for _ in range(100):
        assert verify([3, 1, 4], draft_probs, target, sampling, rng).accepted == 3


def test_one_hot_draft_is_accepted_when_the_target_is_certain():
    sampling = SamplingParams(temperature=1.0, top_k=1)  # p is one-hot on the argmax
    result = verify([4, 2], None, peaked_rows([4, 2, 6]), sampling, np.random.default_rng(0))
    assert result == VerifyResult(accepted=2, next_token=6)


def test_one_hot_draft_the_target_cannot_emit_is_rejected_and_never_resampled():
    sampling = SamplingParams(temperature=1.0, top_k=3)
    logits = np.array([[5.0, 4.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.0] * VOCAB])
    rng = np.random.default_rng(0)
    for _ in range(100):
        result = verify([6], None, logits, sampling, rng)
        assert result.accepted == 0 and result.next_token in (0, 1, 2)


def test_draft_token_outside_the_target_vocab_is_rejected():
    sampling = SamplingParams(temperature=1.0)
    draft_probs = np.zeros((1, VOCAB + 4))
    draft_probs[0, VOCAB + 1] = 1.0  # a padded draft vocab proposing an id the target lacks
    result = verify([VOCAB + 1], draft_probs, np.zeros((2, VOCAB)), sampling, np.random.default_rng(0))
    assert result.accepted == 0 and 0 <= result.next_token < VOCAB


# --- losslessness: committed tokens follow the target distribution ------------------------------

TRIALS = 20_000
SAMPLING_CASES = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=6, top_p=0.9),
]


def assert_matches_distribution(tokens, expected, min_pvalue=0.01):
    observed = np.bincount(tokens, minlength=expected.size)
    support = expected > 0
    assert observed[~support].sum() == 0, f"tokens outside the target's support: {observed}"
    result = chisquare(observed[support], expected[support] / expected[support].sum() * len(tokens))
    assert result.pvalue > min_pvalue, f"observed {observed} vs expected {np.round(expected * len(tokens))}"


@pytest.mark.parametrize("sampling", SAMPLING_CASES, ids=["T1", "T0.7-k6-p0.9"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_first_committed_token_follows_the_target_with_draft_probs(k, sampling):
    rng = np.random.default_rng(100 + k)
    target = rng.standard_normal((k + 1, VOCAB)) * 1.5  # (k+1, V)
    draft_probs = sampling_probs(rng.standard_normal((k, VOCAB)) * 1.5, sampling)  # (k, V) q
    cumulative_q = np.cumsum(draft_probs, axis=1)
    first = np.empty(TRIALS, dtype=np.int64)
    for trial in range(TRIALS):
        draft = [int(np.searchsorted(row, rng.random(), side="right")) for row in cumulative_q]
        draft = [min(t, VOCAB - 1) for t in draft]
        result = verify(draft, draft_probs, target, sampling, rng)
        first[trial] = draft[0] if result.accepted else result.next_token
    assert_matches_distribution(first, sampling_probs(target[0], sampling))


@pytest.mark.parametrize("sampling", SAMPLING_CASES, ids=["T1", "T0.7-k6-p0.9"])
@pytest.mark.parametrize("k", [1, 3])
def test_first_committed_token_follows_the_target_with_one_hot_draft(k, sampling):
    rng = np.random.default_rng(200 + k)
    target = rng.standard_normal((k + 1, VOCAB)) * 1.5
    p0 = sampling_probs(target[0], sampling)
    draft = [int(np.argsort(p0)[-2])] + [3] * (k - 1)  # a fixed guess: the runner-up token
    first = np.empty(TRIALS, dtype=np.int64)
    for trial in range(TRIALS):
        result = verify(draft, None, target, sampling, rng)
        first[trial] = draft[0] if result.accepted else result.next_token
    assert_matches_distribution(first, p0)


def test_every_committed_token_follows_the_target_over_a_generation_loop():
    """With the same p at every position, a speculative run must emit i.i.d. p tokens,
    including the bonus tokens after fully accepted drafts."""
    rng = np.random.default_rng(9)
    sampling = SamplingParams(temperature=1.0)
    k = 3
    target_row = rng.standard_normal(VOCAB)
    target = np.tile(target_row, (k + 1, 1))
    q = sampling_probs(rng.standard_normal(VOCAB) * 0.5, sampling)
    draft_probs = np.tile(q, (k, 1))
    tokens: list[int] = []
    while len(tokens) < TRIALS:
        draft = [sample(q, rng) for _ in range(k)]
        result = verify(draft, draft_probs, target, sampling, rng)
        tokens += draft[: result.accepted] + [result.next_token]
    assert_matches_distribution(np.array(tokens), sampling_probs(target_row, sampling))


POSITION_TRIALS = 10_000


@pytest.mark.parametrize("sampling", SAMPLING_CASES, ids=["T1", "T0.7-k6-p0.9"])
@pytest.mark.parametrize("k", [1, 2])
def test_each_position_of_a_run_follows_its_own_target_row(k, sampling):
    """A target whose distribution depends only on the position (row j for the j-th token) and a
    draft with its own q per position: every position of a speculative run follows its own row.

    Unlike the tests above, the rows differ by position, so a bonus token drawn from the wrong
    row, or a draft position judged against another position's q, shows up here.
    """
    rng = np.random.default_rng(300 + k)
    positions = 3
    rows = rng.standard_normal((positions + k + 1, VOCAB)) * 1.5  # (positions + k + 1, V): row j = position j
    q = sampling_probs(rng.standard_normal((positions + k, VOCAB)) * 1.5, sampling)  # (positions + k, V)
    out = np.empty((POSITION_TRIALS, positions), dtype=np.int64)
    for trial in range(POSITION_TRIALS):
        tokens: list[int] = []
        while len(tokens) < positions:
            j = len(tokens)
            draft = [sample(q[j + i], rng) for i in range(k)]
            result = verify(draft, q[j:j + k], rows[j:j + k + 1], sampling, rng)
            tokens += draft[: result.accepted] + [result.next_token]
        out[trial] = tokens[:positions]
    for j in range(positions):  # 12 checks in all: a stricter level each, so chance alone rarely fails one
        assert_matches_distribution(out[:, j], sampling_probs(rows[j], sampling), min_pvalue=0.001)
