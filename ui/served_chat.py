"""Servers in the window: "Servers > Add server…" (the Connect dialog) and the switch between
a server and the local models.

The dialog takes a base URL and an optional API key (kept in the OS keyring through
app/storage/credentials.py, never in settings.json), connects on a background thread of its
own (a `ProbeJob`, so Add server… never waits for a reply streaming), lists the server's
models and says which charts it can fill. Once accepted, the window's chat and compare run on
that server: `ServedChat` hands the window a backend (app/serving/served.ServedSession), and
the window's one chat controller and one worker run it as they run the local models
(ui/worker.py: a job carries its backend). "Use local models" hands back the worker's
local backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from PySide6.QtCore import QObject, Slot
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (QComboBox, QDialog, QDialogButtonBox, QFormLayout, QHBoxLayout, QLabel, QLineEdit,
                               QPushButton, QVBoxLayout, QWidget)

from specdesk.app.serving.endpoint import Endpoint, EndpointError, ServerInfo, base_url
from specdesk.app.serving.served import ServedSession
from specdesk.app.storage.credentials import load_key, store_key

from .job_thread import Job, JobRunner, JobThread


# --- Connect --------------------------------------------------------------------------
@dataclass(kw_only=True)
class ProbeJob(Job):
    """Add server…'s Connect: what the server reports, and the baseline server's when one is given."""

    kind: ClassVar[str] = "served_probe"
    endpoint: Endpoint
    baseline_url: str = ""
    api_key: Optional[str] = None


class _ProbeRunner(JobRunner):
    """Connects on its own thread; a failure reaches the dialog as the exception itself."""

    def perform(self, job: ProbeJob) -> Any:
        info = job.endpoint.probe()
        baseline = None
        if job.baseline_url:
            baseline = Endpoint(job.baseline_url, api_key=job.api_key or load_key(base_url(job.baseline_url)),
                                timeout=15.0)
            baseline.probe()
        return info, baseline


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
    """The Servers menu: Add server… opens the Connect dialog; an accepted server becomes the
    window's backend (`window.use_backend`), and "Use local models" switches back."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.probes = JobThread("specdesk-served-probe", _ProbeRunner, parent=self)  # Add server…'s Connect
        menu = window.menuBar().addMenu("&Servers")
        self.add_action = QAction("Add server…", self)
        self.add_action.triggered.connect(self.add_server)
        self.local_action = QAction("Use local models", self)
        self.local_action.setEnabled(False)
        self.local_action.triggered.connect(self.use_local)
        menu.addAction(self.add_action)
        menu.addAction(self.local_action)
        self._url = ""  # the last server used: Add server… starts from it

    def add_server(self) -> ConnectDialog:
        dialog = ConnectDialog(self.probes, self.window, self._url)
        dialog.accepted.connect(lambda: self.use(dialog.endpoint, dialog.key_note, dialog.baseline))
        dialog.open()
        return dialog

    def use(self, endpoint: Endpoint, key_note: str = "", baseline: Optional[Endpoint] = None) -> None:
        """Replies and compares come from `endpoint` (Compare's baseline from `baseline`, where
        the server cannot switch speculation off per request)."""
        self._url = endpoint.url
        self.local_action.setEnabled(True)
        status = f"{endpoint.info.dialect.label} server {endpoint.url} · model {endpoint.model} · {endpoint.info.describe()}" \
            + (f" · {key_note}" if key_note else "")
        self.window.use_backend(ServedSession(endpoint, baseline), status)

    def use_local(self) -> None:
        self.local_action.setEnabled(False)
        self.window.use_backend(self.window.worker.local)

    def shutdown(self, timeout_ms: int = 2_000) -> bool:
        """The window closes: end a Connect in progress. True when its thread ended."""
        return self.probes.shutdown(timeout_ms)
