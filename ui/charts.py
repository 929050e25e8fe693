"""The right-hand panel: live speculation charts and the status line.

Events are only recorded when they arrive (`add_batch`, O(events)); drawing happens in
`refresh()`, which the window calls from its ~30 Hz timer and which does nothing when no
new data came in. Curves are fed from RunSeries' preallocated arrays.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QApplication, QLabel, QSizePolicy, QVBoxLayout, QWidget

from specdesk.engines.spec.stats import StatsAccumulator
from specdesk.engines.types import RunStats

from . import theme
from .series import RunSeries

pg.setConfigOptions(antialias=True)


def make_plot(title: str, x_label: str, parent: Optional[QWidget] = None) -> pg.PlotWidget:
    """A small, static plot styled after the current palette (no mouse panning)."""
    palette = parent.palette() if parent is not None else QApplication.palette()
    plot = pg.PlotWidget(parent=parent, background=palette.base().color())
    text = theme.muted(palette).name()
    plot.setTitle(title, color=palette.windowText().color().name(), size="9pt")
    plot.setLabel("bottom", x_label, color=text)
    for axis in ("left", "bottom"):
        plot.getAxis(axis).setTextPen(text)
        plot.getAxis(axis).setPen(text)
        plot.getAxis(axis).enableAutoSIPrefix(False)  # "seconds (x0.001)" reads worse than 0.05
    plot.setMouseEnabled(False, False)
    plot.hideButtons()
    plot.setMenuEnabled(False)
    plot.showGrid(x=False, y=True, alpha=0.25)
    plot.setMinimumHeight(110)
    plot.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Expanding)
    return plot


def integer_ticks(plot: pg.PlotWidget, values) -> None:
    """Label a bar chart's x axis with its categories only (draft positions, counts)."""
    plot.getAxis("bottom").setTicks([[(v, str(v)) for v in values]])


def format_status(stats: RunStats, k: int) -> str:
    parts = [f"{stats.tokens} tokens", f"{stats.tok_per_s:.1f} tok/s"]
    if k > 0:
        parts += [f"acceptance {stats.acceptance_rate:.2f}", f"{stats.mean_accepted_length:.2f} tok/pass"]
    else:
        parts += ["no speculation"]
    busy = stats.draft_s + stats.verify_s
    if busy > 0:
        share = stats.draft_s / busy
        parts.append(f"draft/verify {share:.0%}/{1 - share:.0%}")
    return " · ".join(parts)


class ChartPanel(QWidget):
    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.series = RunSeries()
        self.k = 0
        self._accumulator: Optional[StatsAccumulator] = None
        self._final: Optional[RunStats] = None
        self._dirty = False
        self.repaints = 0  # refreshes that drew something (tests and the stall probe read it)

        self.setMinimumWidth(300)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.setSpacing(4)
        line, fill = theme.accent(self.palette()), theme.secondary(self.palette())
        self.rate_plot = make_plot("tokens / s", "seconds", self)
        self.rate_curve = self.rate_plot.plot(pen=pg.mkPen(line, width=2))
        self.acceptance_plot = make_plot("acceptance rate", "seconds", self)
        self.acceptance_plot.setYRange(0, 1.05, padding=0)
        self.acceptance_curve = self.acceptance_plot.plot(pen=pg.mkPen(fill, width=2), connect="finite")
        self.position_plot = make_plot("acceptance per draft position", "draft position", self)
        self.position_plot.setYRange(0, 1.05, padding=0)
        self.position_bars = pg.BarGraphItem(x=[], height=[], width=0.6, brush=fill, pen=None)
        self.position_plot.addItem(self.position_bars)
        self.histogram_plot = make_plot("passes by accepted draft tokens", "accepted per pass", self)
        self.histogram_bars = pg.BarGraphItem(x=[], height=[], width=0.6, brush=line, pen=None)
        self.histogram_plot.addItem(self.histogram_bars)
        for curve in (self.rate_curve, self.acceptance_curve):
            curve.setClipToView(True)
            curve.setDownsampling(auto=True, method="peak")
        for plot in (self.rate_plot, self.acceptance_plot, self.position_plot, self.histogram_plot):
            layout.addWidget(plot, 1)
        self.status = QLabel("no run yet", self)
        self.status.setWordWrap(True)
        self.status.setObjectName("statusLine")
        layout.addWidget(self.status)

    # --- data in (cheap) --------------------------------------------------------
    def start_run(self, k: int) -> None:
        self.k = k
        self.series.reset()
        self._accumulator = StatsAccumulator(k)
        self._final = None
        self._dirty = True

    def add_batch(self, batch) -> None:
        if self._accumulator is None or batch.first:
            self.start_run(batch.k)
        starting = self.series.start is None
        self.series.extend(batch.events, batch.times)
        if starting:  # the same t = 0 as the series: when the first pass began
            self._accumulator.start(at=self.series.start)
        for event in batch.events:
            self._accumulator.add(event)
        self._dirty = True

    def finish_run(self, stats: RunStats) -> None:
        """The worker's final numbers (decode time measured where the engine ran)."""
        self._final = stats
        self._dirty = True

    def current_stats(self) -> Optional[RunStats]:
        if self._final is not None:
            return self._final
        return self._accumulator.snapshot() if self._accumulator is not None else None

    # --- drawing (timer) ----------------------------------------------------------
    def refresh(self) -> bool:
        if not self._dirty:
            return False
        self._dirty = False
        t, rate, acceptance = self.series.window_rates()
        self.rate_curve.setData(t, rate)
        if self.k > 0:
            self.acceptance_curve.setData(t, acceptance)
        else:
            self.acceptance_curve.setData([], [])
        stats = self.current_stats()
        if stats is not None:
            positions = np.arange(1, len(stats.per_position_drafted) + 1)
            self.position_bars.setOpts(x=positions, height=np.array(stats.per_position_acceptance), width=0.6)
            self.position_plot.setXRange(0.4, max(1, len(positions)) + 0.6, padding=0)
            integer_ticks(self.position_plot, positions.tolist())
            histogram = np.array(stats.accepted_length_histogram, dtype=float)
            self.histogram_bars.setOpts(x=np.arange(len(histogram)), height=histogram, width=0.6)
            self.histogram_plot.setXRange(-0.6, max(0, len(histogram) - 1) + 0.6, padding=0)
            integer_ticks(self.histogram_plot, list(range(len(histogram))))
            self.status.setText(format_status(stats, self.k))
        self.repaints += 1
        return True
