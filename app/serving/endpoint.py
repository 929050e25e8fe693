"""Served engines: chat against OpenAI-compatible servers and read their speculation numbers.

A user whose target no longer fits one machine runs vLLM or SGLang (tensor / pipeline
parallel, EAGLE-3, MTP, DFlash, n-gram) or llama-server with a draft model; SpecDesk stays
the window onto it. `Endpoint` lists the server's models, tells which kind of server it is
and which speculation numbers it reports, and streams chat completions as StepEvents, like
an engine. Tok/s is measured from the stream; drafted and accepted tokens, tokens per pass
and per-position acceptance come from the server's own numbers:

  server          per request                                        around the request (/metrics)
  specdesk serve  "specdesk" field (every number, per position)      specdesk:spec_decode_*
  llama-server    timings.draft_n / draft_n_accepted                 llamacpp:spec_decode_* (with --metrics)
  vLLM            metrics.speculative_decoding (with                 vllm:spec_decode_*
                  --per-request-spec-decode-metrics summary)
  SGLang          sglext.spec_tokens_details                         sglang:spec_accept_* gauges: lifetime
                  (request field return_spec_tokens_details)         averages only
  other           none: tok/s only

Per-position acceptance from counters follows vLLM's documented reading: position i's
accepted-token delta over the delta of verification steps (num_drafts). Deltas are kept only
when the server's generated-token counter moved by exactly this reply's tokens; otherwise
other requests ran at the same time and the numbers would not be this reply's.

Servers stream text, not token ids: a streamed chunk is one StepEvent whose tokens are
UNKNOWN_TOKEN placeholders, as many as the chunk carried (from the server's running count
where it gives one, else one per chunk), so live tok/s curves are the stream's. The final
RunStats use the server's count of tokens. Every failure (unreachable, 401, a dropped stream,
a model that vanished, metrics that are not Prometheus text) is an EndpointError of one line
that keeps the text received so far in `partial`.

One HTTP client (httpx2, the httpx line that huggingface_hub and openai already bring) speaks
to the server, with bounds a hostile or broken server cannot lift (docs/security.md): connect, first-byte and idle timeouts and a total deadline from
max_tokens; SSE lines of at most MAX_LINE_BYTES and replies of at most MAX_REPLY_BYTES; the
stream stopped here once it carries more than max_tokens tokens; the API key dropped on a
redirect to another host, port or scheme, and no redirect from https to http. The server's
text is stripped of control characters (`printable`) before a terminal shows it.
"""

from __future__ import annotations

import json
import math
import re
import socket
import threading
import time
import urllib.parse
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

import httpx2

from specdesk.engines.types import RunStats, SamplingParams, SpecDeskError, StepEvent

from ..runtime.compare import RunResult
from ..terminal import printable

KINDS = ("specdesk", "llama-server", "vllm", "sglang", "generic")
METRIC_PREFIXES = {"specdesk": "specdesk", "llama-server": "llamacpp", "vllm": "vllm", "sglang": "sglang"}
GENERATED_COUNTER = {"specdesk": "generation_tokens_total", "llama-server": "tokens_predicted_total",
                     "vllm": "generation_tokens_total"}
UNKNOWN_TOKEN = -1  # a streamed token whose id the server did not send
MAX_METRICS_BYTES = 8 * 2**20  # /metrics and /v1/models answers
MAX_ERROR_BYTES = 64 * 1024  # the body of an HTTP error answer
MAX_LINE_BYTES = 2**20  # one server-sent-events line
MAX_REPLY_BYTES = 64 * 2**20  # a whole reply (streamed, or one JSON answer)
CONNECT_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 60.0  # silence allowed mid-reply
SECONDS_PER_TOKEN = 2.0  # the total deadline: the first-byte timeout plus this per max token
MAX_REDIRECTS = 5
METRICS_SETTLE_S = 2.0  # how long to wait for a server to count a finished reply in /metrics

class EndpointError(SpecDeskError):
    """One line for the user (control characters from the server stripped); `partial` is the
    reply text received before the failure."""

    def __init__(self, message: str, partial: str = ""):
        super().__init__(printable(message, one_line=True))
        self.partial = partial


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


# --- Prometheus text ---------------------------------------------------------------
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(\s+-?\d+)?\s*$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?\s*')


