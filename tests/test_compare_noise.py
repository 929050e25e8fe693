"""Speedups you can trust: compare and the k sweep repeat each point until its spread is small
(or up to a limit) and report the median, the spread and the run count; a speedup within the
noise of 1.0x gets no star and no "Use k", and a visibly busy machine is said beside the figure.

The engine here is one whose timing the test sets: the runner's clock is the engine's own,
which each pass moves on by its time, so no machine load reaches the figures. Every run is
slower or faster by a factor drawn from a seeded generator (a machine whose background load
comes and goes), and speculation either commits one token per pass like the baseline (no
gain: any difference is noise) or three (a real 3x).
"""

from __future__ import annotations

import functools
import random
import re
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from specdesk.app.runtime import generation
from specdesk.app.runtime.compare import Measure, Repeats, beyond_noise, busy_reason, compare, sweep
from specdesk.engines.speculation.stats import StatsAccumulator
from specdesk.engines.types import SamplingParams, SpecConfig, StepEvent

STEP_S = 0.002
KS = tuple(range(1, 9))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def clock(monkeypatch) -> Clock:
    """The clock that times each run (app/runtime/generation.py, and its stats accumulator) is this one."""
    clock = Clock()
    monkeypatch.setattr(generation, "time", SimpleNamespace(perf_counter=clock))
    monkeypatch.setattr(generation, "StatsAccumulator", functools.partial(StatsAccumulator, clock=clock))
    return clock


class TimedEngine:
    """Generates the token ids 1, 2, 3, ... at a pace this test sets: each pass moves `clock`
    on by STEP_S times the run's noise factor, and speculation commits `gain` tokens per pass."""

    name = "timed"
    device_description = "CPU"

    def __init__(self, clock: Clock, gain: int, noise: float, seed: int = 7):
        self.clock, self.gain, self.noise = clock, gain, noise
        self.random = random.Random(seed)
        self.target = SimpleNamespace(path=Path("timed.gguf"))
        self.runs = 0

    def reset_chat(self) -> None:
        pass

    def generate(self, request, cancel: threading.Event):
        self.runs += 1
        factor = 1.0 + self.random.uniform(-self.noise, self.noise)
        speculative = request.spec.method != "none"
        per_pass = self.gain if speculative else 1
        made = 0
        while made < request.max_tokens and not cancel.is_set():
            count = min(per_pass, request.max_tokens - made)
            self.clock.now += STEP_S * factor
            tokens = tuple(range(made + 1, made + count + 1))
            made += count
            drafted = request.spec.k if speculative else 0
            accepted = count - 1
            yield StepEvent(tokens, "x" * count, drafted, accepted, (True,) * accepted + (False,) * (drafted - accepted),
                            (False,) + (True,) * accepted, 0.0, STEP_S * factor,
                            finished=made >= request.max_tokens, finish_reason="length" if made >= request.max_tokens
                            else None)


SPEC = SpecConfig(method="draft", k=4, draft_path="timed-draft.gguf")


def run_compare(engine) -> object:
    return compare(engine, ["prompt"], SPEC, SamplingParams(), 48, lambda text: [1, 2, 3])


def run_sweep(engine, points: list):
    return sweep(engine, [1, 2, 3], SPEC, SamplingParams(), 24, KS, threading.Event(), points.append)


def test_measures_are_median_and_half_the_range():
    m = Measure.of([1.38, 1.54, 1.46])
    assert (m.median, m.runs) == (1.46, 3) and m.spread == pytest.approx(0.08)
    assert m.describe() == "1.46x ± 0.08, 3 runs" and Measure.of([0.59]).describe() == "0.59x, 1 run"
    assert m.ranged() == "1.46x (1.38–1.54 over 3 runs)" and Measure.of([0.59]).ranged() == "0.59x (1 run)"
    outlier = Measure.of([5.0, 5.4, 43.1])  # one run far off: half its range would exceed the median
    assert outlier.spread > outlier.median and outlier.ranged(" tok/s", 1) == "5.4 tok/s (5.0–43.1 over 3 runs)"
    assert not beyond_noise(Measure.of([0.9, 1.0, 1.2])) and beyond_noise(Measure.of([1.3, 1.4, 1.5]))
    assert not beyond_noise(Measure.of([1.02]))  # one run that happens to agree with itself is not a gain
    assert busy_reason(Measure.of([100, 100]), (5.0, 2)) == "busy machine: load average 5.0 on 2 cores"
    assert "ranged 80.0–120.0 tok/s" in busy_reason(Measure.of([80, 120]), (0.5, 2))
    assert busy_reason(Measure.of([98, 102]), (0.5, 2)) is None


