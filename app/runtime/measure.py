"""Figures measured over repeated runs, and whether they say anything.

One run of a busy machine can say 10x where the next says 1.5x, so compare and the k sweep
(app/runtime/compare.py) repeat each point until the runs agree (`Repeats`) and keep every
run's figure (`Measure`): its median, and its range, which unlike "± half the range" can never
read larger than the figure. `beyond_noise` says whether a speedup is one at all;
`busy_reason` says, in a few words, why the figures may be off.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from typing import Iterable, Optional

from specdesk.engines.types import SpecDeskError

MIN_RUNS = 3
MAX_RUNS = 7
STEADY_SPREAD = 0.05  # runs stop repeating once their spread is within this share of the median
NOISE_FLOOR = 0.03  # a speedup this close to 1.0x is noise even when every run agrees
BUSY_BASELINE_RANGE = 0.15  # the baseline's tok/s varying more than this share between runs: a busy machine


@dataclass(frozen=True)
class Measure:
    """A figure measured over repeated runs: their median, and their spread (half the range
    between the lowest and the highest run)."""

    median: float
    spread: float
    runs: int
    values: tuple[float, ...] = ()  # each run's figure, in the order they ran

    @classmethod
    def of(cls, values: Iterable[float]) -> "Measure":
        items = tuple(float(v) for v in values)
        if not items:
            return cls(0.0, 0.0, 0)
        return cls(statistics.median(items), (max(items) - min(items)) / 2, len(items), items)

    @property
    def relative_spread(self) -> float:
        return self.spread / abs(self.median) if self.median else (0.0 if not self.spread else float("inf"))

    def figure(self, unit: str = "x", digits: int = 2) -> str:
        """'1.46x ± 0.08' ('1.46x' when one run has nothing to spread)."""
        spread = f" ± {self.spread:.{digits}f}" if self.runs > 1 else ""
        return f"{self.median:.{digits}f}{unit}{spread}"

    def describe(self, unit: str = "x", digits: int = 2) -> str:
        """'1.46x ± 0.08, 3 runs'."""
        return f"{self.figure(unit, digits)}, {self.runs} run{'s' if self.runs != 1 else ''}"

    def span(self, unit: str = "x", digits: int = 2) -> str:
        """The lowest and the highest run, '1.38–1.54x': unlike '± half the range', a run far off
        the others cannot make it read larger than the figure itself."""
        if not self.values:
            return f"{self.median:.{digits}f}{unit}"
        return f"{min(self.values):.{digits}f}–{max(self.values):.{digits}f}{unit}"

    def ranged(self, unit: str = "x", digits: int = 2) -> str:
        """'43.1 tok/s (41.0–45.2 over 3 runs)': the median, then the runs' range; one run: '43.1 tok/s (1 run)'."""
        if self.runs < 2:
            return f"{self.median:.{digits}f}{unit} ({self.runs} run{'s' if self.runs != 1 else ''})"
        return f"{self.median:.{digits}f}{unit} ({self.span('', digits)} over {self.runs} runs)"


def beyond_noise(speedup: Measure) -> bool:
    """Whether a measured speedup is a gain or a loss at all: 1.0x lies outside its spread
    (and outside NOISE_FLOOR, which a single run or runs that happen to agree cannot narrow)."""
    return speedup.runs > 0 and abs(speedup.median - 1.0) > max(speedup.spread, NOISE_FLOOR)


@dataclass(frozen=True)
class Repeats:
    """How often a point is run: at least `min_runs`, then until the spread is within `steady`
    of the median, at most `max_runs`."""

    min_runs: int = MIN_RUNS
    max_runs: int = MAX_RUNS
    steady: float = STEADY_SPREAD

    def __post_init__(self) -> None:
        if not 1 <= self.min_runs <= self.max_runs:
            raise SpecDeskError(f"runs: at least {self.min_runs} and at most {self.max_runs} is not a range; "
                                "give 1 <= min <= max")

    def more(self, measure: Measure) -> bool:
        """Whether another run is wanted after these."""
        if measure.runs < self.min_runs:
            return True
        return measure.runs < self.max_runs and measure.relative_spread > self.steady


def machine_load() -> Optional[tuple[float, int]]:
    """(one-minute load average, logical cores), or None where the system has no load average."""
    try:
        return os.getloadavg()[0], os.cpu_count() or 1
    except (AttributeError, OSError):
        return None


def busy_reason(baseline_rate: Measure, load: Optional[tuple[float, int]] = None) -> Optional[str]:
    """Why the figures may be off, in a few words, when the machine is visibly busy; else None."""
    if load is not None and load[0] > load[1]:
        return f"busy machine: load average {load[0]:.1f} on {load[1]} cores"
    if baseline_rate.runs > 1 and baseline_rate.median > 0:
        varied = 2 * baseline_rate.spread / baseline_rate.median
        if varied > BUSY_BASELINE_RANGE:
            return f"busy machine: the baseline's runs ranged {baseline_rate.span(' tok/s', 1)}"
    return None
