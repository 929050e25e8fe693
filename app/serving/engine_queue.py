"""The engine behind `specdesk serve`: one generation at a time, requests waiting their turn in
arrival order (asyncio.Lock wakes waiters FIFO), at most MAX_WAITING of them.

A run goes on in a worker thread and hands its text to the request through a queue; a client
that goes away stops its run, and an engine that sends nothing for ENGINE_TIMEOUT_S is stopped
(the request gets a 503, and the next one a fresh engine process).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Optional

from specdesk.engines.speculation.loop import check_prompt_text
from specdesk.engines.types import GenerationRequest, SamplingParams, SpecConfig, SpecDeskError

from ..runtime.backend import ChatSettings, chat_turn
from ..runtime.generation import run_once
from ..runtime.session import Session
from .metrics import Metrics
from .protocol import Outcome, StopMatcher, speculation_summary
from .request_checks import Params, RequestError, private_paths

log = logging.getLogger("specdesk.serve")

REQUEST_TIMEOUT_S = 30.0  # a client's request headers and body must arrive within this
# An engine that produces nothing for this long (a long prompt's first token included) has its
# request stopped with a 503; one that stops answering altogether is ended by the heartbeat
# watchdog within seconds (app/runtime/engine_client.py). Long: a big prompt on a CPU takes minutes.
ENGINE_TIMEOUT_S = 600.0
MAX_WAITING = 64  # requests queued for the engine; more are refused with 503
FALLBACK_TOKEN_CHARS = 1024  # characters a token may stand for, when the engine cannot say


async def next_item(queue: asyncio.Queue, timeout_s: float):
    """queue.get() within timeout_s (asyncio.TimeoutError past it). Before Python 3.12,
    asyncio.wait_for returns the item when a cancellation comes as the item arrives, and the
    cancellation is lost (a client that went away then has its run go on to the end); here it
    is raised, and the item goes back in the queue."""
    getter = asyncio.ensure_future(queue.get())
    try:
        done, _ = await asyncio.wait({getter}, timeout=timeout_s)
    except asyncio.CancelledError:
        if getter.done() and not getter.cancelled():
            queue.put_nowait(getter.result())
        else:
            getter.cancel()  # an item that arrives now stays in the queue
        raise
    if not done:
        getter.cancel()
        raise asyncio.TimeoutError
    return getter.result()


@dataclass
class Run:
    """One request's generation: what the worker thread hands over ("text", "result" or "error",
    in order), and how far the request has read it."""

    prompt: list[dict] | str | list[int]
    params: Params
    loop: asyncio.AbstractEventLoop
    stopper: StopMatcher
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    drafts: int = 0  # steps that checked draft tokens
    pending: Optional[tuple] = None  # an item read past the text that arrived together
    stalled: bool = False  # the engine sent nothing for the engine timeout and was told to stop

    def put(self, kind: str, value) -> None:
        """From the worker thread."""
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, value))

    def on_event(self, event) -> None:
        self.drafts += event.drafted > 0
        self.put("text", event.text)


class Service:
    """The loaded models (an app/runtime/session.Session), the configuration and counters; one
    generation at a time, FIFO."""

    def __init__(self, session: Session, model_id: str, spec: SpecConfig, sampling: SamplingParams,
                 engine_timeout_s: float = ENGINE_TIMEOUT_S, request_timeout_s: float = REQUEST_TIMEOUT_S,
                 max_waiting: int = MAX_WAITING):
        self.session = session
        self.model_id = model_id
        self.spec = spec
        self.sampling = sampling
        self.draft_path = session.draft_path
        self.engine_timeout_s = engine_timeout_s
        self.request_timeout_s = request_timeout_s
        self.max_waiting = max_waiting
        self.receiving = 0  # bytes of request bodies being received now
        self.metrics = Metrics()
        self.created = int(time.time())
        self._lock = asyncio.Lock()
        engine = session.need_engine()
        self.n_ctx = engine.n_ctx
        self.private = private_paths(str(engine.target.path), self.draft_path)  # never named to a client
        # The most characters one token stands for (raw text, and text with special tokens as a
        # chat template's is), read once in the engine: prompts are refused by length before
        # they reach it (as the CLI does), so a 50 MB prompt is never sent or tokenized.
        try:
            self.longest_token = {special: engine.call("max_token_chars", special) for special in (False, True)}
        except (SpecDeskError, RuntimeError) as e:  # an engine that cannot say: a bound no real token reaches
            log.warning("the engine could not give its longest token (%s): prompts are bounded at %d characters "
                        "a token", e, FALLBACK_TOKEN_CHARS)
            self.longest_token = {False: FALLBACK_TOKEN_CHARS, True: FALLBACK_TOKEN_CHARS}

    @property
    def engine(self):
        return self.session.engine

    def check_prompt(self, prompt: list[dict] | str | list[int]) -> None:
        """Refuse a prompt that cannot fit the context, before it is sent to the engine."""
        try:
            if isinstance(prompt, str):
                check_prompt_text(prompt, self.n_ctx, None, special=False, longest=self.longest_token[False])
            elif prompt and isinstance(prompt[0], dict):
                check_prompt_text("".join(m["content"] for m in prompt), self.n_ctx, None,
                                  longest=self.longest_token[True])
            elif len(prompt) >= self.n_ctx:
                raise SpecDeskError(f"the prompt is {len(prompt)} tokens but the context holds {self.n_ctx}: "
                                    "shorten it")
        except SpecDeskError as e:
            raise RequestError(400, str(e), "messages" if prompt and isinstance(prompt[0], dict) else "prompt") \
                from None

    async def generate(self, prompt: list[dict] | str | list[int], params: Params) -> AsyncIterator[str | Outcome]:
        """Text pieces as they come, then one Outcome. An engine that sends nothing for
        engine_timeout_s is stopped (and ended by the client after its grace, like Stop in the
        app): the request gets a 503 and the next one a fresh engine process."""
        await self._take_turn()
        run = Run(prompt, params, asyncio.get_running_loop(), StopMatcher(params.stops))
        worker = run.loop.run_in_executor(None, self._work, run)
        try:
            while True:
                kind, value = await self._next(run)
                if kind == "text":
                    piece = self._text(run, value)
                    if piece:
                        yield piece
                elif kind == "result":
                    yield self._outcome(run, value)
                    return
                else:
                    raise value
        finally:
            await self._end(run, worker)

    async def _take_turn(self) -> None:
        """Wait for the engine, in arrival order; refused when MAX_WAITING requests wait already."""
        if self.metrics.waiting >= self.max_waiting:
            raise RequestError(503, f"the server is busy: {self.metrics.waiting} requests are waiting for the "
                               "engine; try again later", kind="server_error")
        self.metrics.waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self.metrics.waiting -= 1
        self.metrics.running += 1

    def _work(self, run: Run) -> None:
        """The worker thread: one chat turn (the turn the terminal and the app take) or one completion."""
        params, prompt = run.params, run.prompt
        try:
            # after the engine process died (or was ended), the next request starts a fresh one
            self.session.reopen(run.cancel)
            if prompt and isinstance(prompt[0], dict):
                settings = ChatSettings(params.spec, params.sampling, params.max_tokens, fit=False, record=False)
                outcome = chat_turn(self.session, list(prompt), settings, run.cancel, run.on_event)
                result, n_prompt = outcome.result, outcome.prompt_tokens
            else:
                engine = self.engine
                with engine.watching(run.cancel):  # a tokenizer that hangs is ended too
                    tokens = engine.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
                    room = engine.n_ctx - len(tokens)
                    max_tokens = params.max_tokens if params.max_tokens is not None else max(1, room)
                    request = GenerationRequest(tuple(tokens), max_tokens=max_tokens, sampling=params.sampling,
                                                spec=params.spec)
                    result = run_once(engine, request, run.cancel, run.on_event)
                n_prompt = len(tokens)
            run.put("result", (result, n_prompt))
        except BaseException as e:  # noqa: BLE001 - handed to the request, which answers with it
            run.put("error", e)

    async def _next(self, run: Run) -> tuple[str, object]:
        """The run's next item. An engine silent for engine_timeout_s is told to stop; what it
        sends after that is dropped, and its end is a 503."""
        if run.pending is not None:
            item, run.pending = run.pending, None
            return item
        while True:
            try:
                kind, value = await next_item(run.queue, self.engine_timeout_s)
            except asyncio.TimeoutError:
                if not run.stalled:  # once stalled, the client ends the engine within its grace: wait for that
                    run.stalled = True
                    log.warning("the engine sent nothing for %.0f s: ending it", self.engine_timeout_s)
                    run.cancel.set()
                continue
            if run.stalled and kind != "text":
                raise RequestError(503, f"the engine did not answer within {self.engine_timeout_s:g} s: "
                                   "this request was stopped (a stuck engine is replaced for the next "
                                   "one); try again", kind="server_error")
            if not run.stalled:
                return kind, value

    @staticmethod
    def _text(run: Run, text: str) -> str:
        """The text to send now: steps that arrived together leave as one chunk (each chunk costs
        the server and the client a parse on the cores that run the model), cut at a stop."""
        texts = [text]
        while not run.queue.empty():
            item = run.queue.get_nowait()
            if item[0] != "text":
                run.pending = item
                break
            texts.append(item[1])
        piece = run.stopper.push("".join(texts))
        if run.stopper.stopped:
            run.cancel.set()
        return piece

    def _outcome(self, run: Run, value: tuple) -> Outcome:
        result, n_prompt = value
        finish = "stop" if run.stopper.stopped or result.finish_reason == "eos" else "length"
        summary = speculation_summary(result.stats, run.drafts, run.params.spec, result.auto_report)
        self.metrics.record(summary, n_prompt, finish)
        return Outcome(run.stopper.flush(), result, n_prompt, finish, summary)

    async def _end(self, run: Run, worker: asyncio.Future) -> None:
        """A client that went away stops its run; the engine's run ends before the next request's starts."""
        run.cancel.set()
        try:
            import anyio

            with anyio.CancelScope(shield=True):
                await worker
            while not run.queue.empty():  # the run of a client that went away counts as vLLM's "abort"
                kind, value = run.queue.get_nowait()
                if kind == "result":
                    result, n_prompt = value
                    self.metrics.record(speculation_summary(result.stats, run.drafts, run.params.spec), n_prompt,
                                        "abort")
        finally:
            self.metrics.running -= 1
            self._lock.release()
