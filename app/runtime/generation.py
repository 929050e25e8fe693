"""One generation, consumed: the primitives that chat, compare, serving, training and the
measurements all run a request through.

`stream_once` passes an engine's StepEvents on as they come and returns the run's `RunResult`;
`run_once` runs it to the end; `drain` runs any such stream, each event to a callback. Timing
covers decoding only: from the start of the first verification pass to the end of the last, so
prompt processing (which prefix caching makes cheaper for whichever run comes second) is excluded.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Generator, Optional

from specdesk.engines.speculation.stats import StatsAccumulator
from specdesk.engines.types import GenerationRequest, RunStats, StepEvent


@dataclass(frozen=True)
class RunResult:
    tokens: tuple[int, ...]
    text: str
    stats: RunStats
    finish_reason: Optional[str]
    auto_report: Optional[dict] = None  # method auto: StepEvent.auto_report of the run's last step


def run_once(engine, request: GenerationRequest, cancel: Optional[threading.Event] = None,
             on_event: Optional[Callable[[StepEvent], None]] = None) -> RunResult:
    """Consume one generation; stats time the decode from its first pass to its last."""
    return drain(stream_once(engine, request, cancel), on_event)


def drain(stream: Generator[StepEvent, None, Any], on_event: Optional[Callable[[StepEvent], None]] = None) -> Any:
    """Run a stream of StepEvents to its end, each to `on_event`; returns the generator's value."""
    while True:
        try:
            event = next(stream)
        except StopIteration as done:
            return done.value
        if on_event is not None:
            on_event(event)


def stream_once(engine, request: GenerationRequest, cancel: Optional[threading.Event] = None
                ) -> Generator[StepEvent, None, RunResult]:
    """One generation's StepEvents as they come; the generator's return value is its RunResult."""
    cancel = cancel or threading.Event()
    accumulator = StatsAccumulator(request.spec.draft_tokens)
    tokens: list[int] = []
    text: list[str] = []
    finish_reason = None
    auto_report = None
    first = True
    for event in engine.generate(request, cancel):
        if first:
            # The generator processed the prompt before this first pass: start the
            # clock at the beginning of the pass itself.
            accumulator.start(at=time.perf_counter() - event.draft_s - event.verify_s)
            first = False
        accumulator.add(event)
        tokens.extend(event.tokens)
        text.append(event.text)
        finish_reason = event.finish_reason or finish_reason
        auto_report = event.auto_report or auto_report
        yield event
    if first:
        accumulator.start()
        finish_reason = "cancelled"
    elif cancel.is_set() and finish_reason is None:
        finish_reason = "cancelled"
    return RunResult(tuple(tokens), "".join(text), accumulator.finish(), finish_reason, auto_report)
