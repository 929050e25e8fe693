"""The right-hand panel: live speculation charts and the status line.

Events are only recorded when they arrive (`add_batch`, O(events)); drawing happens in
`refresh()`, which the window calls from its ~30 Hz timer and which does nothing when no
new data came in. Curves are fed from RunSeries' preallocated arrays.

With method auto, the tokens/s and acceptance charts show which method drafted when: a
translucent colour band behind the curves per method (one small image per chart, resampled
to MethodBands.BINS slices, so its cost does not grow with the run), a legend of the methods
this run used above the charts (a line of text that wraps: never drawn over a curve, never cut
by a chart's edge), and the latest choice and k in the tokens/s title ("auto now: draft, k = 3").

A served reply's events count what its stream let them count (app/serving/stream.py): tokens,
or characters where the server sends no token counts while streaming, which `set_unit` names
in the title. When the reply ends, the server's token count scales the curve, so the finished
chart and the footer give the same tok/s. `reset()` empties the panel (another chat opened).
"""

from __future__ import annotations

import html
from typing import Optional

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, QObject, QRectF, Qt, QTimer
from PySide6.QtWidgets import QApplication, QGraphicsItem, QGridLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from specdesk.app.runtime.chat_controller import format_status
from specdesk.engines.methods import method_color as row_color
from specdesk.engines.speculation.stats import StatsAccumulator
from specdesk.engines.types import RunStats

UNKNOWN_TOKEN = -1  # app/serving/stream.UNKNOWN_TOKEN: a served token whose id the stream did not carry

from . import theme
from .series import RunSeries

pg.setConfigOptions(antialias=False)  # smoothing costs more CPU than it adds at 30 Hz

NICE_STEPS = (1, 2, 2.5, 5, 10)
CURVE_EVERY = 2  # curves redraw on every second refresh call (~15 Hz)
BAR_EVERY = 6  # bars and numbers on every sixth (~5 Hz), and always for a run's final numbers
PLOT_MIN_HEIGHT = 72  # pixels: four plots and the status line fit under the chat in a 640 px window
PANEL_MIN_WIDTH = 260  # pixels: beside the chat; narrower than this and the window folds it under


def nice_ceiling(value: float, minimum: float = 1.0) -> float:
    """The next "round" number at or above value (1, 2, 2.5, 5 x 10^n), at least minimum.

    Axis ranges only move to such numbers and only grow during a run, so the axes (whose
    repainting costs far more than the curves') are redrawn a few times per run, not per frame."""
    value = max(value, minimum)
    scale = 10 ** np.floor(np.log10(value))
    for step in NICE_STEPS:
        if step * scale >= value:
            return float(step * scale)
    return float(10 * scale)


TITLE_POINTS = 9
TITLE_MARGIN = 4  # pixels kept clear at the plot's edge


class TitleFit(QObject):
    """A plot's title: the longest of its wordings that the plot's width shows whole, chosen
    again when the plot is resized (a title wider than its plot is cut at both ends); the
    longest wording is the plot's tooltip."""

    def __init__(self, plot: pg.PlotWidget):
        super().__init__(plot)
        self.plot = plot
        self.wordings: tuple[str, ...] = ()
        self.shown = ""
        plot.installEventFilter(self)

    def set(self, *wordings: str) -> None:
        self.wordings = tuple(w for w in wordings if w)
        self.plot.setToolTip(self.wordings[0] if len(self.wordings) > 1 else "")
        self.fit()

    def fit(self) -> None:
        """Try the wordings, longest first, as the title draws them: centred over the plot's
        area (right of its axis), each must fit between that centre and the nearer edge."""
        label = self.plot.getPlotItem().titleLabel
        for title in self.wordings:
            self._show(title)
            item = label.item
            width = item.boundingRect().width() - 2 * item.document().documentMargin()
            centre = self.plot.mapFromScene(label.sceneBoundingRect().center()).x()
            if width <= 2 * min(centre, self.plot.width() - centre) - TITLE_MARGIN:
                return

    def _show(self, title: str) -> None:
        if title != self.shown:
            self.shown = title
            palette = self.plot.palette()
            self.plot.setTitle(title, color=palette.windowText().color().name(), size=f"{TITLE_POINTS}pt")

    def eventFilter(self, watched, event) -> bool:  # noqa: N802
        if event.type() == QEvent.Resize and self.wordings:
            # after the plot has laid its items out for the new size (a filter sees the event first)
            QTimer.singleShot(0, self, self.fit)  # dropped if the plot (and this, its child) is gone
        return False


