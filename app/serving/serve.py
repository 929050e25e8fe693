"""`specdesk serve`: an OpenAI-compatible HTTP API on an engine host (Starlette + uvicorn).

Endpoints: GET /v1/models, POST /v1/chat/completions and /v1/completions (streamed as
server-sent events or not), GET /metrics (Prometheus text). One engine serves one request
at a time; requests wait their turn in arrival order (asyncio.Lock wakes waiters FIFO).

Two fields beyond OpenAI's:
- request  "speculative": {"method": "none" | "ngram" | "draft" | ..., "k": 1..16} runs this
  request with another speculation method or k than the server's (method "none" is a
  baseline run, to compare against);
- response "specdesk": what speculation did for this request: drafts (verification steps
  that checked draft tokens), draft_tokens, accepted_tokens, acceptance_rate,
  drafted_per_position / accepted_per_position / acceptance_per_position,
  accepted_length_histogram (index n: passes that accepted n drafts), passes, tokens,
  seconds, tok_per_s, draft_s, verify_s, method, k. Streamed, it is in the last chunk.

What a client can make the server hold or do is bounded (docs/security.md): the body's size
and nesting, every numeric field's range, a prompt's length (refused before it is sent to the
engine), how long headers and a body may take, how many connections stay open, how many
requests wait. A request's body and fields are checked in app/serving/request_checks.py, which
also words the refusals: one line, with no path of the server's files in it. A client that goes away stops its run; an engine that stops answering is ended
(503) and replaced; an error is one line for the client, with any traceback in the server log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import hmac
import ipaddress
import json
import logging
import secrets
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Optional

from specdesk.engines.speculation.loop import check_prompt_text
from specdesk.engines.types import GenerationRequest, RunStats, SamplingParams, SpecConfig, SpecDeskError

from ..runtime.backend import ChatSettings, chat_turn
from ..runtime.generation import RunResult, run_once
from ..runtime.session import Session
from .request_checks import (MAX_BODY_BYTES, Params, RequestError, as_request_error, chat_messages, completion_prompt,
                             error_body, parse_body, parse_params, private_paths)

log = logging.getLogger("specdesk.serve")

# Bounds on what one client can make the server hold or do (docs/security.md); those on one
# request's body and fields are in app/serving/request_checks.py.
MAX_BODIES_BYTES = 64 * 2**20  # all bodies being received at once
REQUEST_TIMEOUT_S = 30.0  # a client's request headers and body must arrive within this
# An engine that produces nothing for this long (a long prompt's first token included) has its
# request stopped with a 503; one that stops answering altogether is ended by the heartbeat
# watchdog within seconds (app/runtime/engine_client.py). Long: a big prompt on a CPU takes minutes.
ENGINE_TIMEOUT_S = 600.0
MAX_WAITING = 64  # requests queued for the engine; more are refused with 503
FALLBACK_TOKEN_CHARS = 1024  # characters a token may stand for, when the engine cannot say
FD_RESERVE = 64  # descriptors kept for the engine process, its pipes, logs and model files
# Connections taken per wake-up of the listening socket (asyncio accepts this many before the
# connections closed for them are closed), and the kernel's queue of connections not taken yet
ACCEPT_BACKLOG = 128
MAX_CONNECTIONS = 1000  # open connections; over it the oldest one without a whole request is closed
ACCEPT_ERROR_EVERY_S = 60.0  # "Too many open files" is said once per this long, not per attempt


class StopMatcher:
    """Cuts the text at the first stop sequence; holds back what could be the start of one."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.held = ""
        self.stopped = False

    def push(self, text: str) -> str:
        if self.stopped:
            return ""
        self.held += text
        hits = [i for i in (self.held.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.held, self.stopped = self.held[: min(hits)], "", True
            return out
        cut = len(self.held) - self.hold
        out, self.held = self.held[:cut], self.held[cut:]
        return out

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


# --- metrics -------------------------------------------------------------------------
class Metrics:
    """Counters named like vLLM's and llama-server's, so one dashboard reads all three. The
    exposition format is a few lines of text; no client library is bundled for it."""

    def __init__(self, prefix: str = "specdesk") -> None:
        self.prefix = prefix
        self.drafts = self.draft_tokens = self.accepted_tokens = 0
        self.accepted_per_pos: list[int] = []
        self.prompt_tokens = self.generation_tokens = 0
        self.requests: dict[str, int] = {}
        self.running = self.waiting = 0

    def record(self, summary: dict, prompt_tokens: int, finish_reason: str) -> None:
        self.drafts += summary["drafts"]
        self.draft_tokens += summary["draft_tokens"]
        self.accepted_tokens += summary["accepted_tokens"]
        for i, n in enumerate(summary["accepted_per_position"]):
            if i >= len(self.accepted_per_pos):
                self.accepted_per_pos.append(0)
            self.accepted_per_pos[i] += n
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += summary["tokens"]
        self.requests[finish_reason] = self.requests.get(finish_reason, 0) + 1

    def render(self) -> str:
        p = self.prefix
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, int]]) -> None:
            lines.append(f"# HELP {p}:{name} {help_text}")
            lines.append(f"# TYPE {p}:{name} {kind}")
            full = f"{p}:{name}_total" if kind == "counter" else f"{p}:{name}"
            lines.extend(f"{full}{labels} {value}" for labels, value in samples)

        metric("spec_decode_num_drafts", "counter", "Verification steps that checked draft tokens.",
               [("", self.drafts)])
        metric("spec_decode_num_draft_tokens", "counter", "Draft tokens proposed.", [("", self.draft_tokens)])
        metric("spec_decode_num_accepted_tokens", "counter", "Draft tokens accepted.", [("", self.accepted_tokens)])
        metric("spec_decode_num_accepted_tokens_per_pos", "counter", "Draft tokens accepted, per draft position.",
               [(f'{{position="{i}"}}', n) for i, n in enumerate(self.accepted_per_pos)])
        metric("request_success", "counter", "Requests finished, by finish reason.",
               [(f'{{finished_reason="{r}"}}', n) for r, n in sorted(self.requests.items())])
        metric("prompt_tokens", "counter", "Prompt tokens processed.", [("", self.prompt_tokens)])
        metric("generation_tokens", "counter", "Tokens generated.", [("", self.generation_tokens)])
        metric("num_requests_running", "gauge", "Requests generating now.", [("", self.running)])
        metric("num_requests_waiting", "gauge", "Requests waiting for the engine.", [("", self.waiting)])
        return "\n".join(lines) + "\n"


