"""HTTP transport to an OpenAI-compatible server, with bounds a hostile or broken server cannot lift.

One HTTP client (httpx2, the httpx line that huggingface_hub and openai already bring) speaks
to the server (docs/security.md): connect, first-byte and idle timeouts and a total deadline
from max_tokens, and an idle timeout on the reply's text, not its bytes (`Watchdog`: a server that
trickles bytes or streams events without text is as stuck as a silent one); server-sent-event
lines of at most MAX_LINE_BYTES and replies of at most MAX_REPLY_BYTES (`iter_lines`,
`bounded`); redirects followed only on the same server and never where they would turn a POST
into a GET, so the API key and the request go nowhere else. Every failure is an EndpointError
of one line that keeps the text received so far in `partial`.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.parse
from contextlib import contextmanager
from typing import Iterator, Optional

import httpx2

from specdesk.engines.types import SpecDeskError

from ..terminal import printable

MAX_METRICS_BYTES = 8 * 2**20  # /metrics and /v1/models answers
MAX_ERROR_BYTES = 64 * 1024  # the body of an HTTP error answer
MAX_LINE_BYTES = 2**20  # one server-sent-events line
MAX_REPLY_BYTES = 64 * 2**20  # a whole reply (streamed, or one JSON answer)
CONNECT_TIMEOUT_S = 10.0
# A reply that brings no new text for this long is ended, whatever bytes came meanwhile: a
# silent server, one trickling a byte at a time, one streaming events without text. Real servers
# send a token's text every few tens of milliseconds once the first has come.
IDLE_TIMEOUT_S = 20.0
SECONDS_PER_TOKEN = 2.0  # the total deadline: the first-byte timeout plus this per max token
MAX_REDIRECTS = 5


class EndpointError(SpecDeskError):
    """One line for the user (control characters from the server stripped); `partial` is the
    reply text received before the failure."""

    def __init__(self, message: str, partial: str = ""):
        super().__init__(printable(message, one_line=True))
        self.partial = partial


class ServerRedirected(EndpointError):
    """A redirect that was not followed: every next request would meet it again, so a terminal
    chat ends on it (exit status 2) instead of going on to the next message."""

    ends_chat = True


def base_url(url: str) -> str:
    """'http://host:port' from what a user types (with or without /v1, a trailing slash)."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise EndpointError(f"{url!r} is not a server address: use http://HOST:PORT (or https://)")
    path = parts.path.rstrip("/")
    path = path[: -len("/v1")] if path.endswith("/v1") else path
    return f"{parts.scheme}://{parts.netloc}{path}"


class Watchdog:
    """Ends a reply whose server goes quiet, stops bringing text, or runs past its deadline. A
    read blocked on the socket cannot be interrupted from another thread by closing it, so the
    socket is shut down, which ends the read at once; `reason` then says which bound it was and
    what the server did meanwhile.

    The idle clock starts at the reply's first byte and restarts at each piece of text
    (`moved`): bytes alone (`received`) and events alone (`line`) do not restart it."""

    def __init__(self, first_byte_s: float, idle_s: float, total_s: float, whole: bool = False):
        self.first_byte_s, self.idle_s, self.total_s = first_byte_s, idle_s, total_s
        self.whole = whole  # one JSON reply, not a stream of lines
        self.started = time.monotonic()
        self.last: Optional[float] = None  # the last byte
        self.last_text: Optional[float] = None  # the last text, or the first byte before any text
        self.bytes_since = self.lines_since = 0  # what came since the last text
        self.reason: Optional[str] = None
        self._socket: Optional[socket.socket] = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="endpoint-watchdog", daemon=True)

    def watch(self, response: httpx2.Response) -> "Watchdog":
        stream = response.extensions.get("network_stream")
        self._socket = stream.get_extra_info("socket") if stream is not None else None
        self._thread.start()
        return self

    def received(self, n_bytes: int) -> None:
        now = time.monotonic()
        if self.last_text is None:
            self.last_text = now
        self.last = now
        self.bytes_since += n_bytes

    def line(self) -> None:
        self.lines_since += 1

    def moved(self) -> None:
        self.last_text = time.monotonic()
        self.bytes_since = self.lines_since = 0

    def stop(self) -> None:
        self._done.set()

    def stalled(self) -> str:
        """What the server did in the idle time that ended the reply."""
        limit = f"{self.idle_s:g} s"
        if self.bytes_since == 0:
            return f"sent nothing for {limit} mid-reply"
        if self.whole:
            return f"sent {self.bytes_since:,} bytes in {limit} and not the whole reply (the limit for a reply " \
                   f"that brings nothing new is {limit})"
        if self.lines_since == 0:
            return f"trickled {self.bytes_since:,} bytes in {limit} without ending one line (the limit for a " \
                   f"reply that brings no text is {limit})"
        return f"sent {self.lines_since:,} lines ({self.bytes_since:,} bytes) but no text for {limit} (the limit " \
               f"for a reply that brings no text)"

    def _watch(self) -> None:
        while not self._done.wait(min(0.25, self.idle_s / 4)):
            now = time.monotonic()
            if self.last is None and now - self.started > self.first_byte_s:
                self.reason = f"sent nothing within {self.first_byte_s:g} s"
            elif self.last_text is not None and now - self.last_text > self.idle_s:
                self.reason = self.stalled()
            elif now - self.started > self.total_s:
                self.reason = f"did not finish the reply within its deadline of {self.total_s:g} s"
            if self.reason is not None:
                try:
                    if self._socket is not None:
                        self._socket.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return


