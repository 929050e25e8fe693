"""One worker base for every background job (docs/ARCHITECTURE.md, "Threads and processes").

A `JobThread` lives in the GUI thread and owns one QThread with a `JobRunner` moved onto it.
`submit(job)` queues a typed job (a `Job` dataclass) and returns at once; the runner runs the
jobs one after another, in the order they were queued, and the outcome comes back to the GUI
thread as a queued `done` (job, value) or `failed` (job, the runner's account of the error)
signal. Cancel is the job's `threading.Event`, set from the GUI thread and checked by the
work itself between its steps. The engine worker (ui/worker.py: chat and compare on the local
models or a server), the Models tab's lanes (ui/models_view.py) and Add server…'s Connect
(ui/served_chat.py) are this one class with their own runners.
"""

from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator, Optional

from PySide6.QtCore import QObject, QThread, Qt, Signal, Slot

log = logging.getLogger(__name__)

_live_threads: set[QThread] = set()


def running_threads() -> list[QThread]:
    """Job threads that are still running (tests assert this is empty after each test)."""
    return [t for t in list(_live_threads) if t.isRunning()]


@dataclass(kw_only=True)
class Job:
    """A job call: subclasses add its arguments as fields; `kind` names it in results and logs."""

    kind: ClassVar[str] = "job"
    job_id: int = 0  # set by JobThread.submit
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass(kw_only=True)
class _Close(Job):
    """The last job: the runner tidies up and its thread ends."""

    kind: ClassVar[str] = "close"


class JobRunner(QObject):
    """Lives in the job thread; runs one job at a time. Subclasses say how a job runs
    (`perform`) and what its failure is reported as (`failure`, on the job thread)."""

    done = Signal(object)  # (job, value)
    failed = Signal(object)  # (job, failure(job, error))
    progressed = Signal(object)  # (job_id, what the work reports on the way), sent by the work itself

    def perform(self, job: Job) -> Any:
        raise NotImplementedError

    def failure(self, job: Job, error: Exception) -> Any:
        return error

    def closing(self) -> None:
        """Called on the job thread before it ends."""

    @Slot(object)
    def run(self, job: Job) -> None:
        if isinstance(job, _Close):
            self.closing()
            QThread.currentThread().quit()
            return
        try:
            value = self.perform(job)
        except Exception as e:  # the runner's failure() says what it means; the thread carries on
            self.failed.emit((job, self.failure(job, e)))
            return
        self.done.emit((job, value))


class JobThread(QObject):
    """GUI-thread handle of one job thread, started on the first job (or by `start`)."""

    done = Signal(object)  # (job, value), once the job has left `pending`
    failed = Signal(object)  # (job, failure)
    progressed = Signal(object)  # the runner's `progressed`
    _submit = Signal(object)

    def __init__(self, name: str, make_runner: Callable[[], JobRunner], ids: Optional[Iterator[int]] = None,
                 parent: Optional[QObject] = None):
        super().__init__(parent)
        self._name, self._make_runner = name, make_runner
        self._ids = ids if ids is not None else itertools.count(1)
        self._thread: Optional[QThread] = None
        self.runner: Optional[JobRunner] = None
        self.pending: dict[int, Job] = {}

    def start(self) -> JobRunner:
        """Start the thread (once) and return its runner, whose own signals the owner may connect."""
        if self._thread is None:
            self._thread = QThread()
            self._thread.setObjectName(self._name)
            self.runner = self._make_runner()
            self.runner.moveToThread(self._thread)
            self._submit.connect(self.runner.run, Qt.QueuedConnection)
            self.runner.done.connect(self._on_done, Qt.QueuedConnection)
            self.runner.failed.connect(self._on_failed, Qt.QueuedConnection)
            self.runner.progressed.connect(self.progressed, Qt.QueuedConnection)
            self._thread.finished.connect(self.runner.deleteLater)
            _live_threads.add(self._thread)
            self._thread.start()
        return self.runner

    def report(self, job: Job, item: Any) -> None:
        """Called by a job's work on the job thread: `progressed` (job_id, item) on the GUI thread."""
        self.runner.progressed.emit((job.job_id, item))

    def submit(self, job: Job) -> Job:
        self.start()
        job.job_id = next(self._ids)
        self.pending[job.job_id] = job
        self._submit.emit(job)
        return job

    def stop(self, job_id: Optional[int] = None) -> None:
        """Cancel one job, or every queued and running one."""
        for job in list(self.pending.values()):
            if job_id is None or job.job_id == job_id:
                job.cancel.set()

    def shutdown(self, timeout_ms: int = 10_000, overdue: Optional[Callable[[], None]] = None) -> bool:
        """Cancel every job, let the runner tidy up, end the thread; True when it ended within
        `timeout_ms`. With `overdue`, that is called after three quarters of the time (to end
        work that does not check its cancel event), and the rest is waited for."""
        if self._thread is None:
            return True
        self.stop()
        self._submit.emit(_Close())
        if overdue is None:
            ended = self._thread.wait(timeout_ms)
        else:
            patience = timeout_ms * 3 // 4
            ended = self._thread.wait(patience)
            if not ended:
                overdue()
                ended = self._thread.wait(timeout_ms - patience)
        if ended:
            _live_threads.discard(self._thread)
        else:
            log.warning("the %s thread did not end within %d ms", self._name, timeout_ms)
        self._thread = None
        return ended

    @Slot(object)
    def _on_done(self, item) -> None:
        self.pending.pop(item[0].job_id, None)
        self.done.emit(item)

    @Slot(object)
    def _on_failed(self, item) -> None:
        self.pending.pop(item[0].job_id, None)
        self.failed.emit(item)
