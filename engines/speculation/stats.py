"""Run statistics: tok/s, acceptance, mean accepted length, per-position acceptance.

`StatsAccumulator` folds StepEvents into RunStats (live via `snapshot()`, final via
`finish()`); `ProposerCounters` is the small counter set every proposer keeps; the two
formulas give the theoretical expectation to compare a run against.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

from ..types import RunStats, StepEvent


class StatsAccumulator:
    """Accumulates one run's StepEvents for draft length k.

    Call `start()` right before the first decode step (so `seconds` covers decoding, from
    start() to finish(), or to now for a live snapshot); if it was not called, the clock
    starts at the first `add()`. Positions past k in an event (a proposer that drafted more
    than announced) are not counted per position, and longer accepted runs go in the last
    histogram bucket, so a bad event can never break the live charts.
    """

    def __init__(self, k: int, clock: Callable[[], float] = time.perf_counter) -> None:
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        self.k = k
        self._clock = clock
        self._started_at: Optional[float] = None
        self._finished_seconds: Optional[float] = None
        self._tokens = 0
        self._passes = 0
        self._drafted = 0
        self._accepted = 0
        self._draft_s = 0.0
        self._verify_s = 0.0
        self._position_drafted = [0] * k
        self._position_accepted = [0] * k
        self._accepted_histogram = [0] * (k + 1)

    def start(self, at: float | None = None) -> None:
        """Start the clock now, or at `at` (a reading of the same clock) when the caller
        knows the run began earlier than it could call this."""
        self._started_at = self._clock() if at is None else at
        self._finished_seconds = None

    def add(self, event: StepEvent) -> None:
        if self._started_at is None:
            self.start()
        self._tokens += len(event.tokens)
        self._passes += 1
        self._drafted += event.drafted
        self._accepted += event.accepted
        self._draft_s += event.draft_s
        self._verify_s += event.verify_s
        for position in range(min(event.drafted, self.k)):
            self._position_drafted[position] += 1
        for position, was_accepted in enumerate(event.position_accepted[: self.k]):
            if was_accepted:
                self._position_accepted[position] += 1
        self._accepted_histogram[min(event.accepted, self.k)] += 1

    def snapshot(self) -> RunStats:
        """RunStats so far; cheap (O(k)), meant for a ~30 Hz UI timer."""
        if self._finished_seconds is not None:
            seconds = self._finished_seconds
        elif self._started_at is not None:
            seconds = self._clock() - self._started_at
        else:
            seconds = 0.0
        return RunStats(
            tokens=self._tokens,
            seconds=seconds,
            passes=self._passes,
            drafted=self._drafted,
            accepted=self._accepted,
            draft_s=self._draft_s,
            verify_s=self._verify_s,
            per_position_drafted=tuple(self._position_drafted),
            per_position_accepted=tuple(self._position_accepted),
            accepted_length_histogram=tuple(self._accepted_histogram),
        )

    def finish(self) -> RunStats:
        """Stop the clock and return the final RunStats (later snapshots return the same)."""
        if self._finished_seconds is None:
            started = self._started_at if self._started_at is not None else self._clock()
            self._finished_seconds = self._clock() - started
        return self.snapshot()


@dataclass
class ProposerCounters:
    """Counters every proposer keeps and reports through its `stats()`."""

    proposals: int = 0  # propose() calls
    drafted: int = 0  # tokens proposed
    accepted: int = 0  # of those, accepted by verification
    propose_s: float = 0.0  # wall time inside propose()

    def record_proposal(self, n_tokens: int, seconds: float) -> None:
        self.proposals += 1
        self.drafted += n_tokens
        self.propose_s += seconds

    def record_accepted(self, n_accepted: int) -> None:
        self.accepted += n_accepted

    def as_dict(self) -> dict:
        return {
            "proposals": self.proposals,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": self.accepted / self.drafted if self.drafted else 0.0,
            "propose_s": self.propose_s,
            "mean_draft_len": self.drafted / self.proposals if self.proposals else 0.0,
        }


def expected_tokens_per_pass(acceptance: float, k: int) -> float:
    """Expected tokens committed per target pass, (1 - a^(k+1)) / (1 - a).

    Assumes each draft token is accepted independently with probability a (Leviathan et al.
    2023, eq. 1): the accepted prefix plus the target's own token. Equals k+1 at a = 1.
    """
    if not 0.0 <= acceptance <= 1.0:
        raise ValueError(f"acceptance must be in [0, 1], got {acceptance}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if acceptance == 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def speedup_bound(
    acceptance: float, k: int, draft_step_s: float, verify_pass_s: float, baseline_token_s: float
) -> float:
    """Expected speedup over baseline decoding under the same i.i.d. acceptance model.

    One speculative step costs k draft steps plus one verify pass and commits
    `expected_tokens_per_pass` tokens; baseline costs `baseline_token_s` per token:
        speedup = E[tokens/pass] * baseline_token_s / (k * draft_step_s + verify_pass_s).
    With verify_pass_s == baseline_token_s and draft_step_s = c * baseline_token_s this is
    Leviathan et al.'s (1 - a^(k+1)) / ((1 - a)(k c + 1)).
    """
    step_s = k * draft_step_s + verify_pass_s
    if step_s <= 0:
        raise ValueError("k * draft_step_s + verify_pass_s must be > 0")
    return expected_tokens_per_pass(acceptance, k) * baseline_token_s / step_s