def speculation_summary(stats: RunStats, drafts: int, spec: SpecConfig, auto_report: Optional[dict] = None) -> dict:
    """The "specdesk" field of a response: what speculation did for this request (with method
    auto, also its share of steps by method and k and the costs it chose with)."""
    return {
        **({"auto": auto_report} if auto_report else {}),
        "method": spec.method, "k": spec.draft_tokens,
        "drafts": drafts, "draft_tokens": stats.drafted, "accepted_tokens": stats.accepted,
        "acceptance_rate": round(stats.acceptance_rate, 6),
        "drafted_per_position": list(stats.per_position_drafted),
        "accepted_per_position": list(stats.per_position_accepted),
        "acceptance_per_position": [round(a, 6) for a in stats.per_position_acceptance],
        "accepted_length_histogram": list(stats.accepted_length_histogram),
        "passes": stats.passes, "tokens": stats.tokens, "seconds": round(stats.seconds, 6),
        "tok_per_s": round(stats.tok_per_s, 3), "draft_s": round(stats.draft_s, 6),
        "verify_s": round(stats.verify_s, 6),
    }


# --- the engine behind the API ------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    text: str  # the tail held back by the stop matcher
    result: RunResult
    prompt_tokens: int
    finish_reason: str  # OpenAI's: "stop" or "length"
    summary: dict


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
        if self.metrics.waiting >= self.max_waiting:
            raise RequestError(503, f"the server is busy: {self.metrics.waiting} requests are waiting for the "
                               "engine; try again later", kind="server_error")
        self.metrics.waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self.metrics.waiting -= 1
        self.metrics.running += 1
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()
        stopper = StopMatcher(params.stops)
        drafts = [0]

        def on_event(event) -> None:
            drafts[0] += event.drafted > 0
            loop.call_soon_threadsafe(queue.put_nowait, ("text", event.text))

        def work() -> None:
            try:
                # after the engine process died (or was ended), the next request starts a fresh one
                self.session.reopen(cancel)
                if prompt and isinstance(prompt[0], dict):  # a chat: the turn the terminal and the app take
                    settings = ChatSettings(params.spec, params.sampling, params.max_tokens, fit=False, record=False)
                    outcome = chat_turn(self.session, list(prompt), settings, cancel, on_event)
                    result, n_prompt = outcome.result, outcome.prompt_tokens
                else:
                    engine = self.engine
                    with engine.watching(cancel):  # a tokenizer that hangs is ended too
                        tokens = engine.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
                        room = engine.n_ctx - len(tokens)
                        max_tokens = params.max_tokens if params.max_tokens is not None else max(1, room)
                        request = GenerationRequest(tuple(tokens), max_tokens=max_tokens, sampling=params.sampling,
                                                    spec=params.spec)
                        result = run_once(engine, request, cancel, on_event)
                    n_prompt = len(tokens)
                loop.call_soon_threadsafe(queue.put_nowait, ("result", (result, n_prompt)))
            except BaseException as e:  # noqa: BLE001 - handed to the request, which answers with it
                loop.call_soon_threadsafe(queue.put_nowait, ("error", e))

        worker = loop.run_in_executor(None, work)
        stalled = False
        try:
            pending = None
            while True:
                if pending is None:
                    try:
                        kind, value = await next_item(queue, self.engine_timeout_s)
                    except asyncio.TimeoutError:
                        if stalled:  # the client ends the engine within its grace: wait for that
                            continue
                        stalled = True
                        log.warning("the engine sent nothing for %.0f s: ending it", self.engine_timeout_s)
                        cancel.set()
                        continue
                    if stalled and kind != "text":
                        raise RequestError(503, f"the engine did not answer within {self.engine_timeout_s:g} s: "
                                           "this request was stopped (a stuck engine is replaced for the next "
                                           "one); try again", kind="server_error")
                    if stalled:
                        continue
                else:
                    kind, value = pending
                pending = None
                if kind == "text":
                    # Steps that arrived together leave as one chunk: each chunk costs the
                    # server and the client a parse on the cores that run the model.
                    texts = [value]
                    while not queue.empty():
                        pending = queue.get_nowait()
                        if pending[0] != "text":
                            break
                        texts.append(pending[1])
                        pending = None
                    piece = stopper.push("".join(texts))
                    if stopper.stopped:
                        cancel.set()
                    if piece:
                        yield piece
                elif kind == "result":
                    result, n_prompt = value
                    finish = "stop" if stopper.stopped or result.finish_reason == "eos" else "length"
                    summary = speculation_summary(result.stats, drafts[0], params.spec, result.auto_report)
                    self.metrics.record(summary, n_prompt, finish)
                    yield Outcome(stopper.flush(), result, n_prompt, finish, summary)
                    return
                else:
                    raise value
        finally:
            cancel.set()  # a client that went away stops its run
            try:
                import anyio

                with anyio.CancelScope(shield=True):  # the engine's run ends before the next request's starts
                    await worker
                while not queue.empty():  # the run of a client that went away counts as vLLM's "abort"
                    kind, value = queue.get_nowait()
                    if kind == "result":
                        result, n_prompt = value
                        self.metrics.record(speculation_summary(result.stats, drafts[0], params.spec), n_prompt,
                                            "abort")
            finally:
                self.metrics.running -= 1
                self._lock.release()


