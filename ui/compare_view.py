"""The Compare tab: one prompt, baseline then speculative, side by side; and a k sweep.

Both runs go through app/runtime/compare.py on the one engine worker, one after the other (run
at the same time they would share cores and distort each other). Streamed text is
buffered and drawn by `refresh()` from the window's repaint timer.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontDatabase, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (QAbstractItemView, QCheckBox, QDoubleSpinBox, QGridLayout, QGroupBox, QHBoxLayout,
                               QLabel, QPlainTextEdit, QPushButton, QSplitter, QTableWidget, QTableWidgetItem,
                               QTextBrowser, QVBoxLayout, QWidget)

from specdesk.app.runtime.chat_controller import TurnRequest
from specdesk.engines.types import SpecDeskError

from . import theme
from .charts import integer_ticks, make_plot

RequestSource = Callable[[], TurnRequest]  # (spec, sampling, max tokens, backend): the window's
SWEEP_KS = tuple(range(1, 9))
PASS_COST_TITLE = "pass cost against k"
PLOT_MIN_HEIGHT = 100  # pixels: a plot with room for its bars or points under its title and axis
CODE_PROMPT = "def parse_args(argv):"  # the demo model continues code
# A chat model's prompt: an answer of a few hundred tokens, long enough to time (a haiku is not)
CHAT_PROMPT = "Explain in a short paragraph how a hash table works, then write a small Python example of one."


def speedup_text(report) -> str:
    """A finished compare's headline (app/runtime/compare.CompareReport.headline): the panes'
    medians divided, the runs' own speedups as a range, and a busy machine or too short a run beside it."""
    warnings = [w for w in (report.busy, getattr(report, "too_short", None)) if w]
    return report.headline("×") + "".join(f" · ⚠ {w}" for w in warnings)


def rate_digits(tok_per_s: float) -> int:
    """Decimals a tok/s figure is shown with: enough that dividing two of them gives the
    headline's speedup to within about 1%."""
    return 1 if tok_per_s >= 10 else 2


def sweep_point_text(point) -> str:
    """One finished k of a sweep: its median tok/s and spread, and its acceptance."""
    return f"k = {point.k}: {point.rate.ranged(' tok/s', 0)}, acceptance {point.stats.acceptance_rate:.2f}"


def sweep_summary(sweep) -> str:
    """A finished sweep's verdict: the best k when one is faster than the baseline beyond the
    noise, else that none is (and the fastest, for reference); a busy machine is said too."""
    best, fastest = sweep.best(), sweep.fastest()
    base = f"baseline {sweep.baseline_rate.ranged(' tok/s', 0)}"
    if best is not None:
        text = f"best: k = {best.k}, {best.rate.median:.0f} tok/s ({best.speedup.ranged('×')} of the {base})"
    elif fastest is not None and fastest.speedup is not None:
        text = (f"no k is faster than the {base} beyond the noise: the fastest, k = {fastest.k}, "
                f"is {fastest.speedup.ranged('×')}")
    else:
        text = "no k finished"
    return text + (f" · ⚠ {sweep.busy}" if sweep.busy else "")


def auto_rows(report: dict) -> list[tuple[str, str]]:
    """Method auto's report as table rows: its share of steps by method and k, then the
    pass costs it chose with (measured in its own passes, or the probe's scaled)."""
    rows = [(label, f"{share:.0%} of steps") for label, share in report.get("steps_by_choice", {}).items()]
    costs = report.get("costs") or {}
    measured = set(costs.get("measured_sizes", []))
    for n, ms in enumerate(costs.get("pass_ms", []), start=1):
        rows.append((f"pass over {n} token{'s' if n > 1 else ''}",
                     f"{ms:.2f} ms ({'measured' if n in measured else 'from the probe'})"))
    for method, ms in costs.get("draft_token_ms", {}).items():
        rows.append((f"{method} drafting", f"{ms:.3f} ms per token"))
    return rows


