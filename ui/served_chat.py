"""Chat with a served engine in the window: "Servers > Add server…" and the chat on it.

The dialog takes a base URL and an optional API key (kept in the OS keyring through
app/storage/credentials.py, never in settings.json), connects on a background thread (a `ProbeJob` on
the served probe lane), lists the
server's models and says which charts it can fill. While a server is in use, the chat tab
streams from it: its chat and compare are typed jobs (`ServedChatJob`, `ServedCompareJob`) on
a `JobThread` (ui/job_thread.py, the one worker base the engine worker runs on; connecting has
a lane of its own, so Add server… never waits for a reply streaming), whose runner
iterates `Endpoint.stream_chat` (app/serving/endpoint.py) and sends coalesced batches
(ui/jobs.EventBatcher) to the GUI as queued signals, as the engine worker does; the same chart
panel draws tok/s from the stream and, when the reply ends, the server's own acceptance,
tokens per pass and per-position numbers. A failed reply keeps its text, marked partial.
Stop sets the jobs' cancel events; the endpoint checks them between streamed chunks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from PySide6.QtCore import QCoreApplication, QObject, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (QComboBox, QDialog, QDialogButtonBox, QFormLayout, QGroupBox, QHBoxLayout, QLabel,
                               QLineEdit, QPushButton, QVBoxLayout, QWidget)

from specdesk.app.storage.credentials import load_key, store_key
from specdesk.app.serving.endpoint import Endpoint, EndpointError, ServedRun, ServerInfo, base_url
from specdesk.engines.types import SamplingParams, StepEvent

from .chat_view import ChatMessage
from .charts import format_status
from .job_thread import Job, JobRunner, JobThread
from .jobs import EventBatcher, StreamBatch

REPAINT_INTERVAL_MS = 33


# --- the jobs ----------------------------------------------------------------------
@dataclass(kw_only=True)
class ProbeJob(Job):
    """Add server…'s Connect: what the server reports, and the baseline server's when one is given."""

    kind: ClassVar[str] = "served_probe"
    endpoint: Endpoint
    baseline_url: str = ""
    api_key: Optional[str] = None


@dataclass(kw_only=True)
class ServedChatJob(Job):
    """One reply from the server to the conversation in `messages`."""

    kind: ClassVar[str] = "served_chat"
    endpoint: Endpoint
    messages: list[dict]
    sampling: SamplingParams
    max_tokens: int
    k: int = 0  # what the chart panel reads as draft tokens per step while the reply streams


@dataclass(kw_only=True)
class ServedCompareJob(Job):
    """Baseline then speculative on one prompt, on the server (app/serving/served.compare_served)."""

    kind: ClassVar[str] = "served_compare"
    endpoint: Endpoint
    baseline: Optional[Endpoint]  # None: the server switches speculation off per request
    prompt: str
    sampling: SamplingParams
    max_tokens: int


class _ServedRunner(JobRunner):
    """Runs the served jobs on their thread; a failure reaches the GUI as the exception itself."""

    stream = Signal(object)  # jobs.StreamBatch

    def perform(self, job: Job) -> Any:
        if isinstance(job, ProbeJob):
            return self._probe(job)
        if isinstance(job, ServedChatJob):
            return self._chat(job)
        return self._compare(job)

    def _probe(self, job: ProbeJob) -> tuple[ServerInfo, Optional[Endpoint]]:
        info = job.endpoint.probe()
        baseline = None
        if job.baseline_url:
            baseline = Endpoint(job.baseline_url, api_key=job.api_key or load_key(base_url(job.baseline_url)),
                                timeout=15.0)
            baseline.probe()
        return info, baseline

    def _chat(self, job: ServedChatJob) -> ServedRun:
        batcher = EventBatcher(job.job_id, "chat", job.k, None, self.stream.emit)
        try:
            return job.endpoint.chat(job.messages, job.sampling, job.max_tokens, job.cancel, batcher)
        finally:
            batcher.flush()  # a failed reply's text so far reaches the window before the failure

    def _compare(self, job: ServedCompareJob):
        from specdesk.app.serving.served import compare_served

        batchers: dict[str, EventBatcher] = {}

        def on_event(label: str, index: int, event: StepEvent) -> None:
            if index < 0:
                return  # the warm-up requests
            if label not in batchers:
                batchers[label] = EventBatcher(job.job_id, label, 0, None, self.stream.emit)
            batchers[label](event)

        report = compare_served(job.endpoint, job.baseline, [job.prompt], job.sampling, job.max_tokens, on_event,
                                job.cancel)
        for batcher in batchers.values():
            batcher.flush()
        return report


class ConnectDialog(QDialog):
    """Base URL, optional API key; Connect lists the models and what the server reports."""

    def __init__(self, probes: JobThread, parent: Optional[QWidget] = None, url: str = ""):
        super().__init__(parent)
        self.setWindowTitle("Add server")
        self.probes = probes  # the job thread Connect runs on
        self._probe: Optional[ProbeJob] = None  # the Connect in progress
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
        probes.done.connect(self._on_probe_done)
        probes.failed.connect(self._on_probe_failed)

    def probe(self) -> None:
        """Connect on a background thread: a server that does not answer never freezes the window."""
        try:
            url = base_url(self.url_edit.text())
        except EndpointError as e:
            self.info.setText(str(e))
            return
        key = self.key_edit.text().strip() or load_key(url)
        self.connect_button.setEnabled(False)
        self.info.setText(f"connecting to {url}…")
        self._probe = self.probes.submit(ProbeJob(endpoint=Endpoint(url, api_key=key, timeout=15.0),
                                                  baseline_url=self.baseline_edit.text().strip(), api_key=key))

    @Slot(object)
    def _on_probe_done(self, item) -> None:
        job, (info, baseline) = item
        if job is self._probe:
            self.baseline = baseline
            self._on_probed(job.endpoint, info)

    @Slot(object)
    def _on_probe_failed(self, item) -> None:
        job, error = item
        if job is self._probe:
            self.baseline = None
            self._on_probed(None, str(error))

    def _on_probed(self, endpoint: Optional[Endpoint], outcome) -> None:
        self._probe = None
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

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.endpoint: Optional[Endpoint] = None
        self.baseline: Optional[Endpoint] = None  # Compare's baseline arm, when the server cannot switch per request
        self._reply: Optional[tuple[int, ChatMessage]] = None  # the chat job streaming and its message
        self._compare_id: Optional[int] = None  # the compare job running
        self.jobs = JobThread("specdesk-served", _ServedRunner, parent=self)
        self.probes = JobThread("specdesk-served-probe", _ServedRunner, parent=self)  # Add server…'s Connect
        self.timer = QTimer(self)
        self.timer.setInterval(REPAINT_INTERVAL_MS)
        self.timer.timeout.connect(self._tick)
        self.jobs.done.connect(lambda item: self._outcome(item, failed=False))
        self.jobs.failed.connect(lambda item: self._outcome(item, failed=True))
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
        return self._reply is not None or self._compare_id is not None

    def add_server(self) -> Optional[ConnectDialog]:
        dialog = ConnectDialog(self.probes, self.window, self.endpoint.url if self.endpoint else "")
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

    # --- the jobs ---------------------------------------------------------------------------
    def _submit(self, job: Job) -> int:
        """Queue a job on the served job thread (started with the first), its batches to `_on_batch`."""
        if self.jobs.runner is None:
            self.jobs.start().stream.connect(self._on_batch, Qt.QueuedConnection)
        self.jobs.submit(job)
        self.timer.start()
        return job.job_id

    def stop(self) -> None:
        """Stop: the reply or compare in progress ends at the next streamed chunk."""
        self.jobs.stop()

    def shutdown(self, timeout_ms: int = 2_000) -> bool:
        """The window closes: cancel, end the job thread, and take in what it sent before it
        ended (a stopped reply is saved, as the engine worker's is). True when it ended."""
        probes_ended = self.probes.shutdown(timeout_ms)
        ended = self.jobs.shutdown(timeout_ms) and probes_ended
        QCoreApplication.sendPostedEvents(self, 0)  # the last batches, then the outcome
        QCoreApplication.sendPostedEvents(self.jobs, 0)
        self.timer.stop()
        return ended

    def _outcome(self, item, failed: bool) -> None:
        """A job's `done` (job, value) or `failed` (job, error), to the chat's or the compare's handler."""
        job, value = item
        chat = isinstance(job, ServedChatJob)
        handler = {(True, False): self._on_reply_done, (True, True): self._on_reply_failed,
                   (False, False): self._on_compare_done, (False, True): self._on_compare_failed}[chat, failed]
        handler(job.job_id, value)

    @Slot(object)
    def _on_batch(self, batch: StreamBatch) -> None:
        if batch.label == "chat":
            if self._reply is not None and batch.job_id == self._reply[0]:
                self.window.chat_view.append_pieces(self._reply[1], batch.pieces, batch.from_draft)
                self.window.charts.add_batch(batch)
        elif batch.job_id == self._compare_id:
            view = self.window.compare_view
            (view.baseline_pane if batch.label == "baseline" else view.speculative_pane).add_batch(batch)

    def _tick(self) -> None:
        self.window.chat_view.flush()
        self.window.charts.refresh()
        self.window.compare_view.refresh()
        if not self.busy:
            self.timer.stop()

    # --- one reply ------------------------------------------------------------------------
    def send(self, text: str) -> Optional[int]:
        if self._reply is not None or self.endpoint is None:
            return None
        self.window.add_user_message(text)
        return self._start_reply()

    def regenerate(self) -> Optional[int]:
        """The last reply again, from the server: the old reply goes, the conversation before it stays."""
        window = self.window
        if self._reply is not None or self.endpoint is None or window.chat_view.last_user_index() is None:
            return None
        window.drop_last_reply()
        return self._start_reply()

    def _start_reply(self) -> int:
        window = self.window
        history = [{"role": m.role, "content": m.text} for m in window.chat_view.messages]
        reply = window.chat_view.add_message(ChatMessage("assistant"))
        endpoint = self.endpoint
        k = 1 if endpoint.info.kind == "llama-server" else 0  # its chunks carry running draft counts
        job = ServedChatJob(endpoint=endpoint, messages=history, sampling=window.controls.sampling(),
                            max_tokens=window.controls.max_tokens(), k=k)
        window.charts.start_run(0)
        job_id = self._submit(job)
        self._reply = (job_id, reply)
        window._update_actions()
        return job_id

    def _finish(self, job_id: int) -> Optional[ChatMessage]:
        if self._reply is None or self._reply[0] != job_id:
            return None
        message = self._reply[1]
        self._reply = None
        self.window._update_actions()
        return message

    def _on_reply_done(self, job_id: int, run: ServedRun) -> None:
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

    def _on_reply_failed(self, job_id: int, error: Exception) -> None:
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

    # --- compare ------------------------------------------------------------------------
    def run_compare(self, text: str) -> Optional[int]:
        """The compare view's run on the server: speculation off per request where it can be
        (specdesk serve), else against the baseline server given in Add server…."""
        window, view = self.window, self.window.compare_view
        if self._compare_id is not None or self.endpoint is None:
            return None
        if not text.strip():
            window.report_error("type a prompt to compare first")
            return None
        endpoint, baseline = self.endpoint, self.baseline
        if baseline is None and not endpoint.info.switches_speculation:
            window.report_error(f"{endpoint.url} ({endpoint.info.kind}) cannot switch speculation off per request: "
                                "add the server again with a baseline server (the same model without speculation)")
            return None
        job = ServedCompareJob(endpoint=endpoint, baseline=baseline, prompt=text, sampling=window.controls.sampling(),
                               max_tokens=window.controls.max_tokens())
        view.baseline_pane.clear()
        view.speculative_pane.clear()
        view.baseline_pane.setTitle("Baseline (no speculation)" if baseline is None else
                                    f"Baseline ({baseline.model} at {baseline.url})")
        view.speculative_pane.setTitle(f"Speculative ({endpoint.model} at {endpoint.url})")
        view.verdict.setText("running baseline, then speculative, on the server…")
        view.details.setText("")
        self._compare_id = self._submit(job)
        window._update_actions()
        return self._compare_id

    def _on_compare_done(self, job_id: int, report) -> None:
        if self._compare_id != job_id:
            return
        self._compare_id = None
        self.window.compare_view.show_report(report)
        self.window._update_actions()

    def _on_compare_failed(self, job_id: int, error) -> None:
        if self._compare_id != job_id:
            return
        self._compare_id = None
        self.window.compare_view.verdict.setText("the compare did not finish (see the message)")
        self.window._update_actions()
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
