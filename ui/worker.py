"""The one worker thread that owns the engine (docs/ARCHITECTURE.md, "Threads and processes").

`EngineWorker` lives in the GUI thread and is the only way the UI talks to the engine:
its methods queue a job for the worker thread and return a job id at once; results come
back as queued signals. The engine is created, used and closed on the worker thread only.

Cancel is a `threading.Event` per job, set directly from the GUI thread (the worker is
busy inside the generator and would not see a queued call); the engine checks it between
steps, so a stopped generation ends after the step in progress.

The engine itself runs in its own process (app/engine_client.py): when that process dies or
is ended by Stop, the job fails with EngineHostDied, the worker forgets the engine and the
error says so, with the process's last output as details; the worker thread carries on.
"""

from __future__ import annotations

import itertools
import logging
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Optional

from PySide6.QtCore import QObject, QThread, Qt, Signal, Slot

from specdesk.app.engine_client import EngineHostDied
from specdesk.app.session import ModelInfo, Session
from specdesk.engines.types import SamplingParams, SpecConfig, SpecDeskError

from . import jobs

log = logging.getLogger(__name__)

_live_threads: set[QThread] = set()


def running_threads() -> list[QThread]:
    """Worker threads that are still running (tests assert this is empty after each test)."""
    return [t for t in list(_live_threads) if t.isRunning()]


@dataclass(frozen=True)
class JobResult:
    job_id: int
    kind: str  # "load", "chat", "compare", "sweep"
    value: Any  # ModelInfo, ChatResult, CompareReport, SweepResult


@dataclass(frozen=True)
class JobError:
    job_id: int
    kind: str  # the job's kind; "draft" when the target loaded but its draft was refused
    message: str
    details: str = ""  # the engine process's last output lines, when it stopped
    engine_lost: bool = False  # the loaded model went with its process: offer to load it again


class _DraftRefused(SpecDeskError):
    """The target loaded, its draft did not: the model stays usable without the draft."""


@dataclass
class _Job:
    job_id: int
    kind: str
    args: dict
    cancel: threading.Event = field(default_factory=threading.Event)