def make_plot(title: str, x_label: str, parent: Optional[QWidget] = None, *shorter: str) -> pg.PlotWidget:
    """A small, static plot styled after the current palette (no mouse panning); its title is
    the longest of `title` and the `shorter` wordings that its width shows whole."""
    palette = parent.palette() if parent is not None else QApplication.palette()
    plot = pg.PlotWidget(parent=parent, background=palette.base().color())
    text = theme.muted(palette).name()
    plot.title_fit = TitleFit(plot)
    plot.title_fit.set(title, *shorter)
    plot.setLabel("bottom", x_label, color=text)
    for axis in ("left", "bottom"):
        plot.getAxis(axis).setTextPen(text)
        plot.getAxis(axis).setPen(text)
        plot.getAxis(axis).enableAutoSIPrefix(False)  # "seconds (x0.001)" reads worse than 0.05
        # Axes are repainted whenever a curve next to them changes; drawn from a cached pixmap,
        # that costs a copy instead of laying out every tick label again at 30 Hz.
        plot.getAxis(axis).setCacheMode(QGraphicsItem.DeviceCoordinateCache)
    plot.setMouseEnabled(False, False)
    plot.disableAutoRange()  # ranges are set by ChartPanel in round steps (see nice_ceiling)
    plot.hideButtons()
    plot.setMenuEnabled(False)
    plot.showGrid(x=False, y=True, alpha=0.25)
    plot.setMinimumHeight(PLOT_MIN_HEIGHT)
    plot.setFocusPolicy(Qt.NoFocus)  # nothing to type into: Tab skips it
    plot.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Expanding)
    return plot


# One colour per method, its row's (engines/methods.py), the same in every run (RGBA; the band's
# alpha keeps the curves readable). auto's own four and "none" are told apart at a glance.
OTHER_COLOR = (120, 144, 156)
BAND_ALPHA = 72
METHOD_LABELS = {"none": "no speculation"}


def method_color(method: str, alpha: int = BAND_ALPHA) -> tuple[int, int, int, int]:
    return (*(row_color(method) or OTHER_COLOR), alpha)


class MethodBands:
    """Method auto's bands behind one chart: a 1-pixel-high image of BINS slices over the run's
    time, coloured by the method of the step under each slice (transparent where none was
    named), stretched over the chart's x span and its y range."""

    BINS = 512

    def __init__(self, plot: pg.PlotWidget):
        self.image = pg.ImageItem(axisOrder="row-major")
        self.image.setZValue(-100)  # behind the curves and the grid
        # Repainted with every curve frame: drawn from a cached pixmap unless the bands changed.
        self.image.setCacheMode(QGraphicsItem.DeviceCoordinateCache)
        self.image.setVisible(False)
        plot.addItem(self.image)
        self._codes: Optional[np.ndarray] = None
        self._rect: Optional[tuple] = None
        self._lut = np.zeros((1, 4), dtype=np.uint8)

    def clear(self) -> None:
        self.image.setVisible(False)
        self._codes = self._rect = None

    def show(self, bands: tuple[float, np.ndarray], names: list[str], y_top: float) -> None:
        t_end, codes = bands
        if len(self._lut) != len(names) + 1:  # a new method: one more colour (row 0: no method named)
            self._lut = np.array([(0, 0, 0, 0)] + [method_color(m) for m in names], dtype=np.uint8)
        if self._codes is None or not np.array_equal(codes, self._codes):
            self._codes = codes.copy()
            self.image.setImage(self._lut[codes + 1][None, :, :], autoLevels=False, levels=(0, 255))
        rect = (t_end, y_top)
        if rect != self._rect:
            self._rect = rect
            self.image.setRect(QRectF(0.0, 0.0, max(t_end, 1e-9), y_top))
        self.image.setVisible(True)


