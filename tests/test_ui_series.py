"""The charts' live series on literal events (no Qt)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from specdesk.engines.types import StepEvent
from specdesk.ui.series import RunSeries, choice_label


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


def test_method_bands_name_the_method_of_each_slice_of_time():
    """Method auto: each step names its method; the bands resample them over the run's time."""
    series = RunSeries(capacity=4)
    plan = ["draft"] * 6 + ["ngram"] * 2 + ["none"] * 2  # 10 steps of 0.1 s
    events = [dataclasses.replace(step(2, 3, 1, seconds=0.1), method=m, reason=f"{m}, k = 3: expected 1.20x") for m in plan]
    series.extend(events, [0.1 * (i + 1) for i in range(10)])
    assert series.method_names == ["draft", "ngram", "none"] and series.choice == "no speculation"
    t_end, codes = series.method_bands(bins=20)
    assert math.isclose(t_end, 1.0)
    assert codes.tolist() == [0] * 12 + [1] * 4 + [2] * 4  # slices of 0.05 s: 0.6 s draft, 0.2 s each after
    series.reset()
    series.extend([step(1, 0, 0)] * 3, [0.01, 0.02, 0.03])  # any other method names none
    assert series.method_names == [] and series.method_bands() is None and series.choice is None


def test_the_choice_label_names_the_method_and_its_k():
    assert choice_label("draft", "draft, k = 3: expected 1.30x") == "draft, k = 3"
    assert choice_label("ngram-pool", "ngram found nothing: ngram-pool, k = 1") == "ngram-pool, k = 1"
    assert choice_label("ngram", "ngram-pool, k = 2: expected 1.10x") == "ngram"  # no k named for it
    assert choice_label("none", "no speculation: best expected 0.80x (draft, k = 3)") == "no speculation"