class _Runner(QObject):
    """Lives in the worker thread; runs one job at a time, in the order they were queued."""

    stream = Signal(object)  # jobs.StreamBatch
    partial = Signal(object)  # (job_id, session.SweepPoint)
    progress = Signal(str)
    fraction = Signal(float)  # how much of the file being loaded is read, 0..1
    loaded = Signal(object)  # JobResult(value=ModelInfo), before the "finished" of a load
    finished = Signal(object)  # JobResult
    errored = Signal(object)  # JobError

    def __init__(self) -> None:
        super().__init__()
        self.session = Session()  # the loaded target and its drafter (app/session.py)

    @property
    def engine(self):
        return self.session.engine

    @Slot(object)
    def run(self, job: _Job) -> None:
        try:
            if job.kind == "close":
                self.session.close()
                QThread.currentThread().quit()
                return
            value = getattr(self, f"_{job.kind}")(job)
            self.finished.emit(JobResult(job.job_id, job.kind, value))
        except _DraftRefused as e:
            self.errored.emit(JobError(job.job_id, "draft", str(e)))
        except EngineHostDied as e:
            lost = self.session.engine_lost()
            self.errored.emit(JobError(job.job_id, job.kind, str(e), e.details, lost))
        except SpecDeskError as e:
            self.errored.emit(JobError(job.job_id, job.kind, str(e)))
        except MemoryError:
            self.errored.emit(JobError(job.job_id, job.kind,
                                       "out of memory: choose a smaller model, a smaller context or max tokens"))
        except Exception as e:  # a bug: report it, keep the worker alive
            log.error("job %s failed:\n%s", job.kind, traceback.format_exc())
            self.errored.emit(JobError(job.job_id, job.kind, f"{type(e).__name__}: {e}"))

    # --- jobs ---------------------------------------------------------------
    def _load(self, job: _Job):
        a = job.args
        outcome = self.session.load(a["target"], a["draft"], demo_size=a["demo_size"], n_ctx=a["n_ctx"],
                                    threads=a["threads"], drafts=a.get("drafts", ()), progress=self.progress.emit,
                                    fraction=self._fraction_reporter(), cancel=job.cancel)
        self.loaded.emit(JobResult(job.job_id, "load", outcome.info))
        if outcome.draft_error is not None:
            raise _DraftRefused(outcome.draft_error)
        return outcome.info

    def _fraction_reporter(self):
        """A progress callback that sends whole percents only (llama.cpp calls it per tensor)."""
        last = [-1]

        def report(fraction: float) -> None:
            percent = int(fraction * 100)
            if percent != last[0]:
                last[0] = percent
                self.fraction.emit(percent / 100)
        return report

    def _chat(self, job: _Job):
        a = job.args
        batcher = jobs.EventBatcher(job.job_id, "chat", a["spec"].draft_tokens,
                                    self.session.need_engine().target.token_bytes, self.stream.emit)
        result = self.session.chat(a["messages"], a["spec"], a["sampling"], a["max_tokens"], job.cancel, batcher)
        batcher.flush()
        return result

    def _compare(self, job: _Job):
        a = job.args
        token_bytes = self.session.need_engine().target.token_bytes
        batchers: dict[str, jobs.EventBatcher] = {}

        def on_event(label: str, k: int, event) -> None:
            if label not in batchers:
                batchers[label] = jobs.EventBatcher(job.job_id, label, k, token_bytes, self.stream.emit)
            batchers[label](event)

        report = self.session.compare(a["prompt"], a["spec"], a["sampling"], a["max_tokens"], job.cancel, on_event,
                                      a["chat"])
        for batcher in batchers.values():
            batcher.flush()
        return report

    def _sweep(self, job: _Job):
        a = job.args
        return self.session.sweep(a["prompt"], a["spec"], a["sampling"], a["max_tokens"], a["ks"], job.cancel,
                                  lambda point: self.partial.emit((job.job_id, point)), a["chat"])

    def _new_chat(self, job: _Job):
        self.session.new_chat()


