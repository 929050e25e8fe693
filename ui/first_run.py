"""The first-run card: what the demo model is, and a real target and draft pair sized to this
machine's memory and its measured read speed (app/models/curated.py), with the tokens a second
to expect, downloaded with progress and handed to the window to load. The window hides it for
good once a model of the user's own loads (ui/model_choice.py)."""

from __future__ import annotations

import logging
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional

from PySide6.QtCore import QEvent, Qt, Signal, Slot
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from specdesk.app.models.curated import MIN_TOKENS_PER_S, SuggestedPair, estimated_tokens_per_s
from specdesk.app.models.hub import DownloadCancelled, DownloadProgress, human_bytes
from specdesk.engines.types import SpecDeskError

from .job_thread import Job, JobRunner, JobThread
from .jobs import Throttle

log = logging.getLogger(__name__)

PROGRESS_STEPS = 1000
PROGRESS_INTERVAL_S = 0.1

DEMO_TEXT = ("<b>This is SpecDesk's demo model</b>, trained on Python's standard library: it continues code "
             "rather than answering, and shows speculation at work (tinted: what the draft got right).")
DEMO_DETAILS = ("A 63M-parameter target and a 7M-parameter draft, trained in an afternoon on the standard "
                "library's source. The charts beside the chat show what each accepted draft token saves.")


@dataclass(kw_only=True)
class PairDownload(Job):
    """Both files of a suggested pair, one after the other; the value is (target_path, draft_path)."""

    kind: ClassVar[str] = "first-run download"
    pair: SuggestedPair
    download: Callable  # app/models/hub.download


class _PairRunner(JobRunner):
    lane: Optional[JobThread] = None

    def perform(self, job: PairDownload) -> tuple[str, str]:
        total = job.pair.download_bytes
        throttle = Throttle(PROGRESS_INTERVAL_S, clock=time.monotonic)
        paths = []
        before = 0
        for role, f in (("target", job.pair.target), ("draft", job.pair.draft)):
            def report(p: DownloadProgress, before=before, role=role, name=f.file) -> None:
                if throttle.due() or p.done == p.total:
                    throttle.mark()
                    self.progressed.emit((job.job_id, (role, name, before + p.done, max(total, before + p.total))))

            if job.cancel.is_set():
                raise DownloadCancelled("cancelled")
            paths.append(str(job.download(f.repo, f.file, cancel=job.cancel, progress=report)))
            before += f.bytes
        return paths[0], paths[1]

    def failure(self, job: Job, error: Exception) -> tuple[str, bool]:
        if isinstance(error, DownloadCancelled):
            return "download cancelled; what was fetched is kept, and the next try resumes", True
        if isinstance(error, SpecDeskError):
            return str(error), False
        log.error("first-run download failed:\n%s", "".join(traceback.format_exception(error)))
        return f"{type(error).__name__}: {error}", False


