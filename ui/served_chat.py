"""Chat with a served engine in the window: "Servers > Add server…" and the chat on it.

The dialog takes a base URL and an optional API key (kept in the OS keyring through
app/credentials.py, never in settings.json), connects on a background thread, lists the
server's models and says which charts it can fill. While a server is in use, the chat tab
streams from it: a Python thread iterates `Endpoint.stream_chat` (app/endpoint.py) and sends
coalesced batches to the GUI as queued signals, as the engine worker does; the same chart
panel draws tok/s from the stream and, when the reply ends, the server's own acceptance,
tokens per pass and per-position numbers. A failed reply keeps its text, marked partial.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Optional

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (QComboBox, QDialog, QDialogButtonBox, QFormLayout, QGroupBox, QHBoxLayout, QLabel,
                               QLineEdit, QPushButton, QVBoxLayout, QWidget)

from specdesk.app.credentials import load_key, store_key
from specdesk.app.endpoint import Endpoint, EndpointError, ServedRun, ServerInfo, base_url
from specdesk.engines.types import SpecDeskError, StepEvent

from .chat_view import ChatMessage
from .charts import format_status

BATCH_INTERVAL_S = 1 / 60
REPAINT_INTERVAL_MS = 33


@dataclass(frozen=True)
class ServedBatch:
    """Consecutive StepEvents of one streamed reply (what ChartPanel.add_batch reads)."""

    job_id: int
    label: str
    k: int
    first: bool
    events: tuple[StepEvent, ...]
    times: tuple[float, ...]
    pieces: tuple[str, ...]
    from_draft: tuple[bool, ...]


class Coalescer:
    """One run's StepEvents into ServedBatches, at most one per BATCH_INTERVAL_S (the first at once)."""

    def __init__(self, job_id: int, label: str, k: int, emit):
        self.job_id, self.label, self.k, self.emit = job_id, label, k, emit
        self.first, self.last_sent = True, 0.0
        self.events: list[StepEvent] = []
        self.times: list[float] = []

    def __call__(self, event: StepEvent) -> None:
        self.events.append(event)
        self.times.append(time.perf_counter())
        if self.first or time.perf_counter() - self.last_sent >= BATCH_INTERVAL_S:
            self.flush()

    def flush(self) -> None:
        if self.events:
            self.emit(ServedBatch(self.job_id, self.label, self.k, self.first, tuple(self.events), tuple(self.times),
                                  tuple(e.text for e in self.events), (False,) * len(self.events)))
            self.first, self.last_sent = False, time.perf_counter()
            self.events, self.times = [], []


