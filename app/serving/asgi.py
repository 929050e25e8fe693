"""The HTTP side of `specdesk serve` (Starlette): GET /v1/models, POST /v1/chat/completions and
/v1/completions (streamed as server-sent events or not), GET /metrics (Prometheus text), and the
API key every request must carry when the server has one.

What a client can make the server hold or do is bounded (docs/security.md): the body's size
and nesting, every numeric field's range, a prompt's length (refused before it is sent to the
engine), how long a body may take, how many bodies are received at once. A request's body and
fields are checked in request_checks.py, which also words the refusals: one line, with no path
of the server's files in it. A client that goes away stops its run; an error is one line for
the client, with any traceback in the server log.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from typing import Optional

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from specdesk.engines.types import SpecDeskError

from .engine_queue import Service
from .hardening import quiet_accept_errors
from .protocol import Outcome, Reply
from .request_checks import (MAX_BODY_BYTES, Params, RequestError, as_request_error, chat_messages, completion_prompt,
                             error_body, parse_body, parse_params)

MAX_BODIES_BYTES = 64 * 2**20  # all bodies being received at once


def build_app(service: Service, api_key: Optional[str] = None):
    """The ASGI application serving `service`; behind BearerAuth when there is an API key."""
    api = Api(service)
    routes = [
        Route("/v1/models", api.contained(api.models), methods=["GET"]),
        Route("/v1/chat/completions", api.contained(api.chat_completions), methods=["POST"]),
        Route("/v1/completions", api.contained(api.completions), methods=["POST"]),
        Route("/metrics", api.contained(api.metrics), methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=quiet_accept_errors)
    return BearerAuth(app, api_key) if api_key else app


class Api:
    """The endpoints over one Service."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def refuse(self, error: RequestError) -> Response:
        return JSONResponse(error_body(error, self.service.private), status_code=error.status)

    def contained(self, endpoint):
        """A failure nobody expected is a one-line 500 for the client; its traceback goes to the server log."""
        async def run(request: Request) -> Response:
            try:
                return await endpoint(request)
            except Exception as e:  # noqa: BLE001 - logged with its traceback, answered in one line
                return self.refuse(as_request_error(e))
        return run

    async def models(self, request: Request) -> Response:
        service = self.service
        return JSONResponse({"object": "list", "data": [
            {"id": service.model_id, "object": "model", "created": service.created, "owned_by": "specdesk"}]})

    async def metrics(self, request: Request) -> Response:
        return PlainTextResponse(self.service.metrics.render(), media_type="text/plain; version=0.0.4")

    async def chat_completions(self, request: Request) -> Response:
        return await self.complete(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self.complete(request, chat=False)

    async def receive_body(self, request: Request) -> bytes:
        service = self.service
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

    async def read_body(self, request: Request) -> dict:
        service = self.service
        try:
            data = await asyncio.wait_for(self.receive_body(request), service.request_timeout_s)
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

    async def complete(self, request: Request, chat: bool) -> Response:
        service = self.service
        try:
            body = await self.read_body(request)
            prompt = chat_messages(body) if chat else completion_prompt(body)
            params = parse_params(body, service.sampling, service.spec, service.draft_path)
            del body  # a request waiting its turn holds its prompt, not its whole body
        except RequestError as e:
            return self.refuse(e)
        reply = Reply(chat, params.stream, service.model_id, params.include_usage)
        try:
            service.check_prompt(prompt)
        except RequestError as e:
            return self.refuse(e)
        if params.stream:
            return StreamingResponse(self.stream_events(prompt, params, reply), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await self.answer(request, prompt, params, reply)

    async def answer(self, request: Request, prompt, params: Params, reply: Reply) -> Response:
        """The whole response at once; a client that goes away first stops its run, as a streamed one does."""
        pieces: list[str] = []

        async def collect() -> Outcome:
            async for item in self.service.generate(prompt, params):
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
                    task.cancel()
            await asyncio.wait({outcome_task, gone_task})
        if outcome_task.cancelled():
            return Response(status_code=499)  # nobody reads it: the connection is closed
        try:
            outcome = outcome_task.result()
        except (RequestError, SpecDeskError, MemoryError, RuntimeError) as e:
            return self.refuse(as_request_error(e))
        return JSONResponse(reply.whole("".join(pieces), outcome))

    async def stream_events(self, prompt, params: Params, reply: Reply):
        first = True
        try:
            async for item in self.service.generate(prompt, params):
                if isinstance(item, Outcome):
                    for chunk in reply.last_chunks(item, first):
                        yield chunk
                else:
                    yield reply.chunk([reply.choice(item, None, first)])
                    first = False
        except Exception as e:  # noqa: BLE001 - the stream has started: the error is its last chunk
            yield f"data: {json.dumps(error_body(as_request_error(e), self.service.private))}\n\n"
        yield "data: [DONE]\n\n"


async def client_gone(request: Request) -> None:
    """Returns when the client closes its connection (the body has been read by then)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class BearerAuth:
    """ASGI middleware: every HTTP request must carry `Authorization: Bearer <key>`."""

    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = JSONResponse(error_body(RequestError(
                    401, "a valid API key is required: send it as 'Authorization: Bearer KEY'",
                    kind="authentication_error")), status_code=401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
