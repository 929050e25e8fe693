"""The charts' live series on literal events (no Qt)."""

from __future__ import annotations

import math

import numpy as np

from specdesk.engines.types import StepEvent
from specdesk.ui.series import RunSeries


def step(tokens: int, drafted: int, accepted: int, seconds: float = 0.01) -> StepEvent:
    return StepEvent(tokens=tuple(range(tokens)), text="x" * tokens, drafted=drafted, accepted=accepted,
                     position_accepted=tuple(i < accepted for i in range(drafted)),
                     from_draft=(True,) * accepted + (False,) * (tokens - accepted), draft_s=0.0, verify_s=seconds)


def test_time_starts_when_the_first_pass_began():
    series = RunSeries()
    series.extend([step(1, 0, 0)], [10.01])
    assert series.start == 10.0 and math.isclose(series.t[1], 0.01)


def test_rates_over_the_trailing_window():
    series = RunSeries()
    # 10 passes, 0.1 s apart, each 4 drafted of which 3 accepted plus the target's token
    series.extend([step(4, 4, 3, seconds=0.1)] * 10, [0.1 * (i + 1) for i in range(10)])
    t, rate, acceptance = series.window_rates(min_steps=2, min_seconds=0.2)
    assert np.allclose(t, [0.1 * (i + 1) for i in range(10)])
    assert np.allclose(rate, 40.0)  # 4 tokens per 0.1 s
    assert np.allclose(acceptance, 0.75)


def test_acceptance_is_a_gap_where_nothing_was_drafted():
    series = RunSeries()
    series.extend([step(1, 0, 0)] * 3, [0.01, 0.02, 0.03])
    _, rate, acceptance = series.window_rates()
    assert np.all(np.isnan(acceptance)) and np.all(rate > 0)


def test_arrays_grow_past_their_capacity_and_reset():
    series = RunSeries(capacity=4)
    series.extend([step(2, 2, 1)] * 10, [0.01 * (i + 1) for i in range(10)])
    assert series.steps == 10 and series.tokens[10] == 20 and series.accepted[10] == 10
    series.reset()
    assert series.steps == 0 and series.window_rates()[0].size == 0