def test_repeats_stop_when_steady_or_at_the_limit():
    repeats = Repeats(min_runs=3, max_runs=5, steady=0.05)
    assert repeats.more(Measure.of([1.0, 1.0]))
    assert not repeats.more(Measure.of([1.0, 1.01, 1.02]))
    assert repeats.more(Measure.of([1.0, 1.5, 2.0])) and not repeats.more(Measure.of([1.0, 1.5, 2.0, 1.5, 1.5]))


def test_noise_is_repeated_to_the_limit_and_reported_as_noise(clock):
    engine = TimedEngine(clock, gain=1, noise=0.4)
    report = run_compare(engine)
    measure = report.speedup_measure
    assert measure.runs == Repeats().max_runs and len(report.runs) == measure.runs
    assert not report.beyond_noise and report.busy.startswith("busy machine")
    payload = report.to_json()
    assert payload["runs"] == measure.runs and payload["speedup"] == round(measure.median, 4)
    assert payload["speedup_spread"] == round(measure.spread, 4) and payload["speedup_beyond_noise"] is False
    assert payload["identical_outputs"] is True and payload["busy"] == report.busy


def test_a_steady_real_gain_stops_after_the_minimum_runs(clock):
    report = run_compare(TimedEngine(clock, gain=3, noise=0.0))
    assert report.speedup_measure == Measure(3.0, 0.0, 3, (3.0, 3.0, 3.0)) and report.beyond_noise


@pytest.fixture
def view(qapp):
    from specdesk.ui.compare_view import CompareView
    from specdesk.ui.worker import EngineWorker

    worker = EngineWorker()
    view = CompareView(worker, lambda: (SPEC, SamplingParams(), 24))
    yield view, worker
    view.deleteLater()
    worker.shutdown()


def show_sweep(view, worker, engine):
    """A sweep on `engine`, handed to the Compare tab the way the worker hands it over."""
    from specdesk.ui.worker import JobResult

    points: list = []
    result = run_sweep(engine, points)
    view._sweep_job = 41
    for point in points:
        worker.partial.emit((41, point))
    worker.finished.emit(JobResult(41, "sweep", result))
    return result


def test_a_sweep_on_noise_gets_no_star_and_no_use_k(view, clock):
    view, worker = view
    result = show_sweep(view, worker, TimedEngine(clock, gain=1, noise=0.4))
    assert all(p.rate.runs == Repeats().max_runs for p in result.points)
    assert result.best() is None and result.fastest() is not None
    assert len(view.sweep_best.getData()[0] or ()) == 0  # no star
    assert not view.apply_button.isEnabled() and "Use k =" not in view.apply_button.text()
    status = view.sweep_status.text()
    assert "no k is faster than the baseline" in status and "beyond the noise" in status and "runs" in status
    assert "busy machine" in status


def test_a_sweep_with_a_real_gain_stars_the_best_k_and_offers_it(view, clock):
    view, worker = view
    result = show_sweep(view, worker, TimedEngine(clock, gain=3, noise=0.0))
    best = result.best()
    assert best is not None and beyond_noise(best.speedup)
    assert list(view.sweep_best.getData()[0]) == [best.k]
    assert view.apply_button.isEnabled() and view.apply_button.text() == f"Use k = {best.k}"
    assert f"best: k = {best.k}" in view.sweep_status.text() and "3 runs" in view.sweep_status.text()


