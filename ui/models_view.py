"""The Models tab: search the hub, list a repository's files, a download queue with progress
and cancel, the local library with its metadata, and a pairing dialog (ui/pairing_dialog.py)
that shows the compatible drafts and why each other model is not one.

The GUI thread never waits: library scans, searches, listings and pairing run one after
another on one worker thread, downloads one after another on a second (so a long download
never holds up a search). Results come back as queued signals. Cancel sets the download's
event from the GUI thread; the transfer loop stops at the next chunk and keeps the partial
file, so "Resume" continues where it stopped.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Callable, Optional

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (QAbstractItemView, QCheckBox, QFileDialog, QGridLayout, QGroupBox, QHBoxLayout, QLabel,
                               QLineEdit, QMenu, QProgressBar, QPushButton, QSplitter, QVBoxLayout, QWidget)

from specdesk.app.models.hub import DownloadProgress, human_bytes
from specdesk.app.models.library import LibraryConfig, ModelEntry
from specdesk.engines.methods import method_info
from specdesk.engines.types import SpecDeskError

from .crossvocab_pairs import CrossVocabDrafts
from .dialogs import show_error
from .job_thread import JobThread, running_threads  # noqa: F401  (running_threads: for tests)
from .jobs import Throttle
from .model_tables import cell, model_label, table
from .models_jobs import DownloadRow, Task, TaskRunner
from .pairing_dialog import PairingDialog

PROGRESS_INTERVAL_S = 0.05  # a download reports to the GUI at most this often
PROGRESS_STEPS = 1000  # progress bars count permille (QProgressBar is 32-bit; files are not)
SOURCES_PER_ROW = 3  # the library's "Also scan" check boxes


def _parameters(n: Optional[int]) -> str:
    if not n:
        return "-"
    return f"{n / 1e9:.1f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


class ModelsView(QWidget):
    library_loaded = Signal(object)  # list[ModelEntry]
    search_done = Signal(object)  # list[SearchResult]
    files_listed = Signal(object)  # list[RemoteFile]
    download_changed = Signal(object)  # DownloadRow (state, message)
    pairing_ready = Signal(object)  # PairingReport
    failed = Signal(str)
    use_model = Signal(str)  # "Use this model": load it as the target, with the draft that goes with it
    use_as_draft = Signal(str)  # "Use as draft" for the loaded target
    use_trained = Signal(str, str, str)  # a trained drafter's "Use it": (target, draft or "", method)
    use_pair = Signal(str, str)  # a pairing row: this target with this draft

    def __init__(self, config_source: Optional[Callable[[], LibraryConfig]] = None,
                 parent: Optional[QWidget] = None, scan_when_shown: bool = True, settings=None):
        """`settings` (app.settings.Settings): its library folders and source switches are
        scanned, and folders added here are remembered in it."""
        super().__init__(parent)
        self._settings = settings
        if config_source is None:
            config_source = (lambda: LibraryConfig.from_settings(settings)) if settings is not None else LibraryConfig
        self._config_source = config_source
        ids = itertools.count(1)
        self._jobs = JobThread("specdesk-models", TaskRunner, ids, self)
        self._downloads_lane = JobThread("specdesk-downloads", TaskRunner, ids, self)
        for lane in (self._jobs, self._downloads_lane):
            lane.done.connect(self._on_done)
            lane.failed.connect(self._on_failed)
        self._downloads_lane.progressed.connect(self._on_progress)
        self.entries: list[ModelEntry] = []
        self.downloads: dict[int, DownloadRow] = {}
        self._download_ids = itertools.count(1)
        self._by_job: dict[int, int] = {}  # download job id -> download id
        self._dialogs: dict[int, PairingDialog] = {}  # pairing job id -> its dialog
        self._scan_when_shown = scan_when_shown
        self._scanned = False
        self._closed = False
        self.current_repo: Optional[str] = None
        self._build()

    # --- layout ----------------------------------------------------------------
    def _build(self) -> None:
        self._make_widgets()
        self._make_source_boxes()
        hub_box = self._hub_box()
        downloads_box = QGroupBox("Downloads", self)
        QVBoxLayout(downloads_box).addWidget(self.download_table)
        downloads_box.hide()  # until the first download: the library gets the room
        self.downloads_box = downloads_box
        library_box = self._library_box()
        body = QSplitter(Qt.Vertical, self)
        for box in (hub_box, downloads_box, library_box):
            body.addWidget(box)
        body.setStretchFactor(0, 2)
        body.setStretchFactor(1, 1)
        body.setStretchFactor(2, 4)
        layout = QVBoxLayout(self)
        layout.addWidget(body, 1)
        layout.addWidget(self.status)
        self._connect()

    def _make_widgets(self) -> None:
        self.query = QLineEdit(self)
        self.query.setPlaceholderText("search the hub, e.g. Qwen3")
        self.query.setToolTip("Search the Hugging Face hub by name, e.g. Qwen3 GGUF")
        self.author = QLineEdit(self)
        self.author.setPlaceholderText("author (optional)")
        self.author.setMaximumWidth(160)
        self.gguf_only = QCheckBox("GGUF only", self)
        self.gguf_only.setChecked(True)
        self.search_button = QPushButton("Search", self)
        self.results = table(["repository", "downloads", "format"], self)
        self.files = table(["file", "size", "quantization", "sha256"], self)
        self.download_button = QPushButton("Download selected file", self)
        self.download_table = table(["file", "progress", "status", ""], self)
        self.library = table(["name", "source", "format", "architecture", "parameters", "quantization", "context",
                               "vocab", "size", "native drafters", "path"], self)
        self.library.setSelectionMode(QAbstractItemView.SingleSelection)
        self.refresh_button = QPushButton("Rescan", self)
        self.add_button = QPushButton("Add folder…", self)
        self.pair_button = QPushButton("Pair drafts…", self)
        self.pair_button.setToolTip("the drafts here that fit this model, the ones that do not and why, and its "
                                    "native drafters")
        self.use_button = QPushButton("Use this model", self)
        self.use_button.setToolTip("load it as the target, with the best compatible draft here (or none)")
        self.use_draft_button = QPushButton("Use as draft", self)
        self.use_draft_button.setToolTip("draft for the loaded target with it")
        self.status = QLabel("", self)

    def _make_source_boxes(self) -> None:
        """Other apps' folders, each switchable (kept in settings)."""
        self.source_boxes: dict[str, QCheckBox] = {}
        if self._settings is not None:
            from specdesk.app.models.library import load_sources

            for name, spec in load_sources().items():
                box = QCheckBox(spec.get("label", name), self)
                box.setChecked(bool(self._settings.model_sources.get(name, True)))
                box.setToolTip(f"scan the models {spec.get('label', name)} downloaded (read in place)")
                box.toggled.connect(lambda on, name=name: self.set_source(name, on))
                self.source_boxes[name] = box

    def _hub_box(self) -> QGroupBox:
        search_row = QHBoxLayout()
        for w, stretch in ((self.query, 1), (self.author, 0), (self.gguf_only, 0), (self.search_button, 0)):
            search_row.addWidget(w, stretch)
        hub_box = QGroupBox("Hugging Face hub", self)
        hub_layout = QVBoxLayout(hub_box)
        hub_layout.addLayout(search_row)
        lists = QSplitter(Qt.Horizontal, hub_box)
        lists.addWidget(self.results)
        file_side = QWidget(lists)
        file_layout = QVBoxLayout(file_side)
        file_layout.setContentsMargins(0, 0, 0, 0)
        file_layout.addWidget(self.files, 1)
        file_layout.addWidget(self.download_button)
        lists.addWidget(file_side)
        hub_layout.addWidget(lists, 1)
        return hub_box

    def _library_box(self) -> QGroupBox:
        library_box = QGroupBox("Library", self)
        library_layout = QVBoxLayout(library_box)
        library_layout.addWidget(self.library, 1)
        self.placement = QLabel("", library_box)  # where the loaded target and draft sit
        self.placement.setWordWrap(True)
        library_layout.addWidget(self.placement)
        buttons = QHBoxLayout()  # what to do with the selected row; the folders scanned on a row below
        for b in (self.use_button, self.use_draft_button, self.pair_button, self.refresh_button, self.add_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        library_layout.addLayout(buttons)

        if self.source_boxes:  # three to a row: a large font or a narrow window keeps them in view
            sources = QGridLayout()
            sources.addWidget(QLabel("Also scan:", self), 0, 0)
            for i, box in enumerate(self.source_boxes.values()):
                sources.addWidget(box, i // SOURCES_PER_ROW, 1 + i % SOURCES_PER_ROW)
            sources.setColumnStretch(SOURCES_PER_ROW + 1, 1)
            library_layout.addLayout(sources)
        return library_box

    def _connect(self) -> None:
        self.search_button.clicked.connect(lambda: self.search(self.query.text()))
        self.query.returnPressed.connect(lambda: self.search(self.query.text()))
        self.results.itemSelectionChanged.connect(self._result_selected)
        self.download_button.clicked.connect(self._download_selected)
        self.refresh_button.clicked.connect(self.refresh_library)
        self.add_button.clicked.connect(self._add_folder)
        self.pair_button.clicked.connect(self._pair_selected)
        # A row's menu: its actions, and "Train a drafter…", which has no room in the button row
        self.library.setContextMenuPolicy(Qt.CustomContextMenu)
        self.library.customContextMenuRequested.connect(self._row_menu)
        self.use_button.clicked.connect(lambda: self._use_selected(self.use_model))
        self.use_draft_button.clicked.connect(lambda: self._use_selected(self.use_as_draft))
        self.library.itemDoubleClicked.connect(lambda item: self._use_selected(self.use_model))
        self.library.itemSelectionChanged.connect(self._update_buttons)
        self.files.itemSelectionChanged.connect(self._update_buttons)
        self._update_buttons()

    def show_placement(self, placement: str) -> None:
        """Where the loaded models sit ("target 9/9 layers on RPC0 (…) · draft CPU"), and on a
        CPU-only llama.cpp build, one line on how to get a GPU build."""
        from specdesk.engines.llama.devices import GPU_BUILD_HINT, llama_build

        lines = [f"Loaded: {placement}"] if placement else []
        try:
            cpu_only = llama_build()["backend"] == "cpu"
        except (SpecDeskError, OSError, AttributeError):  # no usable llama.cpp here: nothing to say about its build
            cpu_only = False
        if cpu_only:
            lines.append(GPU_BUILD_HINT[0].upper() + GPU_BUILD_HINT[1:])
        self.placement.setText("\n".join(lines))

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self._scan_when_shown and not self._scanned:
            self.refresh_library()

    def _update_buttons(self) -> None:
        entry = self.selected_entry()
        self.pair_button.setEnabled(entry is not None and entry.ok and entry.format == "gguf")
        self.use_button.setEnabled(entry is not None and entry.ok and not entry.drafter)
        self.use_draft_button.setEnabled(entry is not None and entry.ok)
        self.download_button.setEnabled(self.files.currentRow() >= 0 and self.current_repo is not None)

    # --- library -----------------------------------------------------------------
    def refresh_library(self) -> int:
        from specdesk.app.models.library import scan_library

        self._scanned = True
        config = self._config_source()
        self.status.setText("scanning the model library…")
        return self._jobs.submit(Task(work=lambda job: scan_library(config), shown=self._show_library)).job_id

    def set_source(self, name: str, enabled: bool) -> Optional[int]:
        """Switch one app's model folder on or off (remembered in settings) and rescan."""
        if self._settings is None:
            return None
        self._settings.model_sources = {**self._settings.model_sources, name: enabled}
        return self.refresh_library()

    def _add_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a folder of models")
        if folder:
            self.add_path(folder)

    def add_path(self, path: str) -> int:
        self.path_added(path)
        if self._settings is None:  # nothing remembers it: the scan adds it from here on
            previous = self._config_source

            def with_path() -> LibraryConfig:
                config = previous()
                config.user_paths = [*config.user_paths, path] if path not in config.user_paths else config.user_paths
                return config

            self._config_source = with_path
        return self.refresh_library()

    def path_added(self, path: str) -> None:
        if self._settings is not None and path not in self._settings.library_paths:
            self._settings.library_paths.append(path)

    def _show_library(self, entries: list[ModelEntry]) -> None:
        from specdesk.app.models.pairing import native_drafters
        from specdesk.app.models.provenance import provenance_line, read_provenance

        self.entries = entries
        self.library.setRowCount(0)
        for e in entries:
            row = self.library.rowCount()
            self.library.insertRow(row)
            native = ", ".join(sorted({d["method"] for d in native_drafters(e, entries)})) if e.ok and not e.drafter \
                else (f"is {method_info(e.drafter).drafter}" if e.drafter else "")
            record = read_provenance(e.path) if e.ok else None  # a drafter or a draft model trained here
            if record is not None:  # trained here: its verdict, measured against what the target had
                native = f"{native}; {provenance_line(record)}" if native else provenance_line(record)
            values = [model_label(e.name, e.path), e.source, e.format, e.architecture or "-", _parameters(e.parameters),
                      e.quantization or "-", e.context_length or "-", e.vocab_size or "-",
                      human_bytes(e.size_bytes) if e.size_bytes else "-", native, e.path]
            for column, value in enumerate(values):
                self.library.setItem(row, column, cell(value, e.error, e.path if column == 0 else None))
            if e.error:
                self.library.item(row, 0).setText(f"⚠ {model_label(e.name, e.path)}")
                # a file whose header was read but that cannot run keeps its facts; the tooltip says why
                self.library.item(row, 3).setText(f"{e.architecture}: cannot be used, see tooltip" if e.architecture
                                                  else "cannot read: see tooltip")
        self.library.resizeColumnsToContents()
        broken = sum(1 for e in entries if e.error)
        self.status.setText(f"{len(entries)} model(s) in the library" + (f", {broken} unusable" if broken else ""))
        self._update_buttons()
        self.library_loaded.emit(entries)

    def selected_entry(self) -> Optional[ModelEntry]:
        row = self.library.currentRow()
        return self.entries[row] if 0 <= row < len(self.entries) and self.library.selectedItems() else None

    # --- hub ---------------------------------------------------------------------
    def search(self, text: str) -> int:
        from specdesk.app.models.hub import search

        gguf, author = self.gguf_only.isChecked(), self.author.text().strip() or None
        self.status.setText(f"searching for {text!r}…")
        return self._jobs.submit(Task(work=lambda job: search(text, gguf_only=gguf, author=author),
                                       shown=self._show_results)).job_id

    def _show_results(self, results) -> None:
        self.results.setRowCount(0)
        for r in results:
            row = self.results.rowCount()
            self.results.insertRow(row)
            self.results.setItem(row, 0, cell(r.repo_id, data=r.repo_id))
            self.results.setItem(row, 1, cell(r.downloads))
            self.results.setItem(row, 2, cell("GGUF" if r.gguf else "", ", ".join(r.tags)))
        self.results.resizeColumnsToContents()
        self.status.setText(f"{len(results)} repositories found")
        self.search_done.emit(results)

    def _result_selected(self) -> None:
        item = self.results.item(self.results.currentRow(), 0)
        if item is not None:
            self.show_files(item.data(Qt.UserRole))

    def show_files(self, repo_id: str) -> int:
        from specdesk.app.models.hub import list_files

        self.current_repo = repo_id
        self.files.setRowCount(0)
        self.status.setText(f"listing {repo_id}…")
        return self._jobs.submit(Task(work=lambda job: list_files(repo_id),
                                       shown=lambda files: self._show_files(repo_id, files))).job_id

    def _show_files(self, repo_id: str, files) -> None:
        if repo_id != self.current_repo:
            return  # the user moved on to another repository
        self.files.setRowCount(0)
        for f in files:
            row = self.files.rowCount()
            self.files.insertRow(row)
            self.files.setItem(row, 0, cell(f.path, data=f.path))
            self.files.setItem(row, 1, cell(human_bytes(f.size)))
            self.files.setItem(row, 2, cell(f.quantization or ""))
            self.files.setItem(row, 3, cell((f.sha256 or "")[:16], f.sha256))
        self.files.resizeColumnsToContents()
        self.status.setText(f"{repo_id}: {len(files)} files")
        self._update_buttons()
        self.files_listed.emit(files)

    def _download_selected(self) -> None:
        item = self.files.item(self.files.currentRow(), 0)
        if item is not None and self.current_repo:
            self.enqueue_download(self.current_repo, item.data(Qt.UserRole))

    # --- downloads ------------------------------------------------------------------
    def enqueue_download(self, repo_id: str, filename: str) -> int:
        download_id = next(self._download_ids)
        row = self.download_table.rowCount()
        self.download_table.insertRow(row)
        self.download_table.setItem(row, 0, cell(f"{repo_id}/{filename}"))
        bar = QProgressBar(self.download_table)
        bar.setRange(0, PROGRESS_STEPS)
        button = QPushButton("Cancel", self.download_table)
        self.download_table.setCellWidget(row, 1, bar)
        self.download_table.setItem(row, 2, cell("queued"))
        self.download_table.setCellWidget(row, 3, button)
        entry = DownloadRow(download_id, repo_id, filename, row, bar, button)
        self.downloads[download_id] = entry
        self.downloads_box.show()
        button.clicked.connect(lambda: self._download_button(download_id))
        self._start_download(entry)
        return download_id

    def _start_download(self, d: DownloadRow) -> None:
        from specdesk.app.models.hub import download

        lane = self._downloads_lane
        throttle = Throttle(PROGRESS_INTERVAL_S, clock=time.monotonic)

        def work(job: Task):
            def report(p: DownloadProgress) -> None:
                if throttle.due() or p.done == p.total:
                    throttle.mark()
                    lane.report(job, p)

            return str(download(d.repo_id, d.filename, cancel=job.cancel, progress=report))

        d.job = lane.submit(Task(work=work, shown=lambda path: self._download_done(d, path),
                                  refused=lambda message, cancelled: self._download_refused(d, message, cancelled)))
        self._by_job[d.job.job_id] = d.download_id
        self._set_state(d, "queued", "queued")

    def _download_button(self, download_id: int) -> None:
        d = self.downloads[download_id]
        if d.state == "done" and d.path:
            self.use_model.emit(d.path)
        elif d.state in ("queued", "running"):
            self.cancel_download(download_id)
        elif d.state in ("cancelled", "failed"):
            self._start_download(d)

    def cancel_download(self, download_id: int) -> None:
        d = self.downloads[download_id]
        if d.job is not None and d.state in ("queued", "running"):
            d.job.cancel.set()
            self.download_table.item(d.row, 2).setText("cancelling…")

    def _set_state(self, d: DownloadRow, state: str, message: str) -> None:
        d.state, d.message = state, message
        self.download_table.item(d.row, 2).setText(message)
        self.download_table.item(d.row, 2).setToolTip(message)
        d.button.setText({"queued": "Cancel", "running": "Cancel", "cancelled": "Resume", "failed": "Retry"}
                         .get(state, "Use this model"))
        d.button.setEnabled(state != "done" or bool(d.path))
        self.download_changed.emit(d)

    @Slot(object)
    def _on_progress(self, item) -> None:
        job_id, p = item
        d = self.downloads.get(self._by_job.get(job_id, -1))
        if d is None or d.state not in ("queued", "running"):
            return
        d.bar.setValue(int(PROGRESS_STEPS * p.done / p.total) if p.total else PROGRESS_STEPS)
        resumed = f" (resumed at {human_bytes(p.resumed_from)})" if p.resumed_from else ""
        self._set_state(d, "running", f"{human_bytes(p.done)} of {human_bytes(p.total)}{resumed}")

    # --- pairing ------------------------------------------------------------------
    def _use_selected(self, signal) -> None:
        entry = self.selected_entry()
        if entry is not None and entry.ok:
            signal.emit(entry.path)

    def submit(self, work: Callable[[Any], Any], shown: Callable[[Any], None],
               refused: Optional[Callable[[str, bool], None]] = None) -> int:
        """Run `work(job)` on the tab's lane (library, hub, pairing); `shown` gets its value on the
        GUI thread, `refused` its failure (message, cancelled); without it the tab reports it."""
        return self._jobs.submit(Task(work=work, shown=shown, refused=refused)).job_id

    def row_menu(self) -> Optional[QMenu]:
        """The selected row's menu (None without a usable row)."""
        entry = self.selected_entry()
        if entry is None or not entry.ok:
            return None
        menu = QMenu(self)
        if not entry.drafter:
            menu.addAction("Use this model", lambda: self._use_selected(self.use_model))
        menu.addAction("Use as draft", lambda: self._use_selected(self.use_as_draft))
        if entry.format == "gguf":
            menu.addAction("Pair drafts…", self._pair_selected)
        if not entry.drafter:
            train = menu.addAction("Train a drafter for this model…", self._train_selected)
            train.setToolTip("an EAGLE-3 head, MTP layer or DFlash drafter trained here from the model's own "
                             "answers, adopted only if it pays")
        return menu

    def _row_menu(self, where) -> None:
        menu = self.row_menu()
        if menu is not None:
            menu.exec(self.library.viewport().mapToGlobal(where))

    def _train_selected(self) -> None:
        entry = self.selected_entry()
        if entry is not None:
            self.open_training(entry.path)

    def open_training(self, target: str, extra: tuple[str, ...] = ()):
        """The training dialog for `target` (a GGUF file or a Hugging Face folder; for a GGUF,
        the library's folder of the same model is offered as the one to train from)."""
        from .train_dialog import TrainDrafterDialog, hf_folder_for

        entry = next((e for e in self.entries if e.path == target), None)
        folder = hf_folder_for(entry, self.entries) if entry is not None else None
        dialog = TrainDrafterDialog(target, self, hf_folder=folder, extra=extra)
        dialog.use_trained.connect(self.use_trained)
        dialog.show()
        return dialog

    def _pair_selected(self) -> None:
        entry = self.selected_entry()
        if entry is not None:
            self.open_pairing(entry)

    def open_pairing(self, target: ModelEntry, n_ctx: int = 0) -> PairingDialog:
        from specdesk.app.models.pairing import pair

        dialog = PairingDialog(target, self)
        dialog.cross_vocab = CrossVocabDrafts(dialog, self.submit)  # drafts with a vocabulary of their own
        dialog.use.connect(self.use_pair)
        dialog.train.connect(self.open_training)
        entries = list(self.entries)
        placement, draft_placement = self._placements()
        job = self._jobs.submit(Task(work=lambda job: pair(target.path, entries, n_ctx=n_ctx, placement=placement,
                                                            draft_placement=draft_placement),
                                      shown=lambda report: self._pairing_done(job.job_id, report),
                                      refused=lambda message, cancelled: self._pairing_refused(job.job_id, message)))
        self._dialogs[job.job_id] = dialog
        dialog.show()
        return dialog

    def _placements(self) -> tuple:
        """The settings' placement of the target and the draft (app/storage/settings.py), for pairing's
        per-device estimate; a value settings refused is auto."""
        from specdesk.engines.llama.placement import Placement

        s = self._settings
        if s is None:
            return Placement(), Placement()
        try:
            return (Placement.parse(s.device, s.gpu_layers), Placement.parse(s.draft_device, s.draft_gpu_layers))
        except SpecDeskError:
            return Placement(), Placement()

    # --- results ------------------------------------------------------------------
    @Slot(object)
    def _on_done(self, item) -> None:
        job, value = item
        if not self._closed:
            job.shown(value)

    @Slot(object)
    def _on_failed(self, item) -> None:
        job, (message, cancelled) = item
        if self._closed:
            return
        if job.refused is not None:
            job.refused(message, cancelled)
        else:
            self._report_failure(message)

    def _report_failure(self, message: str, popup: bool = True) -> None:
        self.status.setText(message.splitlines()[0] if message else "error")
        self.failed.emit(message)
        if popup:
            show_error(self, message)

    def _download_done(self, d: DownloadRow, path: str) -> None:
        self._by_job.pop(d.job.job_id, None)
        d.path = path
        d.bar.setValue(PROGRESS_STEPS)
        self._set_state(d, "done", "done")
        self.download_table.item(d.row, 2).setToolTip(path)
        self.refresh_library()  # the new file joins the library

    def _download_refused(self, d: DownloadRow, message: str, cancelled: bool) -> None:
        self._by_job.pop(d.job.job_id, None)
        self._set_state(d, "cancelled" if cancelled else "failed", message)

    def _pairing_done(self, job_id: int, report) -> None:
        dialog = self._dialogs.pop(job_id, None)
        if dialog is not None:
            dialog.show_report(report)
            dialog.cross_vocab.show_report(report)
        self.pairing_ready.emit(report)

    def _pairing_refused(self, job_id: int, message: str) -> None:
        dialog = self._dialogs.pop(job_id, None)
        if dialog is not None:
            dialog.show_error(message)
        self._report_failure(message, popup=False)

    def busy(self) -> bool:
        return bool(self._jobs.pending or self._downloads_lane.pending)

    def shutdown(self) -> None:
        """Cancel downloads (their partial files stay for resuming) and end both threads."""
        self._closed = True
        for dialog in self._dialogs.values():
            dialog.close()
        self._jobs.shutdown()
        self._downloads_lane.shutdown()
