"""Conformance: the torch engine's verification gives exactly engines/speculation/verify.py's result,
draw for draw, on hand-built and random logits (greedy on the device, sampling via the
shared code)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from specdesk.engines.speculation.verify import sampling_probs, verify  # noqa: E402
from specdesk.engines.torch.verify import verify_on_device  # noqa: E402
from specdesk.engines.types import SamplingParams  # noqa: E402

SAMPLINGS = [SamplingParams(), SamplingParams(temperature=0.8, top_p=0.95),
             SamplingParams(temperature=1.3, top_k=7), SamplingParams(temperature=0.5, top_p=0.5, top_k=20)]


def _both(draft, probs, logits, sampling, seed):
    expected = verify(draft, probs, logits, sampling, np.random.default_rng(seed))
    got = verify_on_device(draft, probs, torch.from_numpy(logits), sampling, np.random.default_rng(seed))
    return expected, got


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "top-p", "top-k", "both"])
@pytest.mark.parametrize("with_q", [False, True], ids=["one-hot q", "draft q"])
def test_random_cases_match_reference(sampling, with_q):
    rng = np.random.default_rng(1)
    for case in range(300):
        k = int(rng.integers(0, 6))
        vocab = int(rng.integers(2, 40))
        logits = (rng.standard_normal((k + 1, vocab)) * rng.uniform(0.1, 4)).astype(np.float32)
        argmax = logits.argmax(1)
        # Drafts that often agree with the target, so acceptance is exercised, not just rejection.
        draft = [int(argmax[i]) if rng.random() < 0.6 else int(rng.integers(0, vocab)) for i in range(k)]
        probs = None
        if with_q and not sampling.greedy:
            probs = sampling_probs(logits[:k] + rng.standard_normal((k, vocab)).astype(np.float32), sampling)
        expected, got = _both(draft, probs, logits, sampling, case)
        assert got == expected, f"case {case}: {got} != {expected} (k={k}, V={vocab})"


def test_greedy_ties_take_the_first_maximum():
    logits = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 1.0, 2.0], [0.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    for draft, expected in (([1, 0], (2, 0)), ([2, 0], (0, 1)), ([1, 3], (1, 0))):
        reference, got = _both(draft, None, logits, SamplingParams(), 0)
        assert (got.accepted, got.next_token) == (reference.accepted, reference.next_token) == expected


def test_no_draft_is_one_target_token():
    logits = np.array([[0.5, 2.5, -1.0]], dtype=np.float32)
    for sampling in SAMPLINGS:
        expected, got = _both([], None, logits, sampling, 3)
        assert got == expected and got.accepted == 0


def test_shape_errors_are_refused():
    with pytest.raises(ValueError, match=r"\(k\+1, V\)"):
        verify_on_device([1, 2], None, torch.zeros(2, 5), SamplingParams(), np.random.default_rng(0))


@pytest.mark.parametrize("sampling", SAMPLINGS[1:], ids=["top-p", "top-k", "both"])
def test_large_vocabularies_match_reference(sampling):
    """Rows past verify.py's sort-all limit take its bucketed nucleus search there; the device
    sorts the whole row. Both must keep the same tokens and draw the same ones."""
    rng = np.random.default_rng(7)
    for case in range(40):
        k = int(rng.integers(1, 5))
        vocab = 6000
        logits = (rng.standard_normal((k + 1, vocab)) * rng.uniform(0.5, 6)).astype(np.float32)
        argmax = logits.argmax(1)
        draft = [int(argmax[i]) if rng.random() < 0.6 else int(rng.integers(0, vocab)) for i in range(k)]
        probs = sampling_probs(logits[:k] + rng.standard_normal((k, vocab)).astype(np.float32), sampling)
        for q in (None, probs):
            expected, got = _both(draft, q, logits, sampling, case)
            assert got == expected, f"case {case}: {got} != {expected}"


def test_device_probabilities_equal_the_shared_transform():
    from specdesk.engines.torch.verify import sampling_probs_on_device

    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((4, 5000)) * 3).astype(np.float32)
    for sampling in SAMPLINGS[1:]:
        expected = sampling_probs(logits, sampling)
        got = sampling_probs_on_device(torch.from_numpy(logits), sampling).numpy()
        assert np.array_equal(got > 0, expected > 0)  # the same kept tokens
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-15)
