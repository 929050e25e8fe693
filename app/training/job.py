"""`specdesk train-drafter` as a job of the app: the same command, in a child process of its own
(training holds the target and a PyTorch optimizer for minutes; the window stays free), with
its events and messages coming back over a queue, a pause that checkpoints, and a cancel.

No Qt here: ui/train_dialog.py polls `TrainingJob.events()` on a timer.
"""

from __future__ import annotations

import multiprocessing
import queue as queue_module
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from specdesk.engines.methods import trainable

from .cli import default_out


@dataclass(frozen=True)
class TrainingRequest:
    """What the app's dialog asks for: the command's own options."""

    target: str  # a Hugging Face model folder, or a GGUF file (EAGLE-3 and DFlash)
    method: str = field(default_factory=lambda: trainable()[0])  # the trainer's default
    minutes: float = 20.0
    device: str = "auto"
    from_history: bool = False
    out: Optional[str] = None  # default: beside the target, as the command's
    target_gguf: Optional[str] = None  # the target's GGUF: also export a GGUF drafter
    draft: Optional[str] = None  # a draft model the target has, to measure against
    extra: tuple[str, ...] = field(default_factory=tuple)  # further command options (tests: a tiny run)

    def __post_init__(self) -> None:
        if self.method not in trainable():
            raise ValueError(f"unknown training method {self.method!r}")

    def out_folder(self) -> Path:
        return Path(self.out) if self.out else default_out(Path(self.target), self.method)

    def argv(self, resume: bool = False) -> list[str]:
        argv = ["--target", self.target, "--method", self.method, "--minutes", f"{self.minutes:g}",
                "--device", self.device, "--out", str(self.out_folder())]
        if self.from_history:
            argv.append("--from-history")
        if self.target_gguf:
            argv += ["--target-gguf", self.target_gguf]
        if self.draft:
            argv += ["--draft", self.draft]
        if resume:
            argv.append("--resume")
        return argv + list(self.extra)


def _child(argv: list[str], events, stop) -> None:
    """The child process: the command, its messages and events onto `events`, paused by `stop`."""
    import argparse

    from . import cli

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)
        events.put({"phase": "message", "text": message})

    parser = argparse.ArgumentParser(prog="specdesk train-drafter")
    cli.add_arguments(parser)
    try:
        code = cli.run(parser.parse_args(argv), progress=events.put, should_stop=stop.is_set, say=say)
    except BaseException as e:  # noqa: BLE001 - the window is told, whatever it was
        events.put({"phase": "message", "text": f"error: {type(e).__name__}: {e}"})
        code = 1
    events.put({"phase": "exit", "code": code})


class TrainingJob:
    """One run of the command in a child process. `events()` drains what it sent so far;
    `pause()` asks it to checkpoint and stop (a resumed run continues there); `cancel()` ends
    it at once (what it recorded and its last checkpoint stay, so it can still be resumed)."""

    def __init__(self, request: TrainingRequest, resume: bool = False):
        self.request = request
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no Qt or threads copied by fork
        self._events = context.Queue()
        self._stop = context.Event()
        self.process = context.Process(target=_child, args=(request.argv(resume), self._events, self._stop),
                                       daemon=True, name="specdesk-train-drafter")
        self.exit_code: Optional[int] = None
        self.cancelled = False

    def start(self) -> None:
        self.process.start()

    def events(self) -> list[dict]:
        out = []
        while True:
            try:
                event = self._events.get_nowait()
            except queue_module.Empty:
                break
            except (EOFError, OSError):  # the child ended mid-message
                break
            if event.get("phase") == "exit":
                self.exit_code = int(event["code"])
            out.append(event)
        if not out and self.exit_code is None and not self.process.is_alive() and self.process.exitcode is not None:
            self.exit_code = self.process.exitcode  # it died without a word (killed, out of memory)
            out.append({"phase": "exit", "code": self.exit_code})
        return out

    @property
    def running(self) -> bool:
        return self.exit_code is None

    def pause(self) -> None:
        self._stop.set()

    def cancel(self) -> None:
        self.cancelled = True
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=10)

    def close(self) -> None:
        if self.process.is_alive():
            self.cancel()
        self._events.close()
