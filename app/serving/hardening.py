"""What keeps `specdesk serve` answering when clients hold connections open or descriptors run
out (docs/security.md): uvicorn's protocol with request timers and a connection cap, one line
instead of a traceback per failed accept(), and the connection budget the descriptor limit allows."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import sys
import time

FD_RESERVE = 64  # descriptors kept for the engine process, its pipes, logs and model files
# Connections taken per wake-up of the listening socket (asyncio accepts this many before the
# connections closed for them are closed), and the kernel's queue of connections not taken yet
ACCEPT_BACKLOG = 128
MAX_CONNECTIONS = 1000  # open connections; over it the oldest one without a whole request is closed
ACCEPT_ERROR_EVERY_S = 60.0  # "Too many open files" is said once per this long, not per attempt
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