class MethodLegend(QLabel):
    """Method auto's legend: each method this run drafted with, behind a swatch of its band's
    colour as it shows over the chart's background; hidden when no method was named."""

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.setWordWrap(True)
        self.setTextFormat(Qt.RichText)
        self.methods: list[str] = []  # in the order the run first used them
        self.hide()

    @property
    def labels(self) -> list[str]:
        return [METHOD_LABELS.get(m, m) for m in self.methods]

    def show_methods(self, methods: list[str]) -> None:
        if list(methods) == self.methods:
            return
        self.methods = list(methods)
        background = self.palette().base().color()
        entries = []
        for method, label in zip(self.methods, self.labels):
            *rgb, alpha = method_color(method)
            mixed = [round(c * alpha / 255 + b * (1 - alpha / 255))  # the band over the chart's background
                     for c, b in zip(rgb, (background.red(), background.green(), background.blue()))]
            entries.append(f'<span style="background-color:rgb({mixed[0]},{mixed[1]},{mixed[2]})">&nbsp;&nbsp;&nbsp;'
                           f'</span>&nbsp;{html.escape(label).replace(" ", "&nbsp;")}')  # an entry never breaks
        self.setText("&nbsp;&nbsp; ".join(entries))
        self.setVisible(bool(self.methods))


def integer_ticks(plot: pg.PlotWidget, values) -> None:
    """Label a bar chart's x axis with its categories only (draft positions, counts); the
    clipping check (ui/clipping.py) reads them back to find one the axis had no room for."""
    ticks = [(v, str(v)) for v in values]
    axis = plot.getAxis("bottom")
    axis.setTicks([ticks])
    axis.category_ticks = ticks


def rate_title(unit: str) -> str:
    """The rate chart's title for what its events count: "tokens / s", or "characters / s (why)"."""
    name, _, why = unit.partition(" (")
    return f"{name} / s" + (f" ({why}" if why else "")