class HttpTransport:
    """GET and POST to one server over one httpx2 client, within the bounds above."""

    def __init__(self, url: str, api_key: Optional[str] = None, timeout: float = 120.0):
        self.url = base_url(url)
        self.api_key = api_key or None
        self.model: Optional[str] = None  # the model asked for (named when the server no longer serves it)
        self.timeout = timeout  # first byte: a server may take this long over a long prompt
        self.connect_timeout = CONNECT_TIMEOUT_S
        self.idle_timeout = IDLE_TIMEOUT_S
        self.seconds_per_token = SECONDS_PER_TOKEN
        # trust_env: proxies and CA bundles from the environment, as urllib used them
        self._client = httpx2.Client(follow_redirects=True, max_redirects=MAX_REDIRECTS, trust_env=True,
                                    event_hooks={"response": [self._check_redirect]})

    def close(self) -> None:
        self._client.close()

    def _check_redirect(self, response: httpx2.Response) -> None:
        """A redirect is followed only on the same server (the same scheme, host and port, or http
        to https on the same host) and only where the request stays what it was: a 301, 302 or
        303 answer to a POST would have it sent again as a GET, without its body. Anything else
        is refused here, in one line, before httpx2 follows it."""
        if not response.has_redirect_location:
            return
        source = response.url
        target = source.join(response.headers["location"])
        where = f"{target.scheme}://{target.netloc.decode('ascii', 'replace')}"
        if source.scheme == "https" and target.scheme != "https":
            raise ServerRedirected(f"{self.url} redirected to {where}: a redirect from https to http is refused; "
                                "give the server's https address")
        upgrade = source.scheme == "http" and target.scheme == "https" and source.port in (None, 80) \
            and target.port in (None, 443)
        same = (source.scheme, source.port) == (target.scheme, target.port) or upgrade
        if source.host.lower() != target.host.lower() or not same:
            raise ServerRedirected(f"{self.url} redirected {source.path} to another server, {where}: the redirect was "
                                "not followed (the request and the API key go only where you said); give that "
                                "address if it is the server to use")
        method = response.request.method
        if method == "POST" and response.status_code in (301, 302, 303):
            raise ServerRedirected(f"{self.url} answered POST {source.path} with HTTP {response.status_code} to "
                                f"{target.path}: the redirect was not followed (it would send the request again "
                                "as a GET, without its body); give the address the server expects")

    @contextmanager
    def _open(self, path: str, body: Optional[dict] = None, timeout: Optional[float] = None):
        """The response to GET (or POST `body` to) `path`, headers read, body not yet; HTTP errors raised."""
        headers = {"Accept": "application/json, text/event-stream, text/plain",
                   "Accept-Encoding": "identity"}  # a compressed reply could unpack past the byte limits
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        wait = timeout or self.timeout
        request = self._client.build_request(
            "POST" if body is not None else "GET", self.url + path, headers=headers,
            content=None if body is None else json.dumps(body).encode(),
            timeout=httpx2.Timeout(wait, connect=min(self.connect_timeout, wait)))
        if body is not None:
            request.headers["Content-Type"] = "application/json"
        try:
            response = self._client.send(request, stream=True)
        except httpx2.TimeoutException as e:
            if isinstance(e, httpx2.ConnectTimeout):
                raise EndpointError(f"cannot reach {self.url}: no connection within "
                                    f"{min(self.connect_timeout, wait):g} s") from None
            raise EndpointError(f"{self.url} did not answer within {wait:g} s") from None
        except httpx2.TooManyRedirects:
            raise EndpointError(f"{self.url}{path} redirected more than {MAX_REDIRECTS} times") from None
        except httpx2.HTTPError as e:
            cause = e.__context__ if isinstance(e.__context__, OSError) else None
            reason = getattr(cause, "strerror", None) or str(e) or type(e).__name__
            raise EndpointError(f"cannot reach {self.url}: {reason}") from None
        try:
            if response.status_code >= 400:
                raise self._http_error(path, response)
            yield response
        finally:
            response.close()

    def _read(self, response: httpx2.Response, limit: int, what: str) -> bytes:
        """The whole body, refused past `limit` bytes."""
        data = bytearray()
        try:
            for chunk in response.iter_raw():
                data += chunk
                if len(data) > limit:
                    raise EndpointError(f"{what} is over {limit // 1024:,} KiB: not what an OpenAI-compatible server "
                                        "sends")
        except httpx2.TimeoutException:
            raise EndpointError(f"{self.url} did not answer within {self.timeout:g} s") from None
        except httpx2.HTTPError as e:
            raise EndpointError(f"{self.url} dropped the connection ({type(e).__name__})") from None
        return bytes(data)

    def _http_error(self, path: str, response: httpx2.Response) -> EndpointError:
        try:
            payload = json.loads(self._read(response, MAX_ERROR_BYTES, "the error answer") or b"{}")
            message = (payload.get("error") or {}).get("message") if isinstance(payload.get("error"), dict) \
                else payload.get("error") or payload.get("message") or payload.get("detail")
        except (ValueError, EndpointError, AttributeError):
            message = None
        said = f": {str(message).splitlines()[0][:200]}" if message and str(message).strip() else ""
        code = response.status_code
        if code in (401, 403):
            return EndpointError(f"{self.url} refused the API key (HTTP {code}{said}): "
                                 "give the server's key (--api-key, or the key field of Add server)")
        if code == 404 and path.endswith("/completions"):
            return EndpointError(f"{self.url} does not serve model {self.model!r} now (HTTP 404{said}): "
                                 "list its models again and choose one")
        return EndpointError(f"{self.url}{path}: HTTP {code}{said}")

    def _get_json(self, path: str, timeout: Optional[float] = None) -> dict:
        with self._open(path, timeout=timeout) as response:
            data = self._read(response, MAX_METRICS_BYTES, f"{self.url}{path}")
        try:
            payload = json.loads(data)
        except (ValueError, RecursionError):
            raise EndpointError(f"{self.url}{path} did not answer with JSON: is this an OpenAI-compatible "
                                "server?") from None
        if not isinstance(payload, dict):
            raise EndpointError(f"{self.url}{path} answered with JSON that is not an object")
        return payload


