"""Live per-step series for the charts: preallocated numpy arrays, no Qt.

One row per StepEvent: time since the run started and cumulative tokens, drafted and
accepted, and with method auto the method that step used. Rates are computed over a trailing
window at repaint time, vectorised, so adding an event is O(1) and a repaint is one pass over
the arrays.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

import numpy as np

from specdesk.engines.types import StepEvent


def choice_label(method: str, reason: Optional[str]) -> str:
    """Method auto: a step's choice in a few words ("draft, k = 3", "no speculation"), its k
    read from its reason where the reason names it ("ngram found nothing: draft, k = 2")."""
    if method == "none":
        return "no speculation"
    found = re.search(re.escape(method) + r", k = (\d+)", reason or "")
    return f"{method}, k = {found.group(1)}" if found else method


class RunSeries:
    """Cumulative counters of one run, indexed by step; row 0 is the start (all zeros)."""

    def __init__(self, capacity: int = 4096):
        self._capacity = capacity
        self.t = np.zeros(capacity)  # (capacity,) seconds since the start of the first pass
        self.tokens = np.zeros(capacity)  # (capacity,) cumulative committed tokens
        self.drafted = np.zeros(capacity)  # (capacity,) cumulative drafted tokens
        self.accepted = np.zeros(capacity)  # (capacity,) cumulative accepted draft tokens
        # (capacity,) method auto: the step's method as an index into method_names; -1 none named
        self.method = np.full(capacity, -1, dtype=np.int16)
        self.method_names: list[str] = []  # in the order they first drafted in this run
        self.choice: Optional[str] = None  # method auto: the latest step's choice, e.g. "draft, k = 3"
        self.n = 1  # rows in use, including the start row
        self.start: Optional[float] = None  # perf_counter() reading of t = 0

    def reset(self) -> None:
        self.n = 1
        self.start = None
        self.method_names = []
        self.choice = None

    @property
    def steps(self) -> int:
        return self.n - 1

    def _grow(self) -> None:
        self._capacity *= 2
        for name in ("t", "tokens", "drafted", "accepted", "method"):
            old = getattr(self, name)
            new = np.full(self._capacity, -1, dtype=old.dtype) if name == "method" else np.zeros(self._capacity)
            new[: self.n] = old[: self.n]
            setattr(self, name, new)

    def extend(self, events: Sequence[StepEvent], times: Sequence[float]) -> None:
        for event, at in zip(events, times):
            if self.start is None:
                # The event arrives when its pass ended; the run began when that pass began.
                self.start = at - event.draft_s - event.verify_s
            if self.n == self._capacity:
                self._grow()
            i = self.n
            self.t[i] = max(at - self.start, self.t[i - 1])
            self.tokens[i] = self.tokens[i - 1] + len(event.tokens)
            self.drafted[i] = self.drafted[i - 1] + event.drafted
            self.accepted[i] = self.accepted[i - 1] + event.accepted
            if event.method is not None:
                if event.method not in self.method_names:
                    self.method_names.append(event.method)
                self.method[i] = self.method_names.index(event.method)
                self.choice = choice_label(event.method, event.reason)
            else:
                self.method[i] = -1
            self.n += 1

    def method_bands(self, bins: int = 512) -> Optional[tuple[float, np.ndarray]]:
        """Method auto: (the last step's time, (bins,) method index over equal slices of
        0..that time, -1 where no method was named), the method of the step under each slice's
        middle; None when no step named its method (any other method)."""
        if not self.method_names or self.n < 2:
            return None
        n = self.n
        t_end = float(self.t[n - 1])
        if t_end <= 0:
            return t_end, np.full(bins, self.method[n - 1], dtype=np.int16)
        middles = (np.arange(bins) + 0.5) * (t_end / bins)
        step = np.minimum(np.searchsorted(self.t[1:n], middles, side="left"), n - 2)  # step i ends at t[i + 1]
        return t_end, self.method[1:n][step]

    def window_rates(self, min_steps: int = 16, min_seconds: float = 0.2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(t, tokens/s, acceptance) per step over a trailing window.

        The window spans at least `min_steps` steps and at least `min_seconds` (fewer at
        the start of a run), so the curves are smooth for fast and slow models alike.
        Acceptance is NaN where the window drafted nothing (pyqtgraph leaves a gap).
        """
        n = self.n
        if n < 2:
            empty = np.zeros(0)
            return empty, empty, empty
        t, tokens = self.t[:n], self.tokens[:n]
        index = np.arange(1, n)
        by_time = np.searchsorted(t, t[1:] - min_seconds, side="right") - 1
        begin = np.clip(np.minimum(index - min_steps, by_time), 0, None)  # (n-1,) window start rows
        span = t[1:] - t[begin]
        rate = np.divide(tokens[1:] - tokens[begin], span, out=np.zeros(n - 1), where=span > 0)
        drafted = self.drafted[1:n] - self.drafted[begin]
        accepted = self.accepted[1:n] - self.accepted[begin]
        acceptance = np.divide(accepted, drafted, out=np.full(n - 1, np.nan), where=drafted > 0)
        return t[1:], rate, acceptance