class ChartPanel(QWidget):
    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.series = RunSeries()
        self.k = 0
        self._accumulator: Optional[StatsAccumulator] = None
        self._final: Optional[RunStats] = None
        self._dirty = False
        self._ranges: dict[str, tuple] = {}  # what each plot's axes show now
        self._ticks = 0
        self.repaints = 0  # refreshes that drew something (tests and the stall probe read it)
        self.unit = "tokens"  # what the events' token counts are (a served stream may count characters)
        self.rate_scale = 1.0  # tokens per counted unit: set from the server's count when a served reply ends
        self._served = False  # this run's events came from a server (no token ids)

        self.setMinimumWidth(PANEL_MIN_WIDTH)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.setSpacing(4)
        line, fill = theme.accent(self.palette()), theme.secondary(self.palette())
        self.rate_title = "tokens / s"
        self.rate_plot = make_plot(self.rate_title, "seconds", self)
        self.rate_curve = self.rate_plot.plot(pen=pg.mkPen(line, width=2))
        self.acceptance_plot = make_plot("acceptance rate", "seconds", self)
        self.acceptance_plot.setYRange(0, 1.05, padding=0)
        self.acceptance_curve = self.acceptance_plot.plot(pen=pg.mkPen(fill, width=2), connect="finite")
        self.position_plot = make_plot("acceptance per draft position", "draft position", self,
                                       "acceptance per position", "per position")
        self.position_plot.setYRange(0, 1.05, padding=0)
        self.position_bars = pg.BarGraphItem(x=[], height=[], width=0.6, brush=fill, pen=None)
        self.position_plot.addItem(self.position_bars)
        self.histogram_plot = make_plot("passes by accepted draft tokens", "accepted per pass", self,
                                        "passes by tokens accepted", "passes")
        self.histogram_bars = pg.BarGraphItem(x=[], height=[], width=0.6, brush=line, pen=None)
        self.histogram_plot.addItem(self.histogram_bars)
        for curve in (self.rate_curve, self.acceptance_curve):
            curve.setClipToView(True)
            curve.setDownsampling(auto=True, method="peak")
        self._grid = QGridLayout()
        self._grid.setSpacing(4)
        self._plots = (self.rate_plot, self.acceptance_plot, self.position_plot, self.histogram_plot)
        self.columns = 0
        self.fold(False)
        # Method auto: which method drafted when (bands), their legend, the latest choice (title).
        self.method_legend = MethodLegend(self)
        layout.addWidget(self.method_legend)
        layout.addLayout(self._grid, 1)
        self.rate_bands = MethodBands(self.rate_plot)
        self.acceptance_bands = MethodBands(self.acceptance_plot)
        self.status = QLabel("no run yet", self)
        self.status.setWordWrap(True)
        self.status.setObjectName("statusLine")
        # A fixed two-line box: new numbers never make the layout re-measure the plots above.
        self.status.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Fixed)
        self.status.setFixedHeight(self.status.fontMetrics().lineSpacing() * 2 + 6)
        layout.addWidget(self.status)

    def fold(self, folded: bool) -> None:
        """The plots in one column beside the chat, or two columns of two under it (folded)."""
        columns = 2 if folded else 1
        if columns == self.columns:
            return
        self.columns = columns
        for plot in self._plots:
            self._grid.removeWidget(plot)
        rows = len(self._plots) // columns
        for i, plot in enumerate(self._plots):
            self._grid.addWidget(plot, i // columns, i % columns)
        for row in range(len(self._plots)):
            self._grid.setRowStretch(row, 1 if row < rows else 0)
        for column in range(2):
            self._grid.setColumnStretch(column, 1 if column < columns else 0)

    # --- data in (cheap) --------------------------------------------------------
    def start_run(self, k: int) -> None:
        self.k = k
        self._ranges.clear()
        self.series.reset()
        self._clear_methods()
        self._accumulator = StatsAccumulator(k)
        self._final = None
        self.rate_scale = 1.0
        self._served = False
        self._dirty = True

    def set_unit(self, unit: str) -> None:
        """What the coming run's events count ("tokens", or a served stream's "characters ...")."""
        self.unit = unit
        self._set_rate_title(rate_title(unit), rate_title(unit).split(" (")[0])

    def reset(self) -> None:
        """No run: empty curves and bars, the status line back to its start (a chat was switched)."""
        self.start_run(0)
        self._accumulator = None
        self.unit = "tokens"
        self.rate_curve.setData([], [])
        self.acceptance_curve.setData([], [])
        self.position_bars.setOpts(x=[], height=[], width=0.6)
        self.histogram_bars.setOpts(x=[], height=[], width=0.6)
        self.status.setText("no run yet")
        self._dirty = False

    def add_batch(self, batch) -> None:
        if self._accumulator is None or batch.first:
            self.start_run(batch.k)
        starting = self.series.start is None
        self.series.extend(batch.events, batch.times)
        if starting:  # the same t = 0 as the series: when the first pass began
            self._accumulator.start(at=self.series.start)
        for event in batch.events:
            self._accumulator.add(event)
            self._served = self._served or (bool(event.tokens) and event.tokens[0] == UNKNOWN_TOKEN)
        if not self._served and self.unit != "tokens":  # an engine's run after a served one: tokens again
            self.set_unit("tokens")
        self._dirty = True

    def finish_run(self, stats: RunStats) -> None:
        """The worker's final numbers (decode time measured where the engine ran). A served
        reply's curve is scaled to the server's token count (its chunks may have counted otherwise)."""
        self._final = stats
        counted = float(self.series.tokens[self.series.n - 1])
        if self._served and stats.tokens > 0 and counted > 0:
            self.rate_scale = stats.tokens / counted
            self._ranges.pop("rate_y", None)  # the axis may shrink to the scaled curve
            self.set_unit("tokens")
        self._dirty = True

    def rates(self) -> tuple[np.ndarray, np.ndarray]:
        """(t, rate) as the tokens/s chart draws them."""
        t, rate, _ = self.series.window_rates()
        return t, rate * self.rate_scale

    def current_stats(self) -> Optional[RunStats]:
        if self._final is not None:
            return self._final
        return self._accumulator.snapshot() if self._accumulator is not None else None

    # --- drawing (timer) ----------------------------------------------------------
    def refresh(self) -> bool:
        """Draw what arrived. Called at ~30 Hz; on a busy machine every repaint takes CPU from
        the model, so curves redraw at half that rate and the bars and the numbers at a sixth
        (the final numbers of a run always show at once)."""
        if not self._dirty:
            return False
        self._ticks += 1
        final = self._final is not None
        if not final and self._ticks % CURVE_EVERY:
            return False
        self._dirty = False
        t, rate, acceptance = self.series.window_rates()
        rate = rate * self.rate_scale
        self.rate_curve.setData(t, rate)
        if self.k > 0:
            self.acceptance_curve.setData(t, acceptance)
        else:
            self.acceptance_curve.setData([], [])
        t_max = nice_ceiling(float(t[-1]) if len(t) else 0.0, minimum=1.0)
        finite = rate[np.isfinite(rate)] if len(rate) else rate
        y_max = nice_ceiling(1.1 * float(finite.max()) if len(finite) else 0.0, minimum=10.0)
        self._set_range("rate", self.rate_plot, (0, self._grown("rate_t", t_max)), (0, self._grown("rate_y", y_max)))
        self._set_range("acceptance", self.acceptance_plot, (0, self._grown("rate_t", t_max)), (0, 1.05))
        slow = final or self._ticks % BAR_EVERY == 0  # the bars' and bands' slower redraw
        self._draw_methods(slow)
        stats = self.current_stats()
        if stats is not None and slow:
            positions = np.arange(1, len(stats.per_position_drafted) + 1)
            self.position_bars.setOpts(x=positions, height=np.array(stats.per_position_acceptance), width=0.6)
            if self._set_range("position", self.position_plot, (0.4, max(1, len(positions)) + 0.6), (0, 1.05)):
                integer_ticks(self.position_plot, positions.tolist())
            histogram = np.array(stats.accepted_length_histogram, dtype=float)
            self.histogram_bars.setOpts(x=np.arange(len(histogram)), height=histogram, width=0.6)
            top = nice_ceiling(float(histogram.max()) * 1.05 if len(histogram) else 0.0, minimum=5.0)
            if self._set_range("histogram", self.histogram_plot, (-0.6, max(0, len(histogram) - 1) + 0.6),
                               (0, self._grown("histogram_y", top))):
                integer_ticks(self.histogram_plot, list(range(len(histogram))))
            text = format_status(stats, self.k)
            if text != self.status.text():
                self.status.setText(text)
        self.repaints += 1
        return True

    def _draw_methods(self, slow: bool) -> None:
        """Method auto: the bands, the legend (a method's first step) and the title's choice
        (when it changed) at the slow rate, like the bars: they change slowly, and the text
        re-lays out."""
        if not slow or not self.series.method_names:
            return
        bands = self.series.method_bands(MethodBands.BINS)
        if bands is None:
            return
        names = self.series.method_names
        self.rate_bands.show(bands, names, self._ranges["rate"][1][1])
        self.acceptance_bands.show(bands, names, 1.05)
        self.method_legend.show_methods(names)
        if self.series.choice:
            self._set_rate_title(f"tokens / s · auto now: {self.series.choice}", f"auto now: {self.series.choice}",
                                 "tokens / s")
        else:
            self._set_rate_title("tokens / s · auto", "tokens / s")

    def _clear_methods(self) -> None:
        self.rate_bands.clear()
        self.acceptance_bands.clear()
        self.method_legend.show_methods([])
        self._set_rate_title(rate_title(self.unit), rate_title(self.unit).split(" (")[0])

    def _set_rate_title(self, title: str, *shorter: str) -> None:
        """The tokens/s chart's title, or a shorter wording where the chart is narrow."""
        if title != self.rate_title:
            self.rate_title = title
            self.rate_plot.title_fit.set(title, *shorter)

    def _grown(self, key: str, value: float) -> float:
        """A range end that only grows during a run."""
        value = max(value, self._ranges.get(key, value))
        self._ranges[key] = value
        return value

    def _set_range(self, key: str, plot: pg.PlotWidget, x: tuple, y: tuple) -> bool:
        """Move a plot's axes only when the range changed; True when it did."""
        if self._ranges.get(key) == (x, y):
            return False
        self._ranges[key] = (x, y)
        plot.setXRange(*x, padding=0)
        plot.setYRange(*y, padding=0)
        return True
