"""The cost model benchmarks/speculative.py reports beside each measured speedup, on literals."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("speculative_benchmark",
                                              Path(__file__).resolve().parent.parent / "benchmarks" / "speculative.py")
speculative = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(speculative)


def test_no_drafts_model_the_baseline():
    assert speculative.cost_model_speedup([(0, 1)] * 10, {1: 0.003}, 0.0005) == pytest.approx(1.0)


def test_committed_tokens_over_pass_and_draft_costs():
    # 5 tokens for one pass over 5 tokens (2 units) and 4 draft steps (0.1 each): 5 / 2.4
    assert speculative.cost_model_speedup([(4, 5)], {1: 1.0, 5: 2.0}, 0.1) == pytest.approx(5 / 2.4)
    # a rejected draft still costs its pass: 1 token for 1.5 + 0.1 units
    assert speculative.cost_model_speedup([(1, 1)], {1: 1.0, 2: 1.5}, 0.1) == pytest.approx(1 / 1.6)
    # mixed passes add up before dividing
    passes = [(4, 5), (4, 2), (0, 1)]
    expected = (5 + 2 + 1) * 1.0 / ((2.0 + 0.4) + (2.0 + 0.4) + 1.0)
    assert speculative.cost_model_speedup(passes, {1: 1.0, 5: 2.0}, 0.1) == pytest.approx(expected)


def test_passes_longer_than_measured_cost_the_longest_measured_pass():
    assert speculative.cost_model_speedup([(8, 9)], {1: 1.0, 2: 1.5}, 0.0) == pytest.approx(9 / 1.5)


def test_no_passes_is_refused():
    with pytest.raises(ValueError, match="no passes"):
        speculative.cost_model_speedup([], {1: 1.0}, 0.0)