class FirstRunCard(QFrame):
    """Shown above the chat until the user loads a model of their own or dismisses it."""

    use_pair = Signal(str, str)  # target path, draft path: downloaded, to be loaded
    dismissed = Signal()

    def __init__(self, pair: Optional[SuggestedPair], memory_bytes: int, where: str,
                 parent: Optional[QWidget] = None, download: Optional[Callable] = None,
                 read_bytes_per_s: Optional[float] = None):
        super().__init__(parent)
        from specdesk.app.models.hub import download as hub_download

        self.setObjectName("firstRunCard")
        self.setFrameShape(QFrame.StyledPanel)
        self.pair = pair
        self._download = download or hub_download
        self._lane = JobThread("specdesk-first-run", _PairRunner, parent=self)
        self._lane.done.connect(self._on_done)
        self._lane.failed.connect(self._on_failed)
        self._lane.progressed.connect(self._on_progress)
        self._job: Optional[PairDownload] = None

        self.demo = QLabel(DEMO_TEXT, self)
        self.demo.setWordWrap(True)
        self.demo.setTextFormat(Qt.RichText)
        self.demo.setToolTip(DEMO_DETAILS)
        if pair is None:
            text = (f"{human_bytes(memory_bytes)} for a model here ({where}) is too little for the pairs we "
                    "suggest: open a small GGUF file (File ▸ Open) or search the hub in the Models tab.")
            details = ""
        else:
            text, details = suggestion_text(pair, memory_bytes, where, read_bytes_per_s)
        self.suggestion = QLabel(text, self)
        self.suggestion.setWordWrap(True)
        self.suggestion.setTextFormat(Qt.RichText)
        self.suggestion.setToolTip(f"{DEMO_DETAILS}\n\n{details}".strip())
        self.progress = QProgressBar(self)
        self.progress.setRange(0, PROGRESS_STEPS)
        self.progress.hide()
        self.status = QLabel("", self)
        self.status.hide()  # shown with the progress bar
        self.get_button = QPushButton("Download and use", self)
        self.get_button.setEnabled(pair is not None)
        self.get_button.clicked.connect(self._get_clicked)
        self.close_button = QPushButton("Not now", self)
        self.close_button.clicked.connect(self.dismiss)

        offer = QHBoxLayout()  # the suggestion and its buttons on one row
        offer.addWidget(self.suggestion, 1)
        offer.addWidget(self.get_button)
        offer.addWidget(self.close_button)
        progress = QHBoxLayout()
        progress.addWidget(self.progress, 1)
        progress.addWidget(self.status, 2)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 2, 6, 2)
        layout.setSpacing(2)
        layout.addWidget(self.demo)
        layout.addLayout(offer)
        layout.addLayout(progress)

    # The line about the demo model gives way to the chat in a short window (a large font on a
    # small screen); the suggestion's tooltip still says it.
    ROOM_LINES = 44  # window height, in lines of text, from which the demo line shows

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self.window().installEventFilter(self)
        self._fit(self.window().height())

    def eventFilter(self, watched, event) -> bool:
        if event.type() == QEvent.Resize and watched is self.window():
            self._fit(event.size().height())
        return False

    def _fit(self, height: int) -> None:
        self.demo.setVisible(height >= self.ROOM_LINES * self.fontMetrics().lineSpacing())

    def busy(self) -> bool:
        return self._job is not None

    def _get_clicked(self) -> None:
        if self._job is not None:  # the button reads Cancel while downloading
            self._job.cancel.set()
            self.status.setText("cancelling…")
            return
        self.start_download()

    def start_download(self) -> None:
        if self.pair is None or self._job is not None:
            return
        self._job = self._lane.submit(PairDownload(pair=self.pair, download=self._download))
        self.progress.setValue(0)
        self.progress.show()
        self.status.show()
        self.status.setText("starting the download…")
        self.get_button.setText("Cancel")

    @Slot(object)
    def _on_progress(self, item) -> None:
        _, (role, name, done, total) = item
        self.progress.setValue(int(PROGRESS_STEPS * done / total) if total else 0)
        self.status.setText(f"downloading the {role} ({name}): {human_bytes(done)} of {human_bytes(total)}")

    @Slot(object)
    def _on_done(self, item) -> None:
        _, (target, draft) = item
        self._job = None
        self.progress.setValue(PROGRESS_STEPS)
        self.status.setText("downloaded; loading…")
        self.get_button.setText("Download and use")
        self.use_pair.emit(target, draft)

    @Slot(object)
    def _on_failed(self, item) -> None:
        _, (message, cancelled) = item
        self._job = None
        self.get_button.setText("Resume download" if cancelled else "Try again")
        self.status.show()
        self.status.setText(message.splitlines()[0] if message else "the download failed")
        self.status.setToolTip(message)

    def dismiss(self) -> None:
        if self._job is not None:
            self._job.cancel.set()
        self.hide()
        self.dismissed.emit()

    def shutdown(self) -> None:
        self._lane.shutdown()


def suggestion_text(pair: SuggestedPair, memory_bytes: int, where: str,
                    read_bytes_per_s: Optional[float]) -> tuple[str, str]:
    """The card's line about the pair (what it needs, and on a CPU the speed to expect) and its tooltip."""
    details = (f"Good for {pair.good_for}. The small model drafts for the large one. From the Hugging "
               f"Face hub: {pair.target.repo}/{pair.target.file} and {pair.draft.repo}/{pair.draft.file}.")
    if read_bytes_per_s is None:
        return (f"<b>For real chat here</b> ({human_bytes(memory_bytes)} of {where} to use): {pair.name}, "
                f"{human_bytes(pair.download_bytes)}."), details
    rate = estimated_tokens_per_s(pair, read_bytes_per_s)
    text = (f"<b>For real chat here</b>: {pair.name}, {human_bytes(pair.download_bytes)}, about {rate:.0f} "
            f"tokens/s ({human_bytes(memory_bytes)} of {where}, read at {read_bytes_per_s / 1e9:.1f} GB/s).")
    details += (f"\n\nA token reads every weight of the model once, so {human_bytes(pair.target.bytes)} at "
                f"{read_bytes_per_s / 1e9:.1f} GB/s (this machine's memory, measured) gives about {rate:.1f} "
                "tokens a second before speculation, which adds to that when the draft guesses well.")
    if rate < MIN_TOKENS_PER_S:
        details += (f" No suggested pair reaches {MIN_TOKENS_PER_S:.0f} tokens a second here: this is the "
                    "smallest, and a larger model would be slower still.")
    return text, details


_read_speed: list[Optional[float]] = []  # measured once per process: the memory does not change


def measured_read_speed() -> Optional[float]:
    """This machine's memory read speed (app/models/curated.read_speed), or None where there is
    too little free memory to measure it (the card then sizes by memory alone)."""
    from specdesk.app.models.curated import read_speed

    if not _read_speed:
        try:
            _read_speed.append(read_speed())
        except MemoryError:
            _read_speed.append(None)
    return _read_speed[0]


def make_card(parent: Optional[QWidget] = None) -> FirstRunCard:
    """The card with this machine's suggestion (app/models/curated.py): sized by the memory a
    model may take and, on a CPU, by the read speed measured here."""
    from specdesk.app.models.curated import run_memory, suggest

    memory, where = run_memory()
    speed = measured_read_speed() if where == "RAM" else None
    try:
        pair = suggest(memory, read_bytes_per_s=speed)
    except SpecDeskError as e:
        log.warning("no first-run suggestion: %s", e)
        pair = None
    return FirstRunCard(pair, memory, where, parent, read_bytes_per_s=speed)
