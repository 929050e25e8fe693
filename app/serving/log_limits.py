"""Log lines a network peer can cause over and over, said once and then counted.

A client of `specdesk serve` that sends garbage makes uvicorn log "Invalid HTTP request
received." once per connection, and a server out of descriptors logs each failed accept or
open with its traceback: thousands of lines a minute, which fill a disk and bury the lines
that matter. `RepeatLimit` is a logging filter that lets the first such line through, holds
back the repeats for `every_s` seconds, and then lets one through again with the count held
back ("... (and 1,234 more like it in the last 60 s)"). An error about running out of
descriptors loses its traceback: the one line says all there is to say.

`Repeats` is the pure part: what to do with one more occurrence at a given time.
"""

from __future__ import annotations

import errno
import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

EVERY_S = 60.0  # a repeated line is said at most once per this long, with the count held back
# uvicorn's warnings for what a client sent or how many connected, one per connection (a
# record is limited when its message starts with one of these)
PEER_MESSAGES = ("Invalid HTTP request received.", "Unsupported upgrade request.", "No supported WebSocket library",
                 "Exceeded concurrency limit.")
OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})
LIMITED_LOGGERS = ("uvicorn.error", "asyncio")


@dataclass
class Repeats:
    """Occurrences of one kind of line: the first is said, then at most one per every_s."""

    every_s: float = EVERY_S
    said_at: Optional[float] = None
    held: int = 0  # occurrences not said since the last one that was

    def occur(self, now: float) -> Optional[int]:
        """None: hold this one back. Else say it, with the number held back before it."""
        if self.said_at is not None and now - self.said_at < self.every_s:
            self.held += 1
            return None
        held, self.held, self.said_at = self.held, 0, now
        return held


def held_note(held: int, every_s: float) -> str:
    return f" (and {held:,} more like it in the last {every_s:g} s)" if held else ""


def out_of_descriptors(record: logging.LogRecord) -> bool:
    """Whether the record is about an error for want of file descriptors ("Too many open files")."""
    error = record.exc_info[1] if record.exc_info else None
    return isinstance(error, OSError) and error.errno in OUT_OF_DESCRIPTORS


class RepeatLimit(logging.Filter):
    """Lets the first of each limited kind of record through, then one per every_s with the
    count held back in its message. Limited: messages that start with one of those given
    (each its own kind), and any record whose error
    is running out of descriptors (said without its traceback). Other records pass untouched."""

    def __init__(self, messages: Iterable[str] = PEER_MESSAGES, every_s: float = EVERY_S,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.messages = tuple(messages)
        self.every_s = every_s
        self.clock = clock
        self.kinds: dict[str, Repeats] = {}

    def kind(self, record: logging.LogRecord) -> Optional[str]:
        if out_of_descriptors(record):
            return "out of descriptors"
        message = record.getMessage()
        return next((m for m in self.messages if message.startswith(m)), None)

    def filter(self, record: logging.LogRecord) -> bool:
        kind = self.kind(record)
        if kind is None:
            return True
        held = self.kinds.setdefault(kind, Repeats(self.every_s)).occur(self.clock())
        if held is None:
            return False
        if kind == "out of descriptors":
            error = record.exc_info[1]
            record.msg = f"{record.getMessage()}: {error.strerror or error}; it recovers as connections close. " \
                         "Raise the open-files limit (ulimit -n) if these are real clients"
            record.exc_info = record.exc_text = None
        else:
            record.msg = record.getMessage()
        record.msg += held_note(held, self.every_s)
        record.args = ()
        return True


def install(loggers: Iterable[str] = LIMITED_LOGGERS, every_s: float = EVERY_S) -> RepeatLimit:
    """One RepeatLimit on each of these loggers (uvicorn's and asyncio's), shared by them."""
    limit = RepeatLimit(every_s=every_s)
    for name in loggers:
        logging.getLogger(name).addFilter(limit)
    return limit