def watched(chunks: Iterator[bytes], watchdog: Watchdog) -> Iterator[bytes]:
    for chunk in chunks:
        watchdog.received(len(chunk))
        yield chunk


def bounded(chunks: Iterator[bytes], limit: int, url: str, reader) -> bytes:
    """All of `chunks`, refused past `limit` bytes (`reader.text`: the reply so far, kept in the error)."""
    data = bytearray()
    for chunk in chunks:
        data += chunk
        if len(data) > limit:
            raise EndpointError(f"{url} sent a reply over {limit // 2**20} MiB: stopped reading it", reader.text)
    return bytes(data)


def iter_lines(chunks: Iterator[bytes], cancel: threading.Event, url: str, reader,
               max_line: int = MAX_LINE_BYTES, max_reply: int = MAX_REPLY_BYTES) -> Iterator[str]:
    """Server-sent-event lines from raw bytes: a line over `max_line` bytes or a reply over
    `max_reply` bytes ends the reply with an EndpointError; `cancel` is seen between lines."""
    buffer = bytearray()
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > max_reply:
            raise EndpointError(f"{url} sent a reply over {max_reply // 2**20} MiB: stopped reading it", reader.text)
        buffer += chunk
        while True:
            end = buffer.find(b"\n")
            if end < 0:
                break
            line = bytes(buffer[:end])
            del buffer[:end + 1]
            yield line.decode("utf-8", "replace").rstrip("\r")
            if cancel.is_set():
                return
        if len(buffer) > max_line:
            raise EndpointError(f"{url} sent a line over {max_line // 1024} KiB: not server-sent events; "
                                "stopped reading", reader.text)
        if cancel.is_set():
            return
    if buffer:
        yield buffer.decode("utf-8", "replace").rstrip("\r")


def json_reply_lines(data: bytes, url: str) -> Iterator[str]:
    """A whole (not streamed) chat completion as the stream lines it stands for; a reply that
    is not one (no list of choices, and no error) is an EndpointError, never an empty reply."""
    try:
        reply = json.loads(data)
    except (ValueError, RecursionError):
        reply = None
    if not isinstance(reply, dict):
        raise EndpointError(f"{url} answered with a reply that is not a JSON object ({len(data):,} bytes): is this an "
                            "OpenAI-compatible server?")
    if "error" in reply:
        yield "data: " + json.dumps({"error": reply["error"]})
        return
    if not isinstance(reply.get("choices"), list):
        raise EndpointError(f"{url} answered with JSON that is not a chat completion (no choices): is this an "
                            "OpenAI-compatible server?")
    chunk = dict(reply)
    chunk["choices"] = [{"index": c.get("index", 0), "finish_reason": c.get("finish_reason"),
                         "delta": c.get("message") or {}} for c in reply.get("choices") or () if isinstance(c, dict)]
    yield "data: " + json.dumps(chunk)
    yield "data: [DONE]"