@dataclass(frozen=True)
class MetricSamples:
    """One scrape: (name, labels) -> value."""

    values: dict

    def total(self, name: str) -> Optional[float]:
        found = [v for (n, _), v in self.values.items() if n == name]
        return sum(found) if found else None

    def by_label(self, name: str, label: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for (n, labels), v in self.values.items():
            if n == name and label in dict(labels):
                key = dict(labels)[label]
                out[key] = out.get(key, 0.0) + v
        return out


def parse_metrics(text: str, source: str) -> MetricSamples:
    """Prometheus text exposition; a line that is not a sample or a comment is named."""
    values = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        value = None
        if match:
            try:
                value = float(match.group(3))
            except ValueError:
                value = None
        if value is None:
            raise EndpointError(f"{source}, line {number}: not Prometheus text ({line[:60]!r})")
        labels_text = (match.group(2) or "{}")[1:-1]
        labels = tuple(sorted((k, v) for k, v in LABEL.findall(labels_text)))
        values[(match.group(1), labels)] = values.get((match.group(1), labels), 0.0) + value
    return MetricSamples(values)


# --- what a server is and offers --------------------------------------------------------
@dataclass(frozen=True)
class ServerInfo:
    url: str
    kind: str  # one of KINDS
    models: tuple[str, ...]
    metrics: bool  # /metrics answers with this kind's speculation counters
    per_position: bool  # acceptance per draft position can be read (per request or from counter deltas)

    @property
    def per_request(self) -> bool:
        """Whether each reply carries its own drafted / accepted numbers."""
        return self.kind in ("specdesk", "llama-server", "vllm", "sglang")

    @property
    def switches_speculation(self) -> bool:
        """Whether one request can ask for a baseline run (specdesk serve's "speculative" field)."""
        return self.kind == "specdesk"

    def describe(self) -> str:
        """Which charts this server can fill, in one line."""
        name = {"specdesk": "specdesk serve", "llama-server": "llama-server", "vllm": "vLLM", "sglang": "SGLang",
                "generic": "an OpenAI-compatible server"}[self.kind]
        if self.kind == "vllm":
            numbers = ("this server reports acceptance per request when started with "
                       "--per-request-spec-decode-metrics, else from its counters around each reply")
        elif self.kind == "llama-server":
            numbers = "this server reports acceptance per request" + (
                "; per-position from its /metrics counters" if self.metrics else
                "; per-position needs --metrics")
        elif self.kind == "sglang":
            numbers = ("this server reports acceptance per request with return_spec_tokens_details; "
                       "its /metrics has only lifetime averages")
        elif self.kind == "specdesk":
            numbers = "this server reports acceptance and per-position acceptance per request"
        else:
            numbers = "this server reports no speculation numbers: tok/s only"
        return f"{name}, {len(self.models)} model(s): {numbers}"


@dataclass(frozen=True)
class ServedNumbers:
    """What the server said speculation did for one reply."""

    source: str  # "per request", "per request + metric deltas", "metric deltas", "none"
    drafted: int = 0
    accepted: int = 0
    passes: Optional[int] = None  # verification passes, where the server counts them
    per_position_drafted: tuple[int, ...] = ()
    per_position_accepted: tuple[int, ...] = ()
    histogram: tuple[int, ...] = ()  # index n: passes that accepted n draft tokens
    raw: dict = field(default_factory=dict)  # the server's own fields, as received


@dataclass(frozen=True)
class ServedRun:
    """One reply from a server: a RunResult like an engine's (tokens unknown: ()), the
    server's numbers, and a note when some of them could not be read."""

    result: RunResult
    numbers: ServedNumbers
    note: Optional[str] = None


# --- the client -------------------------------------------------------------------
class Watchdog:
    """Ends a reply whose server goes quiet or runs past its deadline. A read blocked on the
    socket cannot be interrupted from another thread by closing it, so the socket is shut
    down, which ends the read at once; `reason` then says which bound it was."""

    def __init__(self, first_byte_s: float, idle_s: float, total_s: float):
        self.first_byte_s, self.idle_s, self.total_s = first_byte_s, idle_s, total_s
        self.started = time.monotonic()
        self.last: Optional[float] = None
        self.reason: Optional[str] = None
        self._socket: Optional[socket.socket] = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="endpoint-watchdog", daemon=True)

    def watch(self, response: httpx2.Response) -> "Watchdog":
        stream = response.extensions.get("network_stream")
        self._socket = stream.get_extra_info("socket") if stream is not None else None
        self._thread.start()
        return self

    def progress(self) -> None:
        self.last = time.monotonic()

    def stop(self) -> None:
        self._done.set()

    def _watch(self) -> None:
        while not self._done.wait(min(0.25, self.idle_s / 4)):
            now = time.monotonic()
            if self.last is None and now - self.started > self.first_byte_s:
                self.reason = f"sent nothing within {self.first_byte_s:g} s"
            elif self.last is not None and now - self.last > self.idle_s:
                self.reason = f"sent nothing for {self.idle_s:g} s mid-reply"
            elif now - self.started > self.total_s:
                self.reason = f"did not finish the reply within its deadline of {self.total_s:g} s"
            if self.reason is not None:
                try:
                    if self._socket is not None:
                        self._socket.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return


