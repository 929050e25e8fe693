"""`specdesk serve`: an OpenAI-compatible HTTP API on an engine host (Starlette + uvicorn).

The command lives here; its rooms beside it: protocol.py (the responses' shapes, stop sequences,
the "specdesk" field), request_checks.py (what a request may ask, and the refusals' words),
engine_queue.py (one generation at a time, FIFO, engine timeouts), metrics.py (GET /metrics),
asgi.py (the endpoints and the API key) and hardening.py (connection and descriptor guards).
A server that other machines can reach needs an API key, or --insecure-no-key said aloud.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import socket
import sys
from pathlib import Path

from specdesk.engines.types import SpecDeskError

from .engine_queue import ENGINE_TIMEOUT_S, REQUEST_TIMEOUT_S, Service
from .hardening import ACCEPT_BACKLOG, descriptor_budget, guarded_protocol


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
    from .asgi import build_app

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
