"""The one worker thread that owns the engine (docs/ARCHITECTURE.md, "Threads and processes").

`EngineWorker` lives in the GUI thread and is the only way the UI talks to the engine or a
server: its methods queue a typed job (a `Job` dataclass below) on a `JobThread`
(ui/job_thread.py) and return a job id at once; results come back as queued signals. A chat
or compare job carries its backend (app/runtime/backend.py): the local models' `Session`
(app/runtime/session.py, `EngineWorker.local`), which the worker thread owns (the engine is
created, used and closed on that thread only; the GUI thread reads only how it describes
itself), or a server's `ServedSession` (app/serving/served.py). A chat job is one turn of the
chat controller (app/runtime/chat_controller.py: the worker is its `TurnRunner`), one
`chat_turn` whose `messages` come back updated (the reply appended, or the turn rolled back).

Cancel is a `threading.Event` per job, set directly from the GUI thread (the worker is
busy inside the generator and would not see a queued call); the engine checks it between
steps, so a stopped generation ends after the step in progress.

The engine itself runs in its own process (app/runtime/engine_client.py): when that process dies or
is ended by Stop, the job fails with EngineHostDied, the worker forgets the engine and the
error says so, with the process's last output as details; the worker thread carries on.
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from PySide6.QtCore import QObject, Qt, Signal, Slot

from specdesk.app.runtime.backend import ChatBackend, ChatSettings, chat_turn
from specdesk.app.runtime.chat_controller import ChatController, Turn
from specdesk.app.runtime.engine_client import EngineHostDied
from specdesk.app.runtime.session import ModelInfo, Session
from specdesk.engines.types import SamplingParams, SpecConfig, SpecDeskError, StepEvent

from . import jobs
from .job_thread import Job, JobRunner, JobThread, running_threads  # noqa: F401  (running_threads: for tests)

log = logging.getLogger(__name__)


# --- the jobs ----------------------------------------------------------------------
@dataclass(kw_only=True)
class LoadJob(Job):
    """Load a target (a path or a demo placeholder) and optionally a draft; check which of
    `drafts` could serve the target."""

    kind: ClassVar[str] = "load"
    target: str
    draft: Optional[str]
    demo_size: str = "full"
    n_ctx: int = 0
    threads: int = 0
    drafts: tuple[str, ...] = ()
    placement: tuple = ()  # Settings.placement() as (name, value) pairs: where a GGUF's layers go


@dataclass(kw_only=True)
class _RunJob(Job):
    """A job that generates: its method, sampling and length, and what runs it (the local
    models the worker loaded, or a server)."""

    spec: SpecConfig
    sampling: SamplingParams
    max_tokens: int
    backend: ChatBackend

    @property
    def settings(self) -> ChatSettings:
        return ChatSettings(self.spec, self.sampling, self.max_tokens)


@dataclass(kw_only=True)
class ChatJob(_RunJob):
    """One turn: `messages` ends in the user's message and is updated by the turn."""

    kind: ClassVar[str] = "chat"
    messages: list[dict]


@dataclass(kw_only=True)
class CompareJob(_RunJob):
    """Baseline and speculative on one prompt (a chat message, or raw text with chat=False)."""

    kind: ClassVar[str] = "compare"
    prompt: str
    chat: bool = True


@dataclass(kw_only=True)
class SweepJob(CompareJob):
    """Baseline once, then the method at each of `ks`, on one prompt."""

    kind: ClassVar[str] = "sweep"
    ks: tuple[int, ...] = tuple(range(1, 9))


@dataclass(kw_only=True)
class PrepareJob(Job):
    """Auto's costs on this machine, measured once per model and placement (then cached), while
    the user types the first message rather than in its reply."""

    kind: ClassVar[str] = "prepare"
    spec: SpecConfig


@dataclass(kw_only=True)
class NewChatJob(Job):
    """The engine forgets what the n-gram pool learned from the previous chat."""

    kind: ClassVar[str] = "new_chat"


@dataclass(frozen=True)
class JobResult:
    job_id: int
    kind: str  # the job's kind: "load", "chat", "compare", "sweep", "new_chat"
    value: Any  # ModelInfo, backend.ChatOutcome, CompareReport, session.SweepResult