def test_the_compare_verdict_says_noise_and_the_busy_machine(view, clock):
    from specdesk.ui.worker import JobResult

    view, worker = view
    report = run_compare(TimedEngine(clock, gain=1, noise=0.4))
    view._compare_job = 42
    worker.finished.emit(JobResult(42, "compare", report))
    verdict = view.verdict.text()
    assert "within the noise of 1.0×" in verdict and f"{report.speedup_measure.runs} runs" in verdict
    assert "busy machine" in verdict and "faster" not in verdict

    report = run_compare(TimedEngine(clock, gain=3, noise=0.0))
    view._compare_job = 43
    worker.finished.emit(JobResult(43, "compare", report))
    assert "3.00× faster (runs 3.00–3.00×, 3 runs)" in view.verdict.text()


def pane_figures(text: str) -> tuple[float, float, float]:
    """(median, lowest run, highest run) from a pane's "N tokens · 43.1 tok/s (41.0–45.2 over 3 runs)"."""
    found = re.search(r"([\d.]+) tok/s \(([\d.]+)–([\d.]+) over \d+ runs\)", text)
    assert found, text
    return float(found[1]), float(found[2]), float(found[3])


def test_the_panes_the_summary_and_the_headline_agree_on_a_busy_machine(view, clock):
    """Runs whose pace varies by up to 60% each way (another job taking the cores now and then):
    each pane shows its median over the runs with their range, never a spread larger than the
    figure, the summary the same medians, and the headline is the one divided by the other."""
    from specdesk.app.main import format_table
    from specdesk.ui.compare_view import rate_digits
    from specdesk.ui.worker import JobResult

    view, worker = view
    report = run_compare(TimedEngine(clock, gain=2, noise=0.6, seed=3))
    assert report.baseline_rate.runs >= 3 and report.baseline_rate.spread > 0
    view._compare_job = 44
    worker.finished.emit(JobResult(44, "compare", report))
    base, base_low, base_high = pane_figures(view.baseline_pane.rate.text())
    spec, spec_low, spec_high = pane_figures(view.speculative_pane.rate.text())
    base_shown, spec_shown = (f"{m:.{rate_digits(m)}f}" for m in (report.baseline_rate.median,
                                                                   report.speculative_rate.median))
    assert (base, spec) == (float(base_shown), float(spec_shown))
    assert 0 < base_low <= base <= base_high and 0 < spec_low <= spec <= spec_high
    first_run = report.results[0].baseline.stats.tok_per_s  # what the pane used to show
    assert first_run in report.baseline_rate.values
    headline = float(re.search(r"([\d.]+)×", view.verdict.text())[1])
    assert headline == pytest.approx(spec / base, abs=0.01)  # what a user gets dividing the panes' figures
    details = view.details.text()
    assert f"medians: speculative {spec_shown} ÷ baseline {base_shown} tok/s" in details
    assert "±" not in view.verdict.text() + details + view.baseline_pane.rate.text()
    table = format_table(report)  # the terminal's table says the same
    assert f"{report.baseline_rate.median:.1f}" in table and f"{report.speculative_rate.median:.1f}" in table
    assert f"speedup {headline:.2f}x" in table


def test_a_run_too_short_to_measure_is_said(view, clock):
    from specdesk.app.main import format_table
    from specdesk.ui.worker import JobResult

    report = compare(TimedEngine(clock, gain=1, noise=0.0), ["prompt"], SPEC, SamplingParams(), 1, lambda text: [1])
    assert report.too_short.startswith("each run generated 1 token: too few to measure")
    table = format_table(report)
    assert "identical outputs: yes (1 token)" in table and f"warning: {report.too_short}" in table
    assert report.to_json()["too_short"] == report.too_short
    view, worker = view
    view._compare_job = 45
    worker.finished.emit(JobResult(45, "compare", report))
    assert "too few to measure" in view.verdict.text()
    assert run_compare(TimedEngine(clock, gain=1, noise=0.0)).too_short is None  # 48 tokens a run


def test_an_auto_pane_says_that_auto_chooses_k():
    from specdesk.app.runtime.session import Session

    local = Session()  # the local models, as the Compare tab's titles read them (nothing loaded)
    baseline, speculative = local.arm_titles(SpecConfig(method="auto", k=4))
    assert baseline == "no speculation" and speculative == "auto picks the method and k ≤ 4"
    assert local.arm_titles(SPEC)[1] == "draft, k = 4"