class RunPane(QGroupBox):
    """One streaming run: title with live tok/s, and its text with accepted drafts tinted."""

    def __init__(self, title: str, parent: Optional[QWidget] = None):
        super().__init__(title, parent)
        self.title = title
        self.rate = QLabel("—", self)
        self.rate.setWordWrap(True)  # the figures and their range wrap in a narrow pane rather than widen it
        self.text = QTextBrowser(self)
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.FixedFont))
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(self.rate)
        layout.addWidget(self.text, 1)
        self.clear()

    def clear(self) -> None:
        self.pieces: list[str] = []
        self.from_draft: list[bool] = []
        self._pending: list[tuple[str, bool]] = []
        self._start: Optional[float] = None
        self._last: Optional[float] = None
        self._tokens = 0
        self.text.clear()
        self.rate.setText("waiting")

    def add_batch(self, batch) -> None:
        if self._start is None:
            first = batch.events[0]
            self._start = batch.times[0] - first.draft_s - first.verify_s
        self._last = batch.times[-1]
        self._tokens += len(batch.pieces)
        self.pieces.extend(batch.pieces)
        self.from_draft.extend(batch.from_draft)
        self._pending.extend(zip(batch.pieces, batch.from_draft))

    def refresh(self) -> None:
        if not self._pending:
            return
        cursor = QTextCursor(self.text.document())
        cursor.movePosition(QTextCursor.End)
        tint = theme.draft_tint(self.palette())
        for piece, drafted in self._pending:
            fmt = QTextCharFormat()
            if drafted:
                fmt.setBackground(tint)
            cursor.insertText(piece, fmt)
        self._pending.clear()
        seconds = (self._last or 0) - (self._start or 0)
        if seconds > 0:
            self.rate.setText(f"{self._tokens} tokens · {self._tokens / seconds:.1f} tok/s (streaming)")

    def show_result(self, stats, rate) -> None:
        """The run's numbers: the median tok/s over every run with their range
        (app/runtime/compare.Measure), the figure the headline divides; the tokens of the run on screen."""
        self.refresh()
        self.rate.setText(f"{rate.ranged(' tok/s', rate_digits(rate.median))} · {stats.tokens} tokens")
        self.rate.setToolTip("The median over the runs, then the slowest and the fastest run. The text "
                             "is the first run's.")

    def mark_token(self, index: int) -> None:
        """Tint the token at `index` (the first that differs from the other run)."""
        if index >= len(self.pieces):
            return
        start = sum(len(p) for p in self.pieces[:index])
        end = start + len(self.pieces[index])
        following = index + 1
        while end == start and following < len(self.pieces):  # a token that held back a split character
            end += len(self.pieces[following])
            following += 1
        if end == start:
            return
        cursor = QTextCursor(self.text.document())
        cursor.setPosition(start)
        cursor.setPosition(end, QTextCursor.KeepAnchor)
        fmt = QTextCharFormat()
        fmt.setBackground(theme.divergence_tint(self.palette()))
        fmt.setFontUnderline(True)
        cursor.mergeCharFormat(fmt)
        self.text.setTextCursor(cursor)
        self.text.ensureCursorVisible()