@dataclass(frozen=True)
class JobError:
    job_id: int
    kind: str  # the job's kind; "draft" when the target loaded but its draft was refused
    message: str
    details: str = ""  # the engine process's last output lines, when it stopped
    engine_lost: bool = False  # the loaded model went with its process: offer to load it again


class _DraftRefused(SpecDeskError):
    """The target loaded, its draft did not: the model stays usable without the draft."""


# --- the worker thread's side ----------------------------------------------------------
class _Runner(JobRunner):
    """Runs the jobs on the worker thread, on the one Session it owns."""

    stream = Signal(object)  # jobs.StreamBatch
    partial = Signal(object)  # (job_id, session.SweepPoint)
    progress = Signal(str)
    fraction = Signal(float)  # how much of the file being loaded is read, 0..1
    loaded = Signal(object)  # JobResult(value=ModelInfo), before the "done" of a load

    def __init__(self) -> None:
        super().__init__()
        self.session = Session()  # the loaded target and its drafter (app/runtime/session.py)
        self._handlers = {LoadJob: self._load, ChatJob: self._chat, CompareJob: self._compare,
                          SweepJob: self._sweep, NewChatJob: lambda job: self.session.new_chat(),
                          PrepareJob: lambda job: self.session.prepare(job.spec, job.cancel)}

    @property
    def engine(self):
        return self.session.engine

    def perform(self, job: Job) -> Any:
        return self._handlers[type(job)](job)

    def failure(self, job: Job, error: Exception) -> JobError:
        if isinstance(error, _DraftRefused):
            return JobError(job.job_id, "draft", str(error))
        if isinstance(error, EngineHostDied):
            return JobError(job.job_id, job.kind, str(error), error.details, self.session.engine_lost())
        if isinstance(error, SpecDeskError):
            return JobError(job.job_id, job.kind, str(error))
        if isinstance(error, MemoryError):
            return JobError(job.job_id, job.kind, "out of memory: choose a smaller model, a smaller context or max tokens")
        log.error("job %s failed:\n%s", job.kind, "".join(traceback.format_exception(error)))  # a bug
        return JobError(job.job_id, job.kind, f"{type(error).__name__}: {error}")

    def closing(self) -> None:
        self.session.close()

    def _load(self, job: LoadJob) -> ModelInfo:
        outcome = self.session.load(job.target, job.draft, demo_size=job.demo_size, n_ctx=job.n_ctx,
                                    threads=job.threads, drafts=job.drafts, progress=self.progress.emit,
                                    fraction=self._fraction_reporter(), cancel=job.cancel,
                                    placement=dict(job.placement))
        self.loaded.emit(JobResult(job.job_id, job.kind, outcome.info))
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

    def _chat(self, job: ChatJob):
        backend = job.backend
        settings = job.settings
        batcher = jobs.EventBatcher(job.job_id, "chat", backend.chart_k(settings), backend.token_bytes(),
                                    self.stream.emit)
        try:
            return chat_turn(backend, job.messages, settings, job.cancel, batcher)
        finally:
            batcher.flush()  # a failed or stopped reply's text so far reaches the window before the outcome

    def _compare(self, job: CompareJob):
        backend = job.backend
        settings = job.settings
        token_bytes = backend.token_bytes()
        batchers: dict[str, jobs.EventBatcher] = {}

        def on_event(label: str, index: int, event: StepEvent) -> None:
            if label not in batchers:
                k = 0 if label == "baseline" else backend.chart_k(settings)
                batchers[label] = jobs.EventBatcher(job.job_id, label, k, token_bytes, self.stream.emit)
            batchers[label](event)

        report = backend.compare([job.prompt], settings, job.cancel, on_event, job.chat)
        for batcher in batchers.values():
            batcher.flush()
        return report

    def _sweep(self, job: SweepJob):
        return self.session.sweep(job.prompt, job.spec, job.sampling, job.max_tokens, job.ks, job.cancel,
                                  lambda point: self.partial.emit((job.job_id, point)), job.chat)