class Endpoint:
    """An OpenAI-compatible server, spoken to over HTTP."""

    def __init__(self, url: str, api_key: Optional[str] = None, model: Optional[str] = None,
                 timeout: float = 120.0):
        self.url = base_url(url)
        self.api_key = api_key or None
        self.model = model
        self.timeout = timeout  # first byte: a server may take this long over a long prompt
        self.connect_timeout = CONNECT_TIMEOUT_S
        self.idle_timeout = IDLE_TIMEOUT_S
        self.seconds_per_token = SECONDS_PER_TOKEN
        self._info: Optional[ServerInfo] = None
        # trust_env: proxies and CA bundles from the environment, as urllib used them
        self._client = httpx2.Client(follow_redirects=True, max_redirects=MAX_REDIRECTS, trust_env=True,
                                    event_hooks={"response": [self._refuse_downgrade]})

    @property
    def name(self) -> str:
        return "endpoint"

    def close(self) -> None:
        self._client.close()

    def _refuse_downgrade(self, response: httpx2.Response) -> None:
        """httpx2 drops the Authorization header on a redirect to another origin; a redirect
        from https to http is refused outright (the request and its reply would travel in the clear)."""
        if response.has_redirect_location and response.url.scheme == "https":
            target = response.url.join(response.headers["location"])
            if target.scheme != "https":
                raise EndpointError(f"{self.url} redirected to {target.scheme}://{target.host}: a redirect from "
                                    "https to http is refused; give the server's https address")

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

    # --- what the server is -------------------------------------------------------------
    def list_models(self) -> list[dict]:
        payload = self._get_json("/v1/models")
        data = payload.get("data")
        if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data):
            raise EndpointError(f"{self.url}/v1/models: no model list in the answer (expected data: [{{id: ...}}])")
        return data

    def scrape(self) -> Optional[MetricSamples]:
        """/metrics now; None when the server has none (404, or refused)."""
        try:
            with self._open("/metrics", timeout=min(self.timeout, 15.0)) as response:
                text = self._read(response, MAX_METRICS_BYTES, f"{self.url}/metrics").decode("utf-8", "replace")
        except EndpointError as e:
            if "HTTP 404" in str(e) or "HTTP 501" in str(e) or "HTTP 405" in str(e):
                return None
            raise
        return parse_metrics(text, f"{self.url}/metrics")

    def probe(self) -> ServerInfo:
        """Models, the kind of server and what it reports (cached on this Endpoint)."""
        models = self.list_models()
        owners = {str(m.get("owned_by", "")).lower() for m in models}
        try:
            samples = self.scrape()
        except EndpointError:
            samples = None
        names = {name for name, _ in samples.values} if samples else set()
        kind = "generic"
        for candidate, owner in (("specdesk", "specdesk"), ("llama-server", "llamacpp"), ("vllm", "vllm"),
                                 ("sglang", "sglang")):
            prefix = METRIC_PREFIXES[candidate] + ":"
            if owner in owners or any(n.startswith(prefix) for n in names):
                kind = candidate
                break
        prefix = METRIC_PREFIXES.get(kind)
        has_counters = bool(prefix) and f"{prefix}:spec_decode_num_drafts_total" in names
        per_position = kind in ("specdesk", "vllm") or (kind == "llama-server" and has_counters)
        self._info = ServerInfo(self.url, kind, tuple(m["id"] for m in models), has_counters, per_position)
        if self.model is None and self._info.models:
            self.model = self._info.models[0]
        elif self.model is not None and self.model not in self._info.models:
            raise EndpointError(f"{self.url} does not serve model {self.model!r}: it serves "
                                + ", ".join(repr(m) for m in self._info.models[:8]))
        return self._info

    @property
    def info(self) -> ServerInfo:
        return self._info if self._info is not None else self.probe()

    @property
    def target_label(self) -> str:
        return f"{self.url} · {self.model}"

    # --- chat -------------------------------------------------------------------------
    def request_body(self, messages: list[dict], sampling: SamplingParams, max_tokens: int,
                     speculative: Optional[dict]) -> dict:
        info = self.info
        body = {"model": self.model, "messages": messages, "stream": True,
                "stream_options": {"include_usage": True}, "max_tokens": max_tokens,
                "temperature": sampling.temperature, "top_p": sampling.top_p, "seed": sampling.seed}
        if sampling.top_k and info.kind != "generic":
            body["top_k"] = sampling.top_k
        if info.kind == "llama-server":
            body["timings_per_token"] = True  # running draft_n / draft_n_accepted on every chunk
        elif info.kind == "vllm":
            body["stream_options"]["continuous_usage_stats"] = True  # running token count on every chunk
        elif info.kind == "sglang":
            body["return_spec_tokens_details"] = True
        if speculative is not None:
            if not info.switches_speculation:
                raise EndpointError(f"{self.url} ({info.kind}) cannot switch speculation per request: "
                                    "compare against a second server with --baseline-endpoint")
            body["speculative"] = speculative
        return body

    def stream_chat(self, messages: list[dict], sampling: SamplingParams = SamplingParams(), max_tokens: int = 128,
                    cancel: Optional[threading.Event] = None, speculative: Optional[dict] = None
                    ) -> Iterator[StepEvent]:
        """StepEvents as the reply streams; the generator's return value is the ServedRun."""
        cancel = cancel or threading.Event()
        info = self.info
        body = self.request_body(messages, sampling, max_tokens, speculative)
        before = self._scrape_quietly() if info.metrics else None
        sent = time.perf_counter()
        reader = StreamReader(self.url)
        first_at = last_at = None
        over = False  # the server sent more tokens than max_tokens: the rest is not read
        watchdog = Watchdog(self.timeout, self.idle_timeout, self.timeout + max_tokens * self.seconds_per_token)
        try:
            with self._open("/v1/chat/completions", body) as response:
                watchdog.watch(response)
                # a server that does not stream answers with one JSON reply
                whole = response.headers.get("content-type", "").split(";")[0].strip() == "application/json"
                try:
                    chunks = watched(response.iter_raw(), watchdog)
                    lines = json_reply_lines(bounded(chunks, MAX_REPLY_BYTES, self.url, reader)) if whole \
                        else iter_lines(chunks, cancel, self.url, reader)
                    for line in lines:
                        kept = reader.tokens_seen
                        chunk = reader.feed(line)
                        if chunk is None:
                            continue
                        if reader.tokens_seen > max_tokens:  # more than was asked for: not shown, not kept
                            reader.cut(kept)
                            over = True
                            break
                        text, count, drafted, accepted = chunk
                        now = time.perf_counter()
                        if first_at is None:
                            first_at = now
                        last_at = now
                        yield StepEvent(tokens=(UNKNOWN_TOKEN,) * count, text=text, drafted=drafted,
                                        accepted=accepted, position_accepted=(), from_draft=(False,) * count,
                                        draft_s=0.0, verify_s=0.0)
                except httpx2.HTTPError as e:
                    if watchdog.reason is not None:
                        raise EndpointError(f"{self.url} {watchdog.reason}, after {len(reader.text)} characters",
                                            reader.text) from None
                    reason = "timed out" if isinstance(e, httpx2.TimeoutException) else "dropped the connection"
                    raise EndpointError(f"{self.url} {reason} mid-reply after {len(reader.text)} characters",
                                        reader.text) from None
                if watchdog.reason is not None and not reader.done:
                    raise EndpointError(f"{self.url} {watchdog.reason}, after {len(reader.text)} characters",
                                        reader.text)
                if reader.error is not None:
                    raise EndpointError(f"{self.url} ended the reply with an error: {reader.error}", reader.text)
                if not cancel.is_set() and not reader.done and not over:
                    raise EndpointError(f"{self.url} closed the stream mid-reply after {len(reader.text)} "
                                        "characters", reader.text)
        finally:
            watchdog.stop()
        if over:
            reader.finish_reason = "length"
        finish = "cancelled" if cancel.is_set() else reader.finish_reason
        tokens = reader.completion_tokens()
        seconds = decode_seconds(sent, first_at, last_at, tokens)
        note = f"{self.url} sent more than the {max_tokens} tokens asked for: the reply was cut there" if over \
            else None
        numbers = reader.per_request_numbers()
        if info.metrics and finish != "cancelled" and not over and not numbers.per_position_accepted:
            try:
                numbers, note = self._with_metric_deltas(numbers, before, tokens)
            except EndpointError as e:
                note = str(e)
        result = RunResult((), reader.text, served_stats(tokens, seconds, numbers), finish)
        return ServedRun(result, numbers, note)

    def chat(self, messages: list[dict], sampling: SamplingParams = SamplingParams(), max_tokens: int = 128,
             cancel: Optional[threading.Event] = None, on_event: Optional[Callable[[StepEvent], None]] = None,
             speculative: Optional[dict] = None) -> ServedRun:
        stream = self.stream_chat(messages, sampling, max_tokens, cancel, speculative)
        while True:
            try:
                event = next(stream)
            except StopIteration as done:
                return done.value
            if on_event is not None:
                on_event(event)

    # --- counters around a reply --------------------------------------------------------
    def _scrape_quietly(self) -> Optional[MetricSamples]:
        try:
            return self.scrape()
        except EndpointError:
            return None  # said after the reply, when the deltas are wanted

    def _with_metric_deltas(self, numbers: ServedNumbers, before: Optional[MetricSamples],
                            tokens: int) -> tuple[ServedNumbers, Optional[str]]:
        info = self.info
        prefix = METRIC_PREFIXES[info.kind]
        if before is None:
            self.scrape()  # raises the one-line reason when /metrics is broken
            return numbers, f"{self.url}/metrics could not be read before the reply: no per-position numbers"
        counter = GENERATED_COUNTER.get(info.kind)
        deadline = time.monotonic() + METRICS_SETTLE_S
        while True:  # a server may count a reply a moment after its last chunk
            after = self.scrape()
            if after is None:
                return numbers, f"{self.url}/metrics went away: no per-position numbers"
            moved = None if counter is None else delta(after, before, f"{prefix}:{counter}")
            if moved is None or moved >= tokens or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if moved is not None and moved != tokens:
            return numbers, (f"{self.url} generated {moved:g} tokens while this reply had {tokens}: other requests "
                             "ran at the same time, so its counters are left out")
        drafts = delta(after, before, f"{prefix}:spec_decode_num_drafts_total")
        drafted = delta(after, before, f"{prefix}:spec_decode_num_draft_tokens_total")
        accepted = delta(after, before, f"{prefix}:spec_decode_num_accepted_tokens_total")
        name = f"{prefix}:spec_decode_num_accepted_tokens_per_pos_total"
        per_after, per_before = after.by_label(name, "position"), before.by_label(name, "position")
        width = max((int(p) + 1 for p in per_after if p.isdigit()), default=0)
        per_accepted = tuple(int(per_after.get(str(i), 0) - per_before.get(str(i), 0)) for i in range(width))
        if drafts is None or drafted is None or accepted is None:
            return numbers, f"{self.url}/metrics has no {prefix}:spec_decode_* counters: no per-position numbers"
        source = "metric deltas" if numbers.source == "none" else numbers.source + " + metric deltas"
        if numbers.source == "none":
            numbers = ServedNumbers(source, int(drafted), int(accepted))
        width = max(width, len(numbers.per_position_drafted))
        per_drafted = numbers.per_position_drafted or (int(drafts),) * width
        per_accepted = numbers.per_position_accepted or per_accepted
        return ServedNumbers(source, numbers.drafted, numbers.accepted, numbers.passes, per_drafted, per_accepted,
                             numbers.histogram, {**numbers.raw, "metric_deltas": {
                                 "drafts": drafts, "draft_tokens": drafted, "accepted_tokens": accepted,
                                 "accepted_per_position": list(per_accepted)}}), None