class EngineWorker(QObject):
    """GUI-thread handle of the worker thread. Every method returns at once."""

    progress = Signal(str)  # a loading stage, for the status bar
    fraction = Signal(float)  # how much of the model file being loaded is read, 0..1
    loaded = Signal(object)  # ModelInfo: what is loaded now
    stream = Signal(object)  # jobs.StreamBatch
    partial = Signal(object)  # (job_id, session.SweepPoint)
    finished = Signal(object)  # JobResult
    errored = Signal(object)  # JobError
    busy_changed = Signal(bool)

    _submit = Signal(object)

    def __init__(self, parent: Optional[QObject] = None):
        super().__init__(parent)
        self._ids = itertools.count(1)
        self._pending: dict[int, _Job] = {}
        self.info: Optional[ModelInfo] = None
        self._thread = QThread()
        self._thread.setObjectName("specdesk-engine")
        self._runner = _Runner()
        self._runner.moveToThread(self._thread)
        self._submit.connect(self._runner.run, Qt.QueuedConnection)
        self._runner.progress.connect(self.progress, Qt.QueuedConnection)
        self._runner.fraction.connect(self.fraction, Qt.QueuedConnection)
        self._runner.stream.connect(self._on_stream, Qt.QueuedConnection)
        self._runner.partial.connect(self._on_partial, Qt.QueuedConnection)
        self._runner.loaded.connect(self._on_loaded, Qt.QueuedConnection)
        self._runner.finished.connect(self._on_finished, Qt.QueuedConnection)
        self._runner.errored.connect(self._on_errored, Qt.QueuedConnection)
        self._thread.finished.connect(self._runner.deleteLater)
        _live_threads.add(self._thread)
        self._thread.start()
        self._closed = False

    # --- state ----------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return bool(self._pending)

    def pending_kinds(self) -> list[str]:
        return [job.kind for job in self._pending.values()]

    # --- jobs -----------------------------------------------------------------
    def _queue(self, kind: str, **args) -> int:
        if self._closed:
            raise RuntimeError("the engine worker is shut down")
        job = _Job(next(self._ids), kind, args)
        was_busy = self.busy
        self._pending[job.job_id] = job
        self._submit.emit(job)
        if not was_busy:
            self.busy_changed.emit(True)
        return job.job_id

    def load(self, target: str, draft: Optional[str], demo_size: str = "full", n_ctx: int = 0,
             threads: int = 0, drafts=()) -> int:
        """Load a target (a GGUF path or settings.DEMO) and optionally a draft model; check
        which of `drafts` (paths or DEMO) could serve the target."""
        return self._queue("load", target=target, draft=draft, demo_size=demo_size, n_ctx=n_ctx, threads=threads,
                           drafts=tuple(drafts))

    def chat(self, messages: list[dict], spec: SpecConfig, sampling: SamplingParams, max_tokens: int) -> int:
        return self._queue("chat", messages=[dict(m) for m in messages], spec=spec, sampling=sampling,
                           max_tokens=max_tokens)

    def compare(self, prompt: str, spec: SpecConfig, sampling: SamplingParams, max_tokens: int,
                chat: bool = True) -> int:
        """Baseline then speculative on one prompt (a chat message, or raw text with chat=False)."""
        return self._queue("compare", prompt=prompt, spec=spec, sampling=sampling, max_tokens=max_tokens, chat=chat)

    def sweep(self, prompt: str, spec: SpecConfig, sampling: SamplingParams, max_tokens: int,
              ks=tuple(range(1, 9)), chat: bool = True) -> int:
        return self._queue("sweep", prompt=prompt, spec=spec, sampling=sampling, max_tokens=max_tokens,
                           ks=tuple(ks), chat=chat)

    def new_chat(self) -> int:
        """The engine forgets what the n-gram pool learned from the previous chat."""
        return self._queue("new_chat")

    def stop(self, job_id: Optional[int] = None) -> None:
        """Cancel one job, or every queued and running one."""
        for job in list(self._pending.values()):
            if job_id is None or job.job_id == job_id:
                job.cancel.set()

    def shutdown(self, timeout_ms: int = 2_000) -> bool:
        """Stop everything, close the engine on its thread, end the thread. True when it ended.

        Never waits more than `timeout_ms`: an engine process still busy after most of it
        (a step that does not return) is killed, which ends the worker's wait for it."""
        if self._closed:
            return True
        self._closed = True
        self.stop()
        self._submit.emit(_Job(0, "close", {}))
        patience = timeout_ms * 3 // 4
        ended = self._thread.wait(patience)
        if not ended:
            self._runner.session.kill()
            ended = self._thread.wait(timeout_ms - patience)
        if ended:
            _live_threads.discard(self._thread)
        else:
            log.warning("the engine thread did not end within %d ms", timeout_ms)
        return ended

    # --- results (GUI thread) ---------------------------------------------------
    def _job_done(self, job_id: int) -> None:
        if self._pending.pop(job_id, None) is not None and not self._pending:
            self.busy_changed.emit(False)

    @Slot(object)
    def _on_stream(self, batch) -> None:
        self.stream.emit(batch)

    @Slot(object)
    def _on_partial(self, item) -> None:
        self.partial.emit(item)

    @Slot(object)
    def _on_loaded(self, result: JobResult) -> None:
        self.info = result.value
        self.loaded.emit(result.value)

    @Slot(object)
    def _on_finished(self, result: JobResult) -> None:
        self._job_done(result.job_id)
        self.finished.emit(result)

    @Slot(object)
    def _on_errored(self, error: JobError) -> None:
        self._job_done(error.job_id)
        self.errored.emit(error)
