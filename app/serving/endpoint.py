"""Served engines: chat against OpenAI-compatible servers and read their speculation numbers.

A user whose target no longer fits one machine runs vLLM or SGLang (tensor / pipeline
parallel, EAGLE-3, MTP, DFlash, n-gram) or llama-server with a draft model; SpecDesk stays
the window onto it. `Endpoint` lists the server's models, tells which kind of server it is
and which speculation numbers it reports, and streams chat completions as StepEvents, like
an engine. Tok/s is measured from the stream; drafted and accepted tokens, tokens per pass
and per-position acceptance come from the server's own numbers. The parts live beside it:

  transport.py   HTTP to the server, with its bounds (timeouts, byte limits, redirects)
  prometheus.py  /metrics text and counter deltas
  dialects.py    each kind of server: how it is recognised, what a request asks of it,
                 where its numbers sit in a reply
  stream.py      a streamed reply: text, tokens per chunk, the server's numbers

Per-position acceptance from counters follows vLLM's documented reading: position i's
accepted-token delta over the delta of verification steps (num_drafts). Deltas are kept only
when the server's generated-token counter moved by exactly this reply's tokens; otherwise
other requests ran at the same time and the numbers would not be this reply's.

The final RunStats use the server's count of tokens. Every failure (unreachable, 401, a
dropped stream, a model that vanished, metrics that are not Prometheus text) is an
EndpointError of one line that keeps the text received so far in `partial`. The server's
text is stripped of control characters (`printable`) before a terminal shows it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import httpx2

from specdesk.engines.types import SamplingParams, StepEvent

from ..runtime.generation import RunResult, drain
from ..terminal import printable
from .dialects import DIALECTS, KINDS, ServedNumbers, dialect, drafted_per_position, recognise
from .prometheus import MetricSamples, delta, parse_metrics
from .stream import (UNIT_CHARACTERS, UNIT_TOKENIZER, UNIT_TOKENS, UNKNOWN_TOKEN, StreamReader, decode_seconds,
                     served_stats)
from .transport import (MAX_LINE_BYTES, MAX_METRICS_BYTES, MAX_REPLY_BYTES, EndpointError, HttpTransport, Watchdog,
                        base_url, bounded, iter_lines, json_reply_lines, watched)

__all__ = ["DIALECTS", "KINDS", "MAX_LINE_BYTES", "MAX_REPLY_BYTES", "UNKNOWN_TOKEN", "Endpoint", "EndpointError",
           "MetricSamples", "ServedNumbers", "ServedRun", "ServerInfo", "StreamReader", "base_url",
           "decode_seconds", "delta", "drafted_per_position", "iter_lines", "parse_metrics", "printable",
           "served_stats"]

METRICS_SETTLE_S = 2.0  # how long to wait for a server to count a finished reply in /metrics


@dataclass(frozen=True)
class ServerInfo:
    url: str
    kind: str  # one of KINDS
    models: tuple[str, ...]
    metrics: bool  # /metrics answers with this kind's speculation counters
    per_position: bool  # acceptance per draft position can be read (per request or from counter deltas)

    @property
    def dialect(self):
        return dialect(self.kind)

    @property
    def per_request(self) -> bool:
        """Whether each reply carries its own drafted / accepted numbers."""
        return self.dialect.per_request

    @property
    def switches_speculation(self) -> bool:
        """Whether one request can ask for a baseline run (specdesk serve's "speculative" field)."""
        return self.dialect.switches_speculation

    def describe(self) -> str:
        """Which charts this server can fill, in one line."""
        return f"{self.dialect.label}, {len(self.models)} model(s): {self.dialect.numbers_text(self.metrics)}"


@dataclass(frozen=True)
class ServedRun:
    """One reply from a server: a RunResult like an engine's (tokens unknown: ()), the
    server's numbers, a note when some of them could not be read, and what its streamed
    events counted (app/serving/stream.py; its RunStats are in tokens either way)."""

    result: RunResult
    numbers: ServedNumbers
    note: Optional[str] = None
    unit: str = UNIT_TOKENS


class Endpoint(HttpTransport):
    """An OpenAI-compatible server, spoken to over HTTP. `count_tokens` (the target's
    tokenizer, where the caller knows it) counts the tokens of streamed chunks from servers
    that send no running count (app/serving/stream.py)."""

    def __init__(self, url: str, api_key: Optional[str] = None, model: Optional[str] = None,
                 timeout: float = 120.0, count_tokens: Optional[Callable[[str], int]] = None):
        super().__init__(url, api_key, timeout)
        self.model = model
        self.count_tokens = count_tokens
        self._info: Optional[ServerInfo] = None

    @property
    def name(self) -> str:
        return "endpoint"

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
        server = recognise(owners, names)
        has_counters = bool(server.metric_prefix) and f"{server.metric_prefix}:spec_decode_num_drafts_total" in names
        self._info = ServerInfo(self.url, server.kind, tuple(m["id"] for m in models), has_counters,
                                server.per_position(has_counters))
        if self.model is None and self._info.models:
            self.model = self._info.models[0]
        elif self.model is not None and self.model not in self._info.models:
            raise EndpointError(f"{self.url} does not serve model {self.model!r}: it serves "
                                + ", ".join(repr(m) for m in self._info.models[:8]))
        return self._info

    @property
    def info(self) -> ServerInfo:
        return self._info if self._info is not None else self.probe()

    def stream_unit(self) -> str:
        """What a streamed reply's events will count: tokens where the server sends a running
        count or the target's tokenizer is known, else characters (app/serving/stream.py)."""
        if self.info.dialect.running_counts:
            return UNIT_TOKENS
        return UNIT_TOKENIZER if self.count_tokens is not None else UNIT_CHARACTERS

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
        if sampling.top_k and info.dialect.takes_top_k:
            body["top_k"] = sampling.top_k
        info.dialect.add_request_fields(body)
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
        reader = StreamReader(self.url, self.count_tokens)
        times, over = yield from self._read_reply(body, reader, max_tokens, cancel)
        if over:
            reader.finish_reason = "length"
        finish = "cancelled" if cancel.is_set() else reader.finish_reason
        tokens = reader.completion_tokens()
        seconds = decode_seconds(sent, times[0], times[1], tokens)
        note = f"{self.url} sent more than the {max_tokens} tokens asked for: the reply was cut there" if over \
            else None
        numbers = reader.per_request_numbers()
        if info.metrics and finish != "cancelled" and not over and not numbers.per_position_accepted:
            try:
                numbers, note = self._with_metric_deltas(numbers, before, tokens)
            except EndpointError as e:
                note = str(e)
        result = RunResult((), reader.text, served_stats(tokens, seconds, numbers), finish)
        return ServedRun(result, numbers, note, reader.unit)

    def _read_reply(self, body: dict, reader: StreamReader, max_tokens: int, cancel: threading.Event):
        """POST `body` and fold its reply into `reader`, yielding a StepEvent per chunk with text;
        returns ((first, last) chunk times, whether the server sent more than max_tokens). When a
        bound of the watchdog ended the reply, its reason is the error, whatever the cut left."""
        watchdog = Watchdog(self.timeout, self.idle_timeout, self.timeout + max_tokens * self.seconds_per_token)
        try:
            with self._open("/v1/chat/completions", body) as response:
                # a server that does not stream answers with one JSON reply
                whole = response.headers.get("content-type", "").split(";")[0].strip() == "application/json"
                watchdog.whole = whole
                watchdog.watch(response)
                try:
                    result = yield from self._fold(response, whole, reader, watchdog, max_tokens, cancel)
                except (httpx2.HTTPError, EndpointError) as e:
                    if watchdog.reason is not None:
                        raise EndpointError(f"{self.url} {watchdog.reason}, after {len(reader.text)} characters",
                                            reader.text) from None
                    if isinstance(e, EndpointError):
                        raise
                    reason = "timed out" if isinstance(e, httpx2.TimeoutException) else "dropped the connection"
                    raise EndpointError(f"{self.url} {reason} mid-reply after {len(reader.text)} characters",
                                        reader.text) from None
                over = result[1]
                if watchdog.reason is not None and not reader.done:
                    raise EndpointError(f"{self.url} {watchdog.reason}, after {len(reader.text)} characters",
                                        reader.text)
                if reader.error is not None:
                    raise EndpointError(f"{self.url} ended the reply with an error: {reader.error}", reader.text)
                if not cancel.is_set() and not reader.done and not over:
                    raise EndpointError(f"{self.url} closed the stream mid-reply after {len(reader.text)} "
                                        "characters", reader.text)
                return result
        finally:
            watchdog.stop()

    def _fold(self, response, whole: bool, reader: StreamReader, watchdog: Watchdog, max_tokens: int,
              cancel: threading.Event):
        """The reply's lines into `reader`; a StepEvent per chunk with text (see _read_reply)."""
        first_at = last_at = None
        chunks = watched(response.iter_raw(), watchdog)
        lines = json_reply_lines(bounded(chunks, MAX_REPLY_BYTES, self.url, reader), self.url) if whole \
            else iter_lines(chunks, cancel, self.url, reader)
        for line in lines:
            watchdog.line()
            kept, moved = reader.tokens_seen, reader.moved
            chunk = reader.feed(line)
            if reader.moved != moved:
                watchdog.moved()
            if chunk is None:
                continue
            if reader.tokens_seen > max_tokens:  # more than was asked for: not shown, not kept
                reader.cut(kept)
                return (first_at, last_at), True
            text, count, drafted, accepted = chunk
            now = time.perf_counter()
            if first_at is None:
                first_at = now
            last_at = now
            yield StepEvent(tokens=(UNKNOWN_TOKEN,) * count, text=text, drafted=drafted, accepted=accepted,
                            position_accepted=(), from_draft=(False,) * count, draft_s=0.0, verify_s=0.0)
        return (first_at, last_at), False

    def chat(self, messages: list[dict], sampling: SamplingParams = SamplingParams(), max_tokens: int = 128,
             cancel: Optional[threading.Event] = None, on_event: Optional[Callable[[StepEvent], None]] = None,
             speculative: Optional[dict] = None) -> ServedRun:
        return drain(self.stream_chat(messages, sampling, max_tokens, cancel, speculative), on_event)

    # --- counters around a reply --------------------------------------------------------
    def _scrape_quietly(self) -> Optional[MetricSamples]:
        try:
            return self.scrape()
        except EndpointError:
            return None  # said after the reply, when the deltas are wanted

    def _with_metric_deltas(self, numbers: ServedNumbers, before: Optional[MetricSamples],
                            tokens: int) -> tuple[ServedNumbers, Optional[str]]:
        info = self.info
        prefix = info.dialect.metric_prefix
        if before is None:
            self.scrape()  # raises the one-line reason when /metrics is broken
            return numbers, f"{self.url}/metrics could not be read before the reply: no per-position numbers"
        counter = info.dialect.generated_counter
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