class ConnectDialog(QDialog):
    """Base URL, optional API key; Connect lists the models and what the server reports."""

    probed = Signal(object, object)  # (Endpoint or None, ServerInfo or error message)

    def __init__(self, parent: Optional[QWidget] = None, url: str = ""):
        super().__init__(parent)
        self.setWindowTitle("Add server")
        self.endpoint: Optional[Endpoint] = None
        self.key_note = ""
        self.url_edit = QLineEdit(url, self)
        self.url_edit.setPlaceholderText("http://gpu-box:8000 (vLLM, SGLang, llama-server, specdesk serve, …)")
        self.key_edit = QLineEdit(self)
        self.key_edit.setEchoMode(QLineEdit.Password)
        self.key_edit.setPlaceholderText("optional; kept in the system keyring")
        self.connect_button = QPushButton("Connect", self)
        self.models = QComboBox(self)
        self.models.setEnabled(False)
        self.baseline_edit = QLineEdit(self)
        self.baseline_edit.setPlaceholderText("optional: the same model without speculation, for Compare")
        self.baseline: Optional[Endpoint] = None
        self.info = QLabel("", self)
        self.info.setWordWrap(True)
        self.buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel, self)
        self.buttons.button(QDialogButtonBox.Ok).setEnabled(False)
        form = QFormLayout()
        row = QHBoxLayout()
        row.addWidget(self.url_edit, 1)
        row.addWidget(self.connect_button)
        form.addRow("Server URL", row)
        form.addRow("API key", self.key_edit)
        form.addRow("Model", self.models)
        form.addRow("Baseline server", self.baseline_edit)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.info)
        layout.addWidget(self.buttons)
        self.resize(560, self.sizeHint().height())
        self.connect_button.clicked.connect(self.probe)
        self.url_edit.returnPressed.connect(self.probe)
        self.buttons.accepted.connect(self._accept)
        self.buttons.rejected.connect(self.reject)
        self.probed.connect(self._on_probed)

    def probe(self) -> None:
        """Connect on a background thread: a server that does not answer never freezes the window."""
        try:
            url = base_url(self.url_edit.text())
        except EndpointError as e:
            self.info.setText(str(e))
            return
        key = self.key_edit.text().strip() or load_key(url)
        endpoint = Endpoint(url, api_key=key, timeout=15.0)
        baseline_text = self.baseline_edit.text().strip()
        self.connect_button.setEnabled(False)
        self.info.setText(f"connecting to {url}…")

        def work() -> None:
            try:
                info = endpoint.probe()
                self.baseline = None
                if baseline_text:
                    baseline = Endpoint(baseline_text, api_key=key or load_key(base_url(baseline_text)),
                                        timeout=15.0)
                    baseline.probe()
                    self.baseline = baseline
                self.probed.emit(endpoint, info)
            except EndpointError as e:
                self.probed.emit(None, str(e))

        threading.Thread(target=work, daemon=True, name="specdesk-probe").start()

    def _on_probed(self, endpoint: Optional[Endpoint], outcome) -> None:
        self.connect_button.setEnabled(True)
        if endpoint is None:
            self.info.setText(outcome)
            self.models.clear()
            self.models.setEnabled(False)
            self.buttons.button(QDialogButtonBox.Ok).setEnabled(False)
            return
        info: ServerInfo = outcome
        self.endpoint = endpoint
        self.models.clear()
        self.models.addItems(list(info.models))
        self.models.setEnabled(bool(info.models))
        self.info.setText(charts_line(info))
        self.buttons.button(QDialogButtonBox.Ok).setEnabled(bool(info.models))

    def _accept(self) -> None:
        if self.endpoint is None:
            return
        self.endpoint.model = self.models.currentText()
        self.endpoint.timeout = 120.0
        if self.baseline is not None:
            self.baseline.timeout = 120.0
            if self.endpoint.model in self.baseline.info.models:
                self.baseline.model = self.endpoint.model
        typed = self.key_edit.text().strip()
        if typed:
            self.key_note = store_key(self.endpoint.url, typed)
        self.accept()


def charts_line(info: ServerInfo) -> str:
    """What the server reports, and so which charts a reply on it fills."""
    charts = ["tokens / s (from the stream)"]
    if info.per_request or info.metrics:
        charts.append("acceptance and tokens per pass")
    if info.per_position:
        charts.append("acceptance per draft position")
    return f"{info.describe()}.\nCharts it can fill: {', '.join(charts)}."


