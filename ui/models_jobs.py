"""The Models tab's background work: its tasks (run on one of two lanes, ui/job_thread.py) and the
state of each row of its download queue."""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional

from PySide6.QtWidgets import QProgressBar, QPushButton

from specdesk.app.models.hub import DownloadCancelled
from specdesk.engines.types import SpecDeskError

from .job_thread import Job, JobRunner

log = logging.getLogger("specdesk.ui.models_view")


@dataclass(kw_only=True)
class Task(Job):
    """A Models-tab job: `work` runs on its lane's thread; `shown` gets its value and
    `refused` its failure (message, cancelled) on the GUI thread (None: the tab reports it)."""

    kind: ClassVar[str] = "models"
    work: Callable[["Task"], Any]
    shown: Callable[[Any], None]
    refused: Optional[Callable[[str, bool], None]] = None


class TaskRunner(JobRunner):
    """Runs the tab's tasks on a lane's thread; a failure is (message, cancelled)."""

    def perform(self, job: Task) -> Any:
        if job.cancel.is_set():
            raise DownloadCancelled("cancelled before it started")
        return job.work(job)

    def failure(self, job: Task, error: Exception) -> tuple[str, bool]:
        if isinstance(error, DownloadCancelled):
            return str(error), True
        if isinstance(error, SpecDeskError):
            return str(error), False
        log.error("models job failed:\n%s", "".join(traceback.format_exception(error)))  # a bug
        return f"{type(error).__name__}: {error}", False


@dataclass
class DownloadRow:
    download_id: int
    repo_id: str
    filename: str
    row: int
    bar: QProgressBar
    button: QPushButton
    job: Optional[Task] = None
    state: str = "queued"  # queued, running, done, cancelled, failed
    path: Optional[str] = None
    message: str = ""
