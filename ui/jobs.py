"""A job's stream to the GUI, without Qt: one run's StepEvents coalesced into StreamBatches at
most once per BATCH_INTERVAL_S, each token's text split out for the draft tint. What the
jobs do (load, chat, compare, sweep) is app/runtime/session.py's, or a server's
(app/serving/served.py); ui/worker.py runs them on its thread and sends these batches as
queued Qt signals.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

from specdesk.engines.text import IncrementalDetokenizer
from specdesk.engines.types import StepEvent

BATCH_INTERVAL_S = 1 / 60  # events are sent to the GUI at most this often per run (it repaints at ~30 Hz)


@dataclass(frozen=True)
class StreamBatch:
    """Consecutive StepEvents of one run, sent together (the GUI repaints at ~30 Hz anyway)."""

    job_id: int
    label: str  # "chat", "baseline", "speculative"
    k: int  # draft tokens per step of this run (0 for baseline)
    first: bool  # the first batch of this run: the GUI starts a new series
    events: tuple[StepEvent, ...]
    times: tuple[float, ...]  # (len(events),) time.perf_counter() when each event arrived
    pieces: tuple[str, ...]  # text of each committed token, in order, over all events
    from_draft: tuple[bool, ...]  # (len(pieces),) whether each token was an accepted draft token


class Throttle:
    """Lets an action through at most once per `interval_s`, the first call always.

    The first call never compares the clock with a made-up start value: perf_counter() and
    monotonic() count from an arbitrary point (the machine's boot on Linux), so on a freshly
    booted machine "now - 0.0" is small and would hold the first event back.
    """

    def __init__(self, interval_s: float, clock: Optional[Callable[[], float]] = None) -> None:
        self.interval_s = interval_s
        self._clock = clock if clock is not None else time.perf_counter
        self._last: Optional[float] = None  # clock reading of the last call let through

    def due(self, now: Optional[float] = None) -> bool:
        """Whether the interval has passed since the last call let through (True the first time)."""
        now = self._clock() if now is None else now
        return self._last is None or now - self._last >= self.interval_s

    def mark(self, now: Optional[float] = None) -> None:
        self._last = self._clock() if now is None else now


class EventBatcher:
    """Turns one run's StepEvents into StreamBatches, one per BATCH_INTERVAL_S at most.

    It also splits each step's text into per-token pieces (so the GUI can tint exactly the
    tokens that came from an accepted draft), with its own incremental detokenizer, which
    attaches the bytes of a character split across tokens to the token that completes it.
    Without `token_bytes` (a served engine's stream: no token ids, no per-token tint) each
    event's text is one piece, never tinted.
    """

    def __init__(self, job_id: int, label: str, k: int, token_bytes: Optional[Callable[[int], bytes]],
                 send: Callable[[StreamBatch], None], interval_s: float = BATCH_INTERVAL_S):
        self.job_id, self.label, self.k = job_id, label, k
        self._send = send
        self._throttle = Throttle(interval_s)
        self._detokenizer = IncrementalDetokenizer(token_bytes) if token_bytes is not None else None
        self._first = True
        self._events: list[StepEvent] = []
        self._times: list[float] = []
        self._pieces: list[str] = []
        self._from_draft: list[bool] = []

    def __call__(self, event: StepEvent) -> None:
        now = time.perf_counter()
        self._events.append(event)
        self._times.append(now)
        if self._detokenizer is None:
            self._pieces.append(event.text)
            self._from_draft.append(False)
        else:
            for token, drafted in zip(event.tokens, event.from_draft):
                self._pieces.append(self._detokenizer.push([token]))
                self._from_draft.append(drafted)
            if event.finished:
                self._pieces[-1] += self._detokenizer.flush()
        if event.finished or self._throttle.due(now):
            self.flush()

    def flush(self) -> None:
        if not self._events:
            return
        batch = StreamBatch(self.job_id, self.label, self.k, self._first, tuple(self._events), tuple(self._times),
                            tuple(self._pieces), tuple(self._from_draft))
        self._first = False
        self._events, self._times, self._pieces, self._from_draft = [], [], [], []
        self._throttle.mark()
        self._send(batch)