class ServedChat(QObject):
    """The window's chat on a served engine (while one is in use)."""

    batch_ready = Signal(object)
    reply_done = Signal(int, object)  # (job id, ServedRun)
    reply_failed = Signal(int, object)  # (job id, EndpointError)
    compare_batch = Signal(object)
    compare_done = Signal(int, object)  # (job id, CompareReport)
    compare_failed = Signal(int, object)  # (job id, error)

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.endpoint: Optional[Endpoint] = None
        self.baseline: Optional[Endpoint] = None  # Compare's baseline arm, when the server cannot switch per request
        self.job_id = 0
        self._running: Optional[tuple[int, ChatMessage, threading.Event]] = None
        self._comparing: Optional[tuple[int, threading.Event]] = None
        self.timer = QTimer(self)
        self.timer.setInterval(REPAINT_INTERVAL_MS)
        self.timer.timeout.connect(self._tick)
        self.batch_ready.connect(self._on_batch)
        self.reply_done.connect(self._on_done)
        self.reply_failed.connect(self._on_failed)
        self.compare_batch.connect(self._on_compare_batch)
        self.compare_done.connect(self._on_compare_done)
        self.compare_failed.connect(self._on_compare_failed)
        window.compare_view.served = self
        menu = window.menuBar().addMenu("&Servers")
        self.add_action = QAction("Add server…", self)
        self.add_action.triggered.connect(self.add_server)
        self.local_action = QAction("Use local models", self)
        self.local_action.setEnabled(False)
        self.local_action.triggered.connect(self.use_local)
        menu.addAction(self.add_action)
        menu.addAction(self.local_action)

    @property
    def active(self) -> bool:
        return self.endpoint is not None

    @property
    def busy(self) -> bool:
        return self._running is not None or self._comparing is not None

    def add_server(self) -> Optional[ConnectDialog]:
        dialog = ConnectDialog(self.window, self.endpoint.url if self.endpoint else "")
        dialog.accepted.connect(lambda: self.use(dialog.endpoint, dialog.key_note, dialog.baseline))
        dialog.open()
        return dialog

    def use(self, endpoint: Endpoint, key_note: str = "", baseline: Optional[Endpoint] = None) -> None:
        self.stop()
        self.endpoint = endpoint
        self.baseline = baseline
        self.local_action.setEnabled(True)
        self.window.setWindowTitle(f"SpecDesk — {endpoint.model} at {endpoint.url}")
        self.window.status_label.setText(f"server {endpoint.url} · model {endpoint.model} · "
                                         f"{endpoint.info.describe()}" + (f" · {key_note}" if key_note else ""))
        self._local_models_shown(False)
        self.window._update_actions()

    def use_local(self) -> None:
        self.stop()
        self.endpoint = self.baseline = None
        self.local_action.setEnabled(False)
        self._local_models_shown(True)
        self.window._show_model_status()
        self.window._update_actions()

    def _local_models_shown(self, on: bool) -> None:
        """The local model pickers do not apply to a server's replies: greyed out while one is in use."""
        for group in self.window.controls.findChildren(QGroupBox):
            if group.title() == "Models":
                group.setEnabled(on)
                group.setToolTip("" if on else "replies come from the server (Servers > Use local models to return)")

    # --- one reply ------------------------------------------------------------------------
    def send(self, text: str) -> Optional[int]:
        if self._running is not None or self.endpoint is None:
            return None
        window = self.window
        if window.chat_id is None:
            from .main_window import chat_title

            window.chat_id = window.history.create_chat(chat_title(text))
        message = ChatMessage("user", [text], [False])
        message.db_id = window.history.add_message(window.chat_id, "user", text)
        window.chat_view.add_message(message)
        window._refresh_chat_list()
        return self._start_reply()

    def regenerate(self) -> Optional[int]:
        """The last reply again, from the server: the old reply goes, the conversation before it stays."""
        window = self.window
        if self._running is not None or self.endpoint is None or window.chat_view.last_user_index() is None:
            return None
        while window.chat_view.messages and window.chat_view.messages[-1].role == "assistant":
            old = window.chat_view.remove_last()
            if old.db_id is not None:
                window.history.delete_message(old.db_id)
        return self._start_reply()

    def _start_reply(self) -> int:
        window = self.window
        sampling, max_tokens = window.controls.sampling(), window.controls.max_tokens()
        history = [{"role": m.role, "content": m.text} for m in window.chat_view.messages]
        reply = window.chat_view.add_message(ChatMessage("assistant"))
        self.job_id += 1
        job_id, cancel = self.job_id, threading.Event()
        self._running = (job_id, reply, cancel)
        window.charts.start_run(0)
        endpoint = self.endpoint
        k = 1 if endpoint.info.kind == "llama-server" else 0  # its chunks carry running draft counts

        def work() -> None:
            batcher = Coalescer(job_id, "chat", k, self.batch_ready.emit)
            try:
                run = endpoint.chat(history, sampling, max_tokens, cancel, batcher)
            except EndpointError as e:
                batcher.flush()
                self.reply_failed.emit(job_id, e)
                return
            batcher.flush()
            self.reply_done.emit(job_id, run)

        threading.Thread(target=work, daemon=True, name="specdesk-served-chat").start()
        self.timer.start()
        window._update_actions()
        return job_id

    def stop(self) -> None:
        if self._running is not None:
            self._running[2].set()
        if self._comparing is not None:
            self._comparing[1].set()

    # --- compare ------------------------------------------------------------------------
    def run_compare(self, text: str) -> Optional[int]:
        """The compare view's run on the server: speculation off per request where it can be
        (specdesk serve), else against the baseline server given in Add server…."""
        window, view = self.window, self.window.compare_view
        if self._comparing is not None or self.endpoint is None:
            return None
        if not text.strip():
            window.report_error("type a prompt to compare first")
            return None
        endpoint, baseline = self.endpoint, self.baseline
        if baseline is None and not endpoint.info.switches_speculation:
            window.report_error(f"{endpoint.url} ({endpoint.info.kind}) cannot switch speculation off per request: "
                                "add the server again with a baseline server (the same model without speculation)")
            return None
        sampling, max_tokens = window.controls.sampling(), window.controls.max_tokens()
        view.baseline_pane.clear()
        view.speculative_pane.clear()
        view.baseline_pane.setTitle("Baseline (no speculation)" if baseline is None else
                                    f"Baseline ({baseline.model} at {baseline.url})")
        view.speculative_pane.setTitle(f"Speculative ({endpoint.model} at {endpoint.url})")
        view.verdict.setText("running baseline, then speculative, on the server…")
        view.details.setText("")
        self.job_id += 1
        job_id, cancel = self.job_id, threading.Event()
        self._comparing = (job_id, cancel)

        def work() -> None:
            from specdesk.app.served import compare_served

            batchers: dict[str, Coalescer] = {}

            def on_event(label: str, index: int, event: StepEvent) -> None:
                if index < 0:
                    return  # the warm-up requests
                if label not in batchers:
                    batchers[label] = Coalescer(job_id, label, 0, self.compare_batch.emit)
                batchers[label](event)

            try:
                report = compare_served(endpoint, baseline, [text], sampling, max_tokens, on_event, cancel)
            except (EndpointError, SpecDeskError) as e:
                self.compare_failed.emit(job_id, e)
                return
            for batcher in batchers.values():
                batcher.flush()
            self.compare_done.emit(job_id, report)

        threading.Thread(target=work, daemon=True, name="specdesk-served-compare").start()
        self.timer.start()
        window._update_actions()
        return job_id

    def _on_compare_batch(self, batch: ServedBatch) -> None:
        if self._comparing is not None and batch.job_id == self._comparing[0]:
            view = self.window.compare_view
            (view.baseline_pane if batch.label == "baseline" else view.speculative_pane).add_batch(batch)

    def _on_compare_done(self, job_id: int, report) -> None:
        if self._comparing is None or self._comparing[0] != job_id:
            return
        self._comparing = None
        self.window.compare_view.show_report(report)
        self.window._update_actions()

    def _on_compare_failed(self, job_id: int, error) -> None:
        if self._comparing is None or self._comparing[0] != job_id:
            return
        self._comparing = None
        self.window.compare_view.verdict.setText("the compare did not finish (see the message)")
        self.window._update_actions()
        self.window.report_error(str(error))

    def _tick(self) -> None:
        self.window.chat_view.flush()
        self.window.charts.refresh()
        self.window.compare_view.refresh()
        if not self.busy:
            self.timer.stop()

    def _on_batch(self, batch: ServedBatch) -> None:
        if self._running is None or batch.job_id != self._running[0]:
            return
        self.window.chat_view.append_pieces(self._running[1], batch.pieces, batch.from_draft)
        self.window.charts.add_batch(batch)

    def _finish(self, job_id: int) -> Optional[ChatMessage]:
        if self._running is None or self._running[0] != job_id:
            return None
        message = self._running[1]
        self._running = None
        self.window._update_actions()
        return message

    def _on_done(self, job_id: int, run: ServedRun) -> None:
        message = self._finish(job_id)
        if message is None:
            return
        stats = run.result.stats
        charts = self.window.charts
        charts.k = len(stats.per_position_drafted) or (1 if stats.drafted else 0)
        charts.finish_run(stats)
        reason = {"cancelled": "stopped", "length": "max tokens", "eos": "done"}.get(
            run.result.finish_reason, run.result.finish_reason or "done")
        footer = (f"{reason} · {self.endpoint.model if self.endpoint else 'server'} · "
                  f"{format_status(stats, charts.k)} · numbers: {run.numbers.source}"
                  + (f" · {run.note}" if run.note else ""))
        self._save(message, footer, {"finish_reason": run.result.finish_reason, "server": self._server_meta(),
                                     "tokens": stats.tokens, "tok_per_s": round(stats.tok_per_s, 3),
                                     "acceptance": round(stats.acceptance_rate, 4),
                                     "tok_per_pass": round(stats.mean_accepted_length, 4),
                                     "numbers_from": run.numbers.source})
        self._tick()

    def _on_failed(self, job_id: int, error: EndpointError) -> None:
        message = self._finish(job_id)
        if message is None:
            return
        if message.text:  # the reply so far stays, marked
            self._save(message, f"partial reply · {error}", {"finish_reason": "error", "partial": True,
                                                             "server": self._server_meta(), "error": str(error)})
        elif self.window.chat_view.showing(message):
            self.window.chat_view.remove_last()
        self._tick()
        self.window.report_error(str(error))

    def _server_meta(self) -> dict:
        return {"url": self.endpoint.url, "model": self.endpoint.model} if self.endpoint else {}

    def _save(self, message: ChatMessage, footer: str, meta: dict) -> None:
        window = self.window
        meta = {**meta, "draft_spans": message.draft_spans(), "footer": footer}
        if window.history.is_open and window.chat_id is not None and window.history.chat(window.chat_id):
            message.db_id = window.history.add_message(window.chat_id, "assistant", message.text, meta)
        window.chat_view.end_reply(message, footer)
        window._refresh_chat_list()