class CompareView(QWidget):
    apply_k = Signal(int)
    refused = Signal(str)  # a run that cannot start (no prompt, no method, a server without a baseline), in one line

    def __init__(self, worker, request_source: RequestSource, prompt: str = "", parent: Optional[QWidget] = None,
                 temperature: float = 0.0):
        super().__init__(parent)
        self.worker = worker
        self._request_source = request_source
        self._compare_job: Optional[int] = None
        self._sweep_job: Optional[int] = None
        self.report = None
        self.sweep_result = None
        self._sweep_points: list = []
        self._sweep_baseline = None
        self._sweep_allowed = True  # the k sweep runs on local models only

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(self._build_prompt_row(prompt, temperature))
        layout.addWidget(self._build_panes(), 3)
        layout.addWidget(self.verdict)
        layout.addWidget(self.details)
        layout.addWidget(self.auto_table)
        layout.addLayout(self._build_plots(), 2)
        layout.addLayout(self._build_sweep_row())

        worker.stream.connect(self._on_stream)
        worker.partial.connect(self._on_partial)
        worker.finished.connect(self._on_finished)
        worker.errored.connect(self._on_errored)

    def _build_prompt_row(self, prompt: str, temperature: float) -> QHBoxLayout:
        """The prompt, and beside it Run, Sweep, Stop, Chat template and the compare's temperature."""
        self.prompt = QPlainTextEdit(self)
        self.prompt.setPlaceholderText("A prompt to run without and with speculation")
        self.prompt.setPlainText(prompt)
        self.prompt.setFixedHeight(self.prompt.fontMetrics().lineSpacing() * 3 + 12)  # three lines
        self.chat_box = QCheckBox("Chat template", self)
        self.chat_box.setChecked(True)
        self.chat_box.setToolTip("Wrap the prompt in the model's chat template as one user message "
                                 "(off: the prompt is raw text to continue)")
        self.run_button = QPushButton("Run compare", self)
        self.run_button.clicked.connect(lambda: self._start(self.run_compare))
        self.sweep_button = QPushButton(f"Sweep k = {SWEEP_KS[0]}..{SWEEP_KS[-1]}", self)
        self.sweep_button.setToolTip("Run the prompt at every k and plot throughput against k")
        self.sweep_button.clicked.connect(lambda: self._start(self.run_sweep))
        self.stop_button = QPushButton("Stop", self)
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.stop)
        # The compare's own temperature: greedy shows identical outputs; the chat keeps the left panel's.
        self.temperature_spin = QDoubleSpinBox(self)
        self.temperature_spin.setRange(0.0, 10.0)
        self.temperature_spin.setSingleStep(0.1)
        self.temperature_spin.setDecimals(2)
        self.temperature_spin.setSpecialValueText("0 (greedy)")
        self.temperature_spin.setValue(temperature)
        self.temperature_spin.setToolTip("Temperature of the compare and the sweep only (the chat uses the left "
                                         "panel's): at 0 the outputs must be identical token for token")
        temperature_label = QLabel("Temperature", self)
        temperature_label.setBuddy(self.temperature_spin)
        top = QHBoxLayout()
        top.addWidget(self.prompt, 1)
        buttons = QGridLayout()  # two rows: the panes below keep the height of a short window
        buttons.setVerticalSpacing(2)
        buttons.addWidget(self.run_button, 0, 0)
        buttons.addWidget(self.sweep_button, 0, 1)
        buttons.addWidget(self.stop_button, 0, 2)
        buttons.addWidget(self.chat_box, 1, 0)
        buttons.addWidget(temperature_label, 1, 1, Qt.AlignRight)
        buttons.addWidget(self.temperature_spin, 1, 2)
        top.addLayout(buttons)
        return top

    def _build_panes(self) -> QSplitter:
        """The two runs side by side; under them the verdict, its details and auto's choices."""
        self.baseline_pane = RunPane("Baseline (no speculation)", self)
        self.speculative_pane = RunPane("Speculative", self)
        panes = QSplitter(self)
        panes.addWidget(self.baseline_pane)
        panes.addWidget(self.speculative_pane)

        self.verdict = QLabel("Run a compare to see the speedup and whether the outputs are identical.", self)
        self.verdict.setWordWrap(True)
        self.details = QLabel("", self)
        self.details.setWordWrap(True)
        # Method auto: which method and k it chose how often, and the costs it chose with.
        self.auto_table = QTableWidget(0, 2, self)
        self.auto_table.setHorizontalHeaderLabels(["auto chose", ""])
        self.auto_table.verticalHeader().setVisible(False)
        self.auto_table.horizontalHeader().setStretchLastSection(True)
        self.auto_table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.auto_table.setFocusPolicy(Qt.NoFocus)
        rows = self.auto_table.verticalHeader().defaultSectionSize()  # three rows in view, the rest scroll
        self.auto_table.setMaximumHeight(rows * 3 + self.auto_table.horizontalHeader().sizeHint().height() + 4)
        self.auto_table.setVisible(False)
        return panes

    def _build_plots(self) -> QHBoxLayout:
        """Acceptance per draft position, throughput against k, and the pass cost against k."""
        self.position_plot = make_plot("speculative: acceptance per draft position", "draft position", self,
                                       "acceptance per draft position", "acceptance per position")
        self.position_plot.setYRange(0, 1.05, padding=0)
        self.position_bars = pg.BarGraphItem(x=[], height=[], width=0.6, brush=theme.secondary(self.palette()),
                                             pen=None)
        self.position_plot.addItem(self.position_bars)
        self.sweep_plot = make_plot("throughput against k", "k", self, "tok/s against k")
        self.sweep_plot.setLabel("left", "tok/s", color=theme.muted(self.palette()).name())
        self.sweep_curve = self.sweep_plot.plot(pen=pg.mkPen(theme.accent(self.palette()), width=2), symbol="o",
                                                symbolSize=7, symbolBrush=theme.accent(self.palette()))
        self.sweep_best = self.sweep_plot.plot(pen=None, symbol="star", symbolSize=16,
                                               symbolBrush=theme.secondary(self.palette()))
        self.sweep_baseline_line = pg.InfiniteLine(angle=0, movable=False,
                                                   pen=pg.mkPen(theme.muted(self.palette()), width=1,
                                                                style=pg.QtCore.Qt.DashLine),
                                                   label="baseline", labelOpts={"position": 0.08,
                                                                               "color": theme.muted(self.palette())})
        self.sweep_baseline_line.setVisible(False)
        self.sweep_plot.addItem(self.sweep_baseline_line)
        self.sweep_plot.setXRange(SWEEP_KS[0] - 0.5, SWEEP_KS[-1] + 0.5, padding=0)
        self.sweep_plot.enableAutoRange(y=False)  # from zero, so small differences are not magnified
        integer_ticks(self.sweep_plot, SWEEP_KS)
        # What a verified pass costs against a one-token pass on the loaded placement (app/runtime/placement.pass_cost_ratio)
        self.cost_plot = make_plot(PASS_COST_TITLE, "k", self, "pass cost vs k")
        self.cost_plot.setLabel("left", "× 1 token", color=theme.muted(self.palette()).name())
        self.cost_curve = self.cost_plot.plot(pen=pg.mkPen(theme.secondary(self.palette()), width=2), symbol="o",
                                              symbolSize=7, symbolBrush=theme.secondary(self.palette()))
        self.cost_plot.setXRange(SWEEP_KS[0] - 0.5, SWEEP_KS[-1] + 0.5, padding=0)
        integer_ticks(self.cost_plot, SWEEP_KS)
        charts = QHBoxLayout()
        for plot in (self.position_plot, self.sweep_plot, self.cost_plot):
            plot.setMinimumHeight(PLOT_MIN_HEIGHT)
            charts.addWidget(plot, 1)
        return charts

    def _build_sweep_row(self) -> QHBoxLayout:
        """The sweep's verdict under the plots, across them (the plots keep their height), and Use the best k."""
        self.apply_button = QPushButton("Use the best k", self)
        self.apply_button.setEnabled(False)
        self.apply_button.clicked.connect(self._apply_best)
        self.sweep_status = QLabel("", self)
        self.sweep_status.setWordWrap(True)
        sweep_row = QHBoxLayout()
        sweep_row.addWidget(self.sweep_status, 1)
        sweep_row.addWidget(self.apply_button)
        return sweep_row

    # --- actions ------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._compare_job is not None or self._sweep_job is not None

    def set_available(self, available: bool, sweep: Optional[bool] = None) -> None:
        """The window disables new runs while the worker is busy or no model is loaded; `sweep`
        says whether the backend in use can run the k sweep (a server cannot)."""
        if sweep is not None:
            self._sweep_allowed = sweep
        self.run_button.setEnabled(available and not self.running)
        self.sweep_button.setEnabled(available and not self.running and self._sweep_allowed)
        self.stop_button.setEnabled(self.running)

    def temperature(self) -> float:
        return self.temperature_spin.value()

    def suit_prompt(self, chat_model: bool) -> None:
        """A prompt for the loaded model, unless the user wrote their own: a question for a chat
        model, code for the demo (which continues code rather than answering)."""
        text = self.prompt.toPlainText().strip()
        if chat_model and text in ("", CODE_PROMPT):
            self.prompt.setPlainText(CHAT_PROMPT)
        elif not chat_model and text == CHAT_PROMPT:
            self.prompt.setPlainText(CODE_PROMPT)

    def _request(self):
        text = self.prompt.toPlainText()
        if not text.strip():
            raise SpecDeskError("type a prompt to compare first")
        spec, sampling, max_tokens, backend = self._request_source()  # the window's: it checks the method
        return text, spec, sampling, max_tokens, backend

    def _start(self, run: Callable[[], Optional[int]]) -> None:
        """A button's run; what keeps it from starting goes to `refused` (the window says it)."""
        try:
            run()
        except SpecDeskError as e:
            self.refused.emit(str(e))

    def run_compare(self) -> Optional[int]:
        """Baseline then speculative on the backend in use (the local models, or a server)."""
        text, spec, sampling, max_tokens, backend = self._request()
        baseline, speculative = backend.arm_titles(spec)
        self.baseline_pane.clear()
        self.speculative_pane.clear()
        self.baseline_pane.setTitle(f"Baseline ({baseline})")
        self.speculative_pane.setTitle(f"Speculative ({speculative})")
        self.verdict.setText("running baseline, then speculative…")
        self.details.setText("")
        self.report = None
        self._compare_job = self.worker.compare(text, spec, sampling, max_tokens, chat=self.chat_box.isChecked(),
                                                backend=backend)
        self.set_available(False)
        return self._compare_job

    def run_sweep(self) -> Optional[int]:
        text, spec, sampling, max_tokens, backend = self._request()
        if not backend.local:
            raise SpecDeskError("the k sweep runs on local models: Servers > Use local models first")
        self._sweep_points = []
        self._sweep_baseline = None
        self.sweep_result = None
        self.apply_button.setEnabled(False)
        self.apply_button.setText("Use the best k")
        self.sweep_best.setData([], [])
        self.sweep_curve.setData([], [])
        self.cost_curve.setData([], [])
        self.sweep_baseline_line.setVisible(False)
        self.sweep_status.setText(f"sweeping {spec.method} over k = {SWEEP_KS[0]}..{SWEEP_KS[-1]}…")
        self._sweep_job = self.worker.sweep(text, spec, sampling, max_tokens, SWEEP_KS, chat=self.chat_box.isChecked())
        self.set_available(False)
        return self._sweep_job

    def stop(self) -> None:
        for job in (self._compare_job, self._sweep_job):
            if job is not None:
                self.worker.stop(job)

    def _apply_best(self) -> None:
        best = self.sweep_result.best() if self.sweep_result else None
        if best is not None:
            self.apply_k.emit(best.k)

    # --- worker signals -----------------------------------------------------------------
    def _on_stream(self, batch) -> None:
        if batch.job_id != self._compare_job:
            return
        pane = self.baseline_pane if batch.label == "baseline" else self.speculative_pane
        pane.add_batch(batch)

    def refresh(self) -> None:
        self.baseline_pane.refresh()
        self.speculative_pane.refresh()

    def _fit_sweep_range(self) -> None:
        values = [p.rate.median for p in self._sweep_points]
        if self._sweep_baseline is not None:
            values.append(self._sweep_baseline.tok_per_s)
        self.sweep_plot.setYRange(0, max(values, default=1.0) * 1.15 or 1.0, padding=0)

    def _on_partial(self, item) -> None:
        job_id, point = item
        if job_id != self._sweep_job:
            return
        if point.k == 0:
            self._sweep_baseline = point.stats
            self.sweep_baseline_line.setValue(point.rate.median)
            self.sweep_baseline_line.setVisible(True)
        else:
            self._sweep_points.append(point)
            self.sweep_curve.setData([p.k for p in self._sweep_points],
                                     [p.rate.median for p in self._sweep_points])
            self.sweep_status.setText(sweep_point_text(point))
            self._show_pass_costs()
        self._fit_sweep_range()

    def _show_pass_costs(self) -> None:
        from specdesk.app.runtime.placement import pass_cost_ratio

        if self._sweep_baseline is None:
            return
        ratios = [(p.k, pass_cost_ratio(self._sweep_baseline, p.stats)) for p in self._sweep_points]
        ratios = [(k, r) for k, r in ratios if r is not None]
        self.cost_curve.setData([k for k, _ in ratios], [r for _, r in ratios])
        self.cost_plot.setYRange(0, max((r for _, r in ratios), default=1.0) * 1.15 or 1.0, padding=0)

    def set_placement(self, placement: str) -> None:
        """Where the loaded models sit: the pass-cost plot is for that placement."""
        self.cost_plot.title_fit.set(f"{PASS_COST_TITLE}: {placement}" if placement else PASS_COST_TITLE,
                                     PASS_COST_TITLE, "pass cost vs k")

    def _on_finished(self, result) -> None:
        if result.job_id == self._compare_job:
            self._compare_job = None
            self._show_report(result.value)
        elif result.job_id == self._sweep_job:
            self._sweep_job = None
            self._show_sweep(result.value)
        else:
            return
        self.set_available(not self.worker.busy)

    def _on_errored(self, error) -> None:
        if error.job_id == self._compare_job:
            self._compare_job = None
            self.verdict.setText("the compare did not run (see the message)")
        elif error.job_id == self._sweep_job:
            self._sweep_job = None
            self.sweep_status.setText("the sweep did not run (see the message)")
        else:
            return
        self.set_available(not self.worker.busy)

    # --- results ------------------------------------------------------------------------
    def show_report(self, report) -> None:
        """A finished compare's verdict, numbers and charts (from the worker, or a served engine)."""
        self._show_report(report)

    def _show_report(self, report) -> None:
        self.report = report
        self.refresh()
        if not report.results:
            self.verdict.setText("stopped before any run finished")
            return
        result = report.results[0]
        base, spec = result.baseline.stats, result.speculative.stats
        self.baseline_pane.show_result(base, report.baseline_rate)
        self.speculative_pane.show_result(spec, report.speculative_rate)
        pace = speedup_text(report)
        good = theme.secondary(self.palette()).name()
        stopped = "cancelled" in (result.baseline.finish_reason, result.speculative.finish_reason)
        if stopped:
            verdict = "stopped early: outputs not compared"
            colour = theme.muted(self.palette()).name()
        elif report.identical_outputs is None:
            verdict = (f"sampled at T = {report.temperature:g}: outputs differ by design; "
                       "speculative sampling keeps the target's distribution")
            colour = theme.muted(self.palette()).name()
        elif report.identical_outputs and not result.baseline.tokens:  # a server sends text, not token ids
            verdict = f"identical output ✓ ({base.tokens} tokens, the same text)"
            colour = good
        elif report.identical_outputs:
            verdict = f"identical output ✓ ({len(result.baseline.tokens)} tokens, token for token)"
            colour = good
        elif not result.baseline.tokens:
            verdict = f"outputs differ from character {result.first_text_difference()} ✗"
            colour = "#d04040"
        else:
            at = result.first_divergence()
            first = next((d for d in report.divergences if d.prompt == 0), None)
            if first is not None and first.kind == "near_tie":
                noise = (f", within this model's measured noise of {first.noise:.2g}"
                         if first.noise is not None and first.noise > first.logit_gap else " (numerical noise)")
                verdict = (f"outputs differ from token {at} (marked): the arithmetic, not a bug: the target's top two "
                           f"logits differ by {first.logit_gap:.2g} there{noise}")
                colour = theme.muted(self.palette()).name()
            else:
                gap = "" if first is None else f": a mismatch, top-two logit gap {first.logit_gap:.3g}"
                verdict = f"outputs differ from token {at} (marked){gap} ✗"
                colour = "#d04040"
            self.baseline_pane.mark_token(at)
            self.speculative_pane.mark_token(at)
        self.verdict.setText(f'<span style="font-size:12pt; font-weight:600">{pace}</span>'
                             f'&nbsp;&nbsp;·&nbsp;&nbsp;<span style="color:{colour}">{verdict}</span>')
        self.verdict.setProperty("identical", report.identical_outputs)
        share = spec.draft_s / max(1e-9, spec.draft_s + spec.verify_s)
        timing = (f" · drafting {share:.0%}, verifying {1 - share:.0%}" if spec.draft_s + spec.verify_s > 0
                  else "")  # a server does not say how long drafting took
        spec_rate, base_rate = report.speculative_rate.median, report.baseline_rate.median
        self.details.setText(f"medians: speculative {spec_rate:.{rate_digits(spec_rate)}f} ÷ baseline "
                             f"{base_rate:.{rate_digits(base_rate)}f} tok/s · acceptance {spec.acceptance_rate:.2f} "
                             f"({spec.accepted}/{spec.drafted} drafts), {spec.mean_accepted_length:.2f} tok/pass{timing}")
        self.show_auto(report.auto_report() if getattr(report, "method", None) == "auto" else None)
        acceptance = spec.per_position_acceptance
        self.position_bars.setOpts(x=np.arange(1, len(acceptance) + 1), height=np.array(acceptance), width=0.6)
        self.position_plot.setXRange(0.4, max(1, len(acceptance)) + 0.6, padding=0)
        integer_ticks(self.position_plot, list(range(1, len(acceptance) + 1)))

    def show_auto(self, report: Optional[dict]) -> None:
        rows = auto_rows(report) if report else []
        self.auto_table.setRowCount(len(rows))
        for row, cells in enumerate(rows):
            for column, text in enumerate(cells):
                self.auto_table.setItem(row, column, QTableWidgetItem(text))
        self.auto_table.resizeColumnToContents(0)
        self.auto_table.setVisible(bool(rows))

    def _show_sweep(self, sweep) -> None:
        self.sweep_result = sweep
        points = sweep.points
        self._sweep_points, self._sweep_baseline = list(points), sweep.baseline
        self._fit_sweep_range()
        self.sweep_curve.setData([p.k for p in points], [p.rate.median for p in points])
        self.sweep_baseline_line.setValue(sweep.baseline_rate.median)
        self.sweep_baseline_line.setVisible(True)
        self.sweep_status.setText(sweep_summary(sweep) if points else "stopped before any k finished")
        best = sweep.best()  # None within the noise of the baseline: no star, nothing to use
        self.sweep_best.setData([best.k] if best else [], [best.rate.median] if best else [])
        self.apply_button.setText(f"Use k = {best.k}" if best else "Use the best k")
        self.apply_button.setEnabled(best is not None)
