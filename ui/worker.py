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
import os
import logging
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Optional

from PySide6.QtCore import QObject, QThread, Qt, Signal, Slot

from specdesk.app.engine_client import EngineHostDied
from specdesk.app.settings import DEMO
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
    partial = Signal(object)  # (job_id, jobs.SweepPoint)
    progress = Signal(str)
    fraction = Signal(float)  # how much of the file being loaded is read, 0..1
    loaded = Signal(object)  # JobResult(value=ModelInfo), before the "finished" of a load
    finished = Signal(object)  # JobResult
    errored = Signal(object)  # JobError

    def __init__(self) -> None:
        super().__init__()
        self.engine = None
        self.draft_path: Optional[str] = None
        self.draft_kind = "draft"  # or "dflash" / "eagle3": a model-native drafter
        self._n_ctx: Optional[int] = None
        self._kept_target = False

    @Slot(object)
    def run(self, job: _Job) -> None:
        try:
            if job.kind == "close":
                self._close_engine()
                QThread.currentThread().quit()
                return
            value = getattr(self, f"_{job.kind}")(job)
            self.finished.emit(JobResult(job.job_id, job.kind, value))
        except _DraftRefused as e:
            self.errored.emit(JobError(job.job_id, "draft", str(e)))
        except EngineHostDied as e:
            lost = self.engine is not None and not self.engine.alive
            if lost:
                self._close_engine()
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
    def _need_engine(self):
        if self.engine is None:
            raise SpecDeskError("no model is loaded: pick a target model (a GGUF file) first")
        return self.engine

    def _load(self, job: _Job):
        from specdesk.engines.llama.engine import default_threads

        a = job.args
        target, draft = jobs.resolve_demo(a["target"], a["draft"], a["demo_size"], self.progress.emit)
        threads = a["threads"] or default_threads()
        engine = self.engine
        self._kept_target = True
        if engine is not None and not engine.alive:  # its process ended: load afresh
            self._close_engine()
            engine = None
        if engine is None or not jobs.same_file(engine.target.path, target) or a["n_ctx"] != self._n_ctx:
            self._kept_target = False
            self.progress.emit(f"loading {jobs.file_label(target)}")
            new_engine = jobs.open_engine(target, a["n_ctx"], threads, self._fraction_reporter(), job.cancel)
            self._close_engine()  # only once the new one loaded: a bad file keeps the old model
            self.engine, self._n_ctx, engine = new_engine, a["n_ctx"], new_engine
        elif engine.n_threads != threads:
            engine.set_threads(threads)
        # A refused draft leaves the previous one in use if this engine still has it loaded.
        previous = (self.draft_path, self.draft_kind) if self.engine is engine and self._kept_target else (None, "draft")
        self.draft_path, self.draft_kind = None, "draft"
        draft_error = None
        if draft:
            self.progress.emit(f"loading draft {jobs.file_label(draft)}")
            try:
                self.draft_kind = jobs.load_drafter(engine, draft, self._fraction_reporter())
                self.draft_path = draft
            except EngineHostDied:
                raise  # not a refused draft: the target went with the process
            except SpecDeskError as e:
                draft_error = str(e)
                self.draft_path, self.draft_kind = previous

        def resolve(choice: str) -> str:
            if choice != DEMO:
                return choice
            return jobs.resolve_demo(DEMO, DEMO, a["demo_size"], self.progress.emit)[1]

        # The demo draft is checked only when the demo family is in use (so, built): a check
        # must never start a build. Vocabulary checks read GGUF files, for GGUF targets.
        demo_in_use = DEMO in (a["target"], a["draft"])
        choices = [c for c in a.get("drafts", ()) if c and (c != DEMO or demo_in_use)
                   and engine.name != "torch" and not os.path.isdir(c)]
        info = jobs.describe_engine(engine, self.draft_path, {choice: resolve(choice) for choice in choices},
                                    self.draft_kind)
        self.loaded.emit(JobResult(job.job_id, "load", info))
        if draft_error is not None:
            raise _DraftRefused(draft_error)
        return info

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
        engine = self._need_engine()
        a = job.args
        batcher = jobs.EventBatcher(job.job_id, "chat", a["spec"].draft_tokens, engine.target.token_bytes,
                                    self.stream.emit)
        with engine.watching(job.cancel):  # Stop also ends a chat template that never finishes rendering
            result = jobs.run_chat(engine, a["messages"], a["spec"], a["sampling"], a["max_tokens"], job.cancel,
                                   batcher)
        batcher.flush()
        return result

    def _compare(self, job: _Job):
        engine = self._need_engine()
        a = job.args

        def batcher_for(label: str, k: int) -> jobs.EventBatcher:
            return jobs.EventBatcher(job.job_id, label, k, engine.target.token_bytes, self.stream.emit)

        with engine.watching(job.cancel):
            return jobs.run_compare(engine, a["prompt"], a["spec"], a["sampling"], a["max_tokens"], job.cancel,
                                    batcher_for, a["chat"])

    def _sweep(self, job: _Job):
        engine = self._need_engine()
        a = job.args
        with engine.watching(job.cancel):
            return jobs.run_sweep(engine, a["prompt"], a["spec"], a["sampling"], a["max_tokens"], a["ks"],
                                  job.cancel, lambda point: self.partial.emit((job.job_id, point)), a["chat"])

    def _new_chat(self, job: _Job):
        if self.engine is not None:
            self.engine.reset_chat()

    def _close_engine(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None
            self.draft_path = None


class EngineWorker(QObject):
    """GUI-thread handle of the worker thread. Every method returns at once."""

    progress = Signal(str)  # a loading stage, for the status bar
    fraction = Signal(float)  # how much of the model file being loaded is read, 0..1
    loaded = Signal(object)  # ModelInfo: what is loaded now
    stream = Signal(object)  # jobs.StreamBatch
    partial = Signal(object)  # (job_id, jobs.SweepPoint)
    finished = Signal(object)  # JobResult
    errored = Signal(object)  # JobError
    busy_changed = Signal(bool)

    _submit = Signal(object)

    def __init__(self, parent: Optional[QObject] = None):
        super().__init__(parent)
        self._ids = itertools.count(1)
        self._pending: dict[int, _Job] = {}
        self.info: Optional[jobs.ModelInfo] = None
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
            engine = self._runner.engine
            if engine is not None:
                engine.kill()
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