# --- HTTP ----------------------------------------------------------------------------
def build_app(service: Service, api_key: Optional[str] = None):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
    from starlette.routing import Route

    def refuse(error: RequestError) -> Response:
        return JSONResponse(error_body(error, service.private), status_code=error.status)

    async def receive_body(request: Request) -> bytes:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise RequestError(413, f"the request body is over {MAX_BODY_BYTES // 2**20} MiB: send a shorter prompt")
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                service.receiving += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise RequestError(413, f"the request body is over {MAX_BODY_BYTES // 2**20} MiB: "
                                       "send a shorter prompt")
                if service.receiving > MAX_BODIES_BYTES:  # many large bodies at once: memory, not one client
                    raise RequestError(503, "the server is receiving too many large requests at once: try again",
                                       kind="server_error")
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            service.receiving -= size

    async def read_body(request: Request) -> dict:
        try:
            data = await asyncio.wait_for(receive_body(request), service.request_timeout_s)
        except asyncio.TimeoutError:
            raise RequestError(408, f"the request body did not arrive within {service.request_timeout_s:g} s") \
                from None
        body = parse_body(data)
        if not isinstance(body, dict):
            raise RequestError(400, "the request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise RequestError(400, "'model' is required: GET /v1/models lists it", "model")
        if model != service.model_id:
            raise RequestError(404, f"model {model!r} is not served here: use {service.model_id!r}", "model",
                               "not_found_error")
        return body

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": service.model_id, "object": "model", "created": service.created, "owned_by": "specdesk"}]})

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(service.metrics.render(), media_type="text/plain; version=0.0.4")

    def usage(outcome: Outcome) -> dict:
        n = outcome.result.stats.tokens
        return {"prompt_tokens": outcome.prompt_tokens, "completion_tokens": n,
                "total_tokens": outcome.prompt_tokens + n}

    async def complete(request: Request, chat: bool) -> Response:
        try:
            body = await read_body(request)
            prompt = chat_messages(body) if chat else completion_prompt(body)
            params = parse_params(body, service.sampling, service.spec, service.draft_path)
            del body  # a request waiting its turn holds its prompt, not its whole body
        except RequestError as e:
            return refuse(e)
        ident = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        obj = "chat.completion" if chat else "text_completion"

        def choice(text: Optional[str], finish: Optional[str], first: bool = False) -> dict:
            if not chat:
                return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            if params.stream:
                delta = {} if text is None else {"content": text}
                if first:
                    delta["role"] = "assistant"
                return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                    "finish_reason": finish}

        try:
            service.check_prompt(prompt)
        except RequestError as e:
            return refuse(e)
        if params.stream:
            return StreamingResponse(stream_events(prompt, params, ident, obj + ("" if not chat else ".chunk"),
                                                   choice, usage, chat),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        pieces: list[str] = []

        async def collect() -> Outcome:
            async for item in service.generate(prompt, params):
                if isinstance(item, Outcome):
                    pieces.append(item.text)
                    return item
                pieces.append(item)
            raise RuntimeError("the generation ended without its outcome")

        outcome_task = asyncio.ensure_future(collect())
        gone_task = asyncio.ensure_future(client_gone(request))
        try:
            await asyncio.wait({outcome_task, gone_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (outcome_task, gone_task):
                if not task.done():
                    task.cancel()  # a client that went away stops its run, as a streamed one does
            await asyncio.wait({outcome_task, gone_task})
        if outcome_task.cancelled():
            return Response(status_code=499)  # nobody reads it: the connection is closed
        try:
            outcome = outcome_task.result()
        except (RequestError, SpecDeskError, MemoryError, RuntimeError) as e:
            return refuse(as_request_error(e))
        return JSONResponse({"id": ident, "object": obj, "created": int(time.time()), "model": service.model_id,
                             "choices": [choice("".join(pieces), outcome.finish_reason)], "usage": usage(outcome),
                             "specdesk": outcome.summary})

    async def stream_events(prompt, params: Params, ident: str, obj: str, choice, usage, chat: bool):
        created = int(time.time())

        def chunk(choices: list, **extra) -> str:
            payload = {"id": ident, "object": obj, "created": created, "model": service.model_id, "choices": choices}
            if params.include_usage:
                payload["usage"] = None
            payload.update(extra)
            return f"data: {json.dumps(payload)}\n\n"

        first = True
        try:
            async for item in service.generate(prompt, params):
                if isinstance(item, Outcome):
                    if item.text:
                        yield chunk([choice(item.text, None, first)])
                        first = False
                    if first and chat:
                        yield chunk([choice("", None, True)])
                    final = {} if params.include_usage else {"specdesk": item.summary}
                    yield chunk([choice(None if chat else "", item.finish_reason)], **final)
                    if params.include_usage:
                        yield chunk([], usage=usage(item), specdesk=item.summary)
                else:
                    yield chunk([choice(item, None, first)])
                    first = False
        except Exception as e:  # noqa: BLE001 - the stream has started: the error is its last chunk
            yield f"data: {json.dumps(error_body(as_request_error(e), service.private))}\n\n"
        yield "data: [DONE]\n\n"

    async def client_gone(request: Request) -> None:
        """Returns when the client closes its connection (the body has been read by then)."""
        while (await request.receive())["type"] != "http.disconnect":
            pass

    async def chat_completions(request: Request) -> Response:
        return await complete(request, chat=True)

    async def completions(request: Request) -> Response:
        return await complete(request, chat=False)

    def contained(endpoint):
        """A failure nobody expected is a one-line 500 for the client; its traceback goes to the server log."""
        async def run(request: Request) -> Response:
            try:
                return await endpoint(request)
            except Exception as e:  # noqa: BLE001 - logged with its traceback, answered in one line
                return refuse(as_request_error(e))
        return run

    routes = [
        Route("/v1/models", contained(models), methods=["GET"]),
        Route("/v1/chat/completions", contained(chat_completions), methods=["POST"]),
        Route("/v1/completions", contained(completions), methods=["POST"]),
        Route("/metrics", contained(metrics), methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=quiet_accept_errors)
    return BearerAuth(app, api_key) if api_key else app


ACCEPT_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


@contextlib.asynccontextmanager
async def quiet_accept_errors(app):
    """asyncio logs a traceback each time accept() fails for want of descriptors, and schedules
    a retry a second later for each such failure (retries that log a traceback each when the
    server has closed by then): one line per ACCEPT_ERROR_EVERY_S says it instead."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    said_at = [-ACCEPT_ERROR_EVERY_S]

    def handler(loop, context: dict) -> None:
        error = context.get("exception")
        if isinstance(error, OSError) and error.errno in ACCEPT_ERRNOS:
            now = time.monotonic()
            if now - said_at[0] >= ACCEPT_ERROR_EVERY_S:
                said_at[0] = now
                print(f"specdesk serve: cannot accept more connections ({error.strerror}); new ones wait until "
                      "others close. Raise the limit (ulimit -n) if these are real clients", file=sys.stderr,
                      flush=True)
            return
        handle = context.get("handle")
        if getattr(getattr(handle, "_callback", None), "__name__", "") == "_start_serving" \
                and isinstance(context.get("exception"), (OSError, ValueError)):
            return  # a retry of the above, after the listening socket closed
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    try:
        yield
    finally:
        loop.set_exception_handler(previous)


def guarded_protocol(request_timeout_s: float, max_connections: int):
    """uvicorn's h11 protocol with two guards against clients that hold connections without
    finishing a request (uvicorn times out only idle keep-alive connections): a connection
    whose request headers have not all arrived within request_timeout_s is closed, and past
    max_connections open ones the oldest such connection is closed for the new one, so
    descriptors never run out and a real client always gets in."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.opened_at = self.loop.time()
            self.request_timer = None
            self._arm_request_timer()
            if len(self.connections) > max_connections:
                self._close_oldest_waiting()

        def waiting(self) -> bool:
            """No request in progress: before a request's headers are complete, or between requests."""
            return self.cycle is None or self.cycle.response_complete

        def _arm_request_timer(self) -> None:
            if self.request_timer is not None:
                self.request_timer.cancel()
            self.request_timer = self.loop.call_later(request_timeout_s, self._request_timed_out)

        def _request_timed_out(self) -> None:
            self.request_timer = None
            if self.waiting() and not self.transport.is_closing():
                self.transport.close()

        def _close_oldest_waiting(self) -> None:
            waiting = [p for p in self.connections if p is not self and getattr(p, "opened_at", None) is not None
                       and p.waiting() and not p.transport.is_closing()]
            victim = min(waiting, key=lambda p: p.opened_at) if waiting else self
            victim.transport.close()

        def handle_events(self) -> None:
            super().handle_events()
            if not self.waiting() and self.request_timer is not None:  # headers complete: the app times the body
                self.request_timer.cancel()
                self.request_timer = None

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_request_timer()  # a next request on this connection gets the same time

        def connection_lost(self, exc) -> None:
            if self.request_timer is not None:
                self.request_timer.cancel()
                self.request_timer = None
            super().connection_lost(exc)

    return GuardedH11Protocol


def descriptor_budget() -> int:
    """Open connections to allow: the descriptor limit (its soft value raised to the hard one)
    less a reserve for the engine process, its pipes and files, and for one burst of accepted
    connections; at most MAX_CONNECTIONS."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
    except (ImportError, ValueError, OSError):  # Windows, or a limit this process may not raise
        return MAX_CONNECTIONS
    return max(16, min(MAX_CONNECTIONS, int(soft) - FD_RESERVE - ACCEPT_BACKLOG))


def is_loopback(host: str) -> bool:
    """Whether every address `host` stands for is this machine only."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return False
    try:
        return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)
    except ValueError:
        return False


class BearerAuth:
    """ASGI middleware: every HTTP request must carry `Authorization: Bearer <key>`."""

    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                from starlette.responses import JSONResponse

                response = JSONResponse(error_body(RequestError(
                    401, "a valid API key is required: send it as 'Authorization: Bearer KEY'",
                    kind="authentication_error")), status_code=401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


# --- the command ------------------------------------------------------------------
def model_id_for(target: str) -> str:
    path = Path(target)
    return path.stem if path.suffix.lower() == ".gguf" else path.name


def add_serve_parser(sub) -> None:
    from ..options import add_model_options

    p = sub.add_parser("serve", help="serve the models over an OpenAI-compatible HTTP API")
    add_model_options(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 for every network)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every request")
    p.add_argument("--insecure-no-key", action="store_true",
                   help="serve an address other machines reach without --api-key (refused otherwise)")
    p.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT_S, metavar="S",
                   help=f"seconds a client has to send a request's headers, and again its body "
                        f"(default {REQUEST_TIMEOUT_S:g})")
    p.add_argument("--engine-timeout", type=float, default=ENGINE_TIMEOUT_S, metavar="S",
                   help=f"seconds the engine may send nothing (a long prompt's first token included) before "
                        f"the request gets a 503 and the engine is replaced (default {ENGINE_TIMEOUT_S:g})")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from ..options import build_configs, open_session, resolve_models

    if not (0 <= args.port <= 65535):
        raise SpecDeskError(f"--port {args.port} is out of range: use 0 to 65535")
    for option, value in (("--request-timeout", args.request_timeout), ("--engine-timeout", args.engine_timeout)):
        if not (0 < value <= 86400):
            raise SpecDeskError(f"{option} {value:g} is out of range: use more than 0 and at most 86400 seconds")
    if not args.api_key and not args.insecure_no_key and not is_loopback(args.host):
        raise SpecDeskError(f"--host {args.host} lets other machines reach the server, and there is no API key: "
                            "give --api-key KEY, or --insecure-no-key to serve that address without one")
    target, draft = resolve_models(args)
    spec, sampling = build_configs(args, draft)
    try:
        sock = socket.create_server((args.host, args.port))
    except OSError as e:
        raise SpecDeskError(f"cannot listen on {args.host}:{args.port} ({e.strerror}): choose another --port") from None
    max_connections = descriptor_budget()
    try:
        session = open_session(target, spec, args)
    except BaseException:
        sock.close()
        raise
    service = Service(session, model_id_for(target), spec, sampling, engine_timeout_s=args.engine_timeout,
                      request_timeout_s=args.request_timeout)
    try:
        app = build_app(service, args.api_key)
        host, port = sock.getsockname()[:2]
        print(f"specdesk serve: model {service.model_id!r} at http://{host}:{port}/v1 "
              f"(method {spec.method}{f', k = {spec.k}' if spec.method != 'none' else ''})"
              + ("" if args.api_key else " · no API key"), file=sys.stderr, flush=True)
        logging.basicConfig(format="specdesk serve: %(levelname)s %(message)s", level=logging.WARNING)
        from .log_limits import install as limit_repeated_lines

        limit_repeated_lines()  # what a peer can make uvicorn or asyncio log per connection: once, then a count
        server = uvicorn.Server(uvicorn.Config(
            app, log_level="warning", access_log=False, loop="asyncio",
            http=guarded_protocol(args.request_timeout, max_connections),
            # uvicorn counts open connections here too: the guard above keeps them under it,
            # so this refuses (503) only when that many requests are in progress
            limit_concurrency=max_connections + 1,
            timeout_keep_alive=5,  # seconds an idle connection stays open between requests
            backlog=ACCEPT_BACKLOG,
            h11_max_incomplete_event_size=16 * 1024))  # a request line and headers: at most 16 KiB
        server.run(sockets=[sock])
    finally:
        session.close()  # the engine running now (a crashed one is replaced on the next request)
        sock.close()
    return 0
