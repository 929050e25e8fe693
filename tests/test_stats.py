"""Run statistics on hand-made StepEvents, and the expected-speedup formulas."""

from __future__ import annotations

import pytest

from specdesk.engines.speculation.stats import (
    ProposerCounters,
    StatsAccumulator,
    expected_tokens_per_pass,
    speedup_bound,
)
from specdesk.engines.types import StepEvent


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def step(tokens, drafted, accepted, draft_s=0.01, verify_s=0.1):
    return StepEvent(
        tokens=tuple(tokens),
        text="",
        drafted=drafted,
        accepted=accepted,
        position_accepted=tuple(i < accepted for i in range(drafted)),
        from_draft=tuple(i < accepted for i in range(len(tokens))),
        draft_s=draft_s,
        verify_s=verify_s,
    )


def test_accumulates_hand_made_steps():
    clock = FakeClock()
    stats = StatsAccumulator(k=3, clock=clock)
    stats.start()
    stats.add(step([1, 2, 3, 4], drafted=3, accepted=3))
    stats.add(step([5], drafted=3, accepted=0))
    stats.add(step([6, 7], drafted=2, accepted=1))  # a variable-length proposer drafted 2
    stats.add(step([8], drafted=0, accepted=0))  # and nothing here
    clock.now += 2.0
    run = stats.finish()

    assert (run.tokens, run.passes, run.drafted, run.accepted) == (8, 4, 8, 4)
    assert run.seconds == 2.0
    assert run.draft_s == pytest.approx(0.04) and run.verify_s == pytest.approx(0.4)
    assert run.per_position_drafted == (3, 3, 2)
    assert run.per_position_accepted == (2, 1, 1)
    assert run.accepted_length_histogram == (2, 1, 0, 1)
    assert run.tok_per_s == 4.0
    assert run.acceptance_rate == 0.5
    assert run.mean_accepted_length == 2.0
    assert run.per_position_acceptance == [2 / 3, 1 / 3, 0.5]


def test_snapshot_is_live_until_finish_then_frozen():
    clock = FakeClock()
    stats = StatsAccumulator(k=2, clock=clock)
    assert stats.snapshot().seconds == 0.0 and stats.snapshot().tokens == 0
    stats.start()
    stats.add(step([1, 2], drafted=2, accepted=1))
    clock.now += 0.5
    live = stats.snapshot()
    assert (live.tokens, live.seconds, live.passes) == (2, 0.5, 1)
    clock.now += 0.5
    final = stats.finish()
    clock.now += 10.0
    assert final.seconds == 1.0 and stats.snapshot() == final and stats.finish() == final


def test_clock_starts_at_the_first_event_without_start():
    clock = FakeClock()
    stats = StatsAccumulator(k=1, clock=clock)
    clock.now += 5.0
    stats.add(step([1], drafted=1, accepted=0))
    clock.now += 1.0
    assert stats.finish().seconds == 1.0


def test_baseline_has_no_positions_and_one_histogram_bucket():
    stats = StatsAccumulator(k=0, clock=FakeClock())
    stats.start()
    for token in range(5):
        stats.add(step([token], drafted=0, accepted=0))
    run = stats.finish()
    assert (run.per_position_drafted, run.per_position_accepted, run.accepted_length_histogram) == ((), (), (5,))
    assert run.mean_accepted_length == 1.0 and run.acceptance_rate == 0.0


def test_drafts_longer_than_k_are_clamped_not_fatal():
    stats = StatsAccumulator(k=2, clock=FakeClock())
    stats.add(step([1, 2, 3, 4], drafted=4, accepted=3))
    run = stats.finish()
    assert run.per_position_drafted == (1, 1) and run.per_position_accepted == (1, 1)
    assert run.accepted_length_histogram == (0, 0, 1)
    assert (run.drafted, run.accepted) == (4, 3)


@pytest.mark.parametrize(
    "acceptance, k, expected",
    [(0.0, 4, 1.0), (1.0, 4, 5.0), (0.5, 2, 1.75), (0.8, 0, 1.0), (0.9, 1, 1.9)],
)
def test_expected_tokens_per_pass(acceptance, k, expected):
    assert expected_tokens_per_pass(acceptance, k) == pytest.approx(expected)


def test_expected_tokens_per_pass_is_continuous_at_full_acceptance():
    assert expected_tokens_per_pass(1 - 1e-9, 4) == pytest.approx(5.0)
    with pytest.raises(ValueError, match="acceptance"):
        expected_tokens_per_pass(1.5, 4)


def test_speedup_bound():
    # Leviathan et al.: a = 0.8, k = 4, draft cost c = 0.05 of a target pass -> 3.36 / 1.2 = 2.8
    assert speedup_bound(0.8, 4, draft_step_s=0.05, verify_pass_s=1.0, baseline_token_s=1.0) == pytest.approx(
        (1 - 0.8**5) / (0.2 * 1.2)
    )
    # a verify pass that costs twice a baseline step halves the bound
    assert speedup_bound(0.5, 2, 0.0, 0.02, 0.01) == pytest.approx(1.75 / 2)
    # baseline (k = 0) through the same code path: no speedup
    assert speedup_bound(0.7, 0, 0.0, 0.01, 0.01) == pytest.approx(1.0)


def test_proposer_counters():
    counters = ProposerCounters()
    counters.record_proposal(4, 0.002)
    counters.record_proposal(0, 0.001)
    counters.record_accepted(3)
    assert counters.as_dict() == {
        "proposals": 2,
        "drafted": 4,
        "accepted": 3,
        "acceptance": 0.75,
        "propose_s": pytest.approx(0.003),
        "mean_draft_len": 2.0,
    }