def delta(after: MetricSamples, before: MetricSamples, name: str) -> Optional[float]:
    now = after.total(name)
    return None if now is None else now - (before.total(name) or 0.0)


def decode_seconds(sent: float, first_at: Optional[float], last_at: Optional[float], tokens: int) -> float:
    """Decode time for `tokens` tokens, measured from the stream: the gap between the first
    and the last chunk covers tokens - 1 of them (the first one's time is the prompt's), so it
    is scaled to all; a reply that came in one chunk counts from the request."""
    if first_at is None or last_at is None:
        return 0.0
    if tokens > 1 and last_at > first_at:
        return (last_at - first_at) * tokens / (tokens - 1)
    return last_at - sent


def served_stats(tokens: int, seconds: float, numbers: ServedNumbers) -> RunStats:
    """RunStats from a server's numbers: every pass commits its accepted drafts plus one
    token of the target's, so passes = tokens - accepted where the server does not count them."""
    passes = numbers.passes if numbers.passes is not None else max(0, tokens - numbers.accepted)
    return RunStats(tokens=tokens, seconds=seconds, passes=passes, drafted=numbers.drafted,
                    accepted=numbers.accepted, draft_s=0.0, verify_s=0.0,
                    per_position_drafted=numbers.per_position_drafted,
                    per_position_accepted=numbers.per_position_accepted,
                    accepted_length_histogram=numbers.histogram)