# --- the GUI thread's side ---------------------------------------------------------------
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

    def __init__(self, parent: Optional[QObject] = None):
        super().__init__(parent)
        self.info: Optional[ModelInfo] = None
        self._thread = JobThread("specdesk-engine", _Runner, parent=self)
        self._runner: _Runner = self._thread.start()
        self._runner.progress.connect(self.progress, Qt.QueuedConnection)
        self._runner.fraction.connect(self.fraction, Qt.QueuedConnection)
        self._runner.stream.connect(self._on_stream, Qt.QueuedConnection)
        self._runner.partial.connect(self._on_partial, Qt.QueuedConnection)
        self._runner.loaded.connect(self._on_loaded, Qt.QueuedConnection)
        self._thread.done.connect(self._on_done)
        self._thread.failed.connect(self._on_failed)
        self._closed = False

    # --- state ----------------------------------------------------------------
    @property
    def local(self) -> ChatBackend:
        """The local models' backend: its jobs run on the worker thread, which owns its engine."""
        return self._runner.session

    @property
    def busy(self) -> bool:
        return bool(self._thread.pending)

    def pending_kinds(self) -> list[str]:
        return [job.kind for job in self._thread.pending.values()]

    # --- jobs -----------------------------------------------------------------
    def submit(self, job: Job) -> int:
        if self._closed:
            raise RuntimeError("the engine worker is shut down")
        was_busy = self.busy
        self._thread.submit(job)
        if not was_busy:
            self.busy_changed.emit(True)
        return job.job_id

    def load(self, target: str, draft: Optional[str], demo_size: str = "full", n_ctx: int = 0,
             threads: int = 0, drafts=(), placement: Optional[dict] = None) -> int:
        """Load a target (a GGUF path or settings.DEMO) and optionally a draft model; check
        which of `drafts` (paths or DEMO) could serve the target; `placement`: Settings.placement()."""
        return self.submit(LoadJob(target=target, draft=draft, demo_size=demo_size, n_ctx=n_ctx, threads=threads,
                                   drafts=tuple(drafts), placement=tuple((placement or {}).items())))

    def run_turn(self, turn: Turn, controller: ChatController) -> None:
        """A chat controller's turn as a ChatJob (app/runtime/chat_controller.TurnRunner): the turn's
        `messages` show how it ended; its stream, outcome or error come back as this worker's
        signals, which the window draws and hands on to `controller`."""
        spec, sampling, max_tokens, backend = turn.request
        turn.job_id = self.submit(ChatJob(messages=turn.messages, spec=spec, sampling=sampling,
                                          max_tokens=max_tokens, backend=backend))

    def compare(self, prompt: str, spec: SpecConfig, sampling: SamplingParams, max_tokens: int,
                backend: ChatBackend, chat: bool = True) -> int:
        """Baseline then speculative on one prompt (a chat message, or raw text with chat=False)."""
        return self.submit(CompareJob(prompt=prompt, spec=spec, sampling=sampling, max_tokens=max_tokens, chat=chat,
                                      backend=backend))

    def sweep(self, prompt: str, spec: SpecConfig, sampling: SamplingParams, max_tokens: int,
              ks=tuple(range(1, 9)), chat: bool = True) -> int:
        """Baseline once, then `spec`'s method at each of `ks` (on the local models only)."""
        return self.submit(SweepJob(prompt=prompt, spec=spec, sampling=sampling, max_tokens=max_tokens,
                                    ks=tuple(ks), chat=chat, backend=self.local))

    def new_chat(self) -> int:
        """The engine forgets what the n-gram pool learned from the previous chat."""
        return self.submit(NewChatJob())

    def prepare(self, spec: SpecConfig) -> int:
        """What `spec`'s method needs before its first reply (auto: this machine's costs)."""
        return self.submit(PrepareJob(spec=spec))

    def stop(self, job_id: Optional[int] = None) -> None:
        """Cancel one job, or every queued and running one."""
        self._thread.stop(job_id)

    def shutdown(self, timeout_ms: int = 2_000) -> bool:
        """Stop everything, close the engine on its thread, end the thread. True when it ended.

        Never waits more than `timeout_ms`: an engine process still busy after most of it
        (a step that does not return) is killed, which ends the worker's wait for it."""
        if self._closed:
            return True
        self._closed = True
        return self._thread.shutdown(timeout_ms, overdue=self._runner.session.kill)

    # --- results (GUI thread) ---------------------------------------------------
    def _job_done(self) -> None:
        if not self._thread.pending:
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
    def _on_done(self, item) -> None:
        job, value = item
        self._job_done()
        self.finished.emit(JobResult(job.job_id, job.kind, value))

    @Slot(object)
    def _on_failed(self, item) -> None:
        job, error = item
        self._job_done()
        self.errored.emit(error)