# --- the stream ---------------------------------------------------------------------
def watched(chunks: Iterator[bytes], watchdog: Watchdog) -> Iterator[bytes]:
    for chunk in chunks:
        watchdog.progress()
        yield chunk


def bounded(chunks: Iterator[bytes], limit: int, url: str, reader: "StreamReader") -> bytes:
    """All of `chunks`, refused past `limit` bytes."""
    data = bytearray()
    for chunk in chunks:
        data += chunk
        if len(data) > limit:
            raise EndpointError(f"{url} sent a reply over {limit // 2**20} MiB: stopped reading it", reader.text)
    return bytes(data)


def iter_lines(chunks: Iterator[bytes], cancel: threading.Event, url: str, reader: "StreamReader",
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


def json_reply_lines(data: bytes) -> Iterator[str]:
    """A whole (not streamed) chat completion as the stream lines it stands for."""
    try:
        reply = json.loads(data)
    except (ValueError, RecursionError):
        reply = None
    if not isinstance(reply, dict):
        return
    chunk = dict(reply)
    chunk["choices"] = [{"index": c.get("index", 0), "finish_reason": c.get("finish_reason"),
                         "delta": c.get("message") or {}} for c in reply.get("choices") or () if isinstance(c, dict)]
    yield "data: " + json.dumps(chunk)
    yield "data: [DONE]"


def _int(value) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        else 0


class StreamReader:
    """Folds server-sent chat completion chunks: text, counts and each server's numbers."""

    def __init__(self, url: str):
        self.url = url
        self.pieces: list[str] = []
        self.done = False
        self.finish_reason: Optional[str] = None
        self.error: Optional[str] = None
        self.chunks = 0  # chunks that carried text
        self.usage_tokens: Optional[int] = None
        self.timings: Optional[dict] = None
        self.vllm: Optional[dict] = None
        self.sglang: Optional[dict] = None
        self.specdesk: Optional[dict] = None
        self._counted = 0  # tokens already handed out as events
        self._drafted = self._accepted = 0  # running llama-server counts already handed out

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def feed(self, line: str) -> Optional[tuple[str, int, int, int]]:
        """One SSE line; (text, tokens, drafted, accepted) when it carried text, else None."""
        if not line.startswith("data:"):
            return None
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return None
        try:
            chunk = json.loads(data)
        except (ValueError, RecursionError):
            raise EndpointError(f"{self.url} sent a chunk that is not JSON ({data[:60]!r})", self.text) from None
        if not isinstance(chunk, dict):
            return None
        if "error" in chunk:
            error = chunk["error"]
            self.error = str(error.get("message") if isinstance(error, dict) else error).splitlines()[0][:200]
            self.done = True
            return None
        usage = chunk.get("usage")
        if isinstance(usage, dict) and "completion_tokens" in usage:
            self.usage_tokens = _int(usage["completion_tokens"])
        if isinstance(chunk.get("timings"), dict):
            self.timings = chunk["timings"]
        metrics = chunk.get("metrics")
        if isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict):
            self.vllm = metrics["speculative_decoding"]
        sglext = chunk.get("sglext")
        if isinstance(sglext, dict) and isinstance(sglext.get("spec_tokens_details"), dict):
            self.sglang = sglext["spec_tokens_details"]
        if isinstance(chunk.get("specdesk"), dict):
            self.specdesk = chunk["specdesk"]
        text = ""
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict):
                delta = choice.get("delta") or {}
                text += (delta.get("content") or "") if isinstance(delta, dict) else ""
                if choice.get("finish_reason"):
                    self.finish_reason = {"stop": "eos"}.get(choice["finish_reason"], choice["finish_reason"])
        if not text:
            return None
        self.pieces.append(text)
        self.chunks += 1
        running = self._running_count()
        count = max(1, running - self._counted) if running is not None else 1
        self._counted += count
        drafted = accepted = 0
        if self.timings is not None and "draft_n" in self.timings:
            drafted = max(0, _int(self.timings.get("draft_n")) - self._drafted)
            accepted = max(0, _int(self.timings.get("draft_n_accepted")) - self._accepted)
            self._drafted += drafted
            self._accepted += accepted
        return text, count, drafted, accepted

    def cut(self, tokens: int) -> None:
        """Forget the last chunk with text: the reply ends with the `tokens` tokens before it."""
        self.pieces.pop()
        self.chunks -= 1
        self._counted = self.usage_tokens = tokens

    @property
    def tokens_seen(self) -> int:
        """Tokens the reply has carried so far (at least one per chunk with text)."""
        return self._counted

    def _running_count(self) -> Optional[int]:
        if self.timings is not None and "predicted_n" in self.timings:
            return _int(self.timings["predicted_n"])
        return self.usage_tokens

    def completion_tokens(self) -> int:
        if self.usage_tokens is not None:
            return self.usage_tokens
        if self.timings is not None and "predicted_n" in self.timings:
            return _int(self.timings["predicted_n"])
        if self.specdesk is not None:
            return _int(self.specdesk.get("tokens"))
        return self._counted

    def per_request_numbers(self) -> ServedNumbers:
        """The reply's own numbers, from whichever server sent them."""
        if self.specdesk is not None:
            s = self.specdesk
            return ServedNumbers("per request", _int(s.get("draft_tokens")), _int(s.get("accepted_tokens")),
                                 _int(s.get("passes")) if "passes" in s else None,
                                 tuple(_int(v) for v in s.get("drafted_per_position") or ()),
                                 tuple(_int(v) for v in s.get("accepted_per_position") or ()),
                                 tuple(_int(v) for v in s.get("accepted_length_histogram") or ()), dict(s))
        if self.vllm is not None:
            v = self.vllm
            histogram = tuple(_int(n) for n in v.get("acceptance_histogram") or ())
            steps = _int(v.get("num_spec_steps"))
            # position i was accepted in every step that accepted more than i drafts
            accepted_at = tuple(sum(histogram[i + 1:]) for i in range(max(0, len(histogram) - 1)))
            drafted_at = drafted_per_position(v, steps, len(accepted_at))
            return ServedNumbers("per request", _int(v.get("num_draft_tokens")),
                                 _int(v.get("num_accepted_draft_tokens")), None, drafted_at, accepted_at,
                                 histogram, dict(v))
        if self.sglang is not None:
            g = self.sglang
            verify = _int(g.get("spec_verify_ct"))
            histogram = tuple(_int(n) for n in g.get("spec_correct_drafts_histogram") or ())
            return ServedNumbers("per request", _int(g.get("spec_num_proposed_drafts")),
                                 _int(g.get("spec_num_correct_drafts")), verify or None, (), (),
                                 histogram if histogram and sum(histogram) == verify else (), dict(g))
        if self.timings is not None and "draft_n" in self.timings:
            t = self.timings
            return ServedNumbers("per request", _int(t.get("draft_n")), _int(t.get("draft_n_accepted")),
                                 raw=dict(t))
        return ServedNumbers("none")


def drafted_per_position(v: dict, steps: int, width: int) -> tuple[int, ...]:
    """Drafts that reached each position, from vLLM's histogram by draft length (a step that
    drafted k tokens drafted positions 0..k-1); every step at full length when it is absent."""
    by_length = v.get("acceptance_histogram_by_draft_length")
    if not isinstance(by_length, dict):
        return (steps,) * width
    drafted = [0] * width
    for length, buckets in by_length.items():
        if str(length).isdigit() and isinstance(buckets, list):
            for i in range(min(int(length), width)):
                drafted[i] += sum(_int(n) for n in buckets)
    return tuple(drafted)
