"""What each kind of server says, and where: one Dialect per server SpecDesk reads.

  server          per request                                        around the request (/metrics)
  specdesk serve  "specdesk" field (every number, per position)      specdesk:spec_decode_*
  llama-server    timings.draft_n / draft_n_accepted                 llamacpp:spec_decode_* (with --metrics)
  vLLM            metrics.speculative_decoding (with                 vllm:spec_decode_*
                  --per-request-spec-decode-metrics summary)
  SGLang          sglext.spec_tokens_details                         sglang:spec_accept_* gauges: lifetime
                  (request field return_spec_tokens_details)         averages only
  other           none: tok/s only

A dialect knows how the server is recognised (its /v1/models owner, its metric prefix), what
to add to a chat request so the server sends its numbers (and a running token count on every
streamed chunk where it can), where those numbers sit in a reply, and how to read them as
ServedNumbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional


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


def as_int(value) -> int:
    """A server's number as an int; anything else (a string, a bool, NaN) is 0."""
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        else 0


class Dialect:
    """A server SpecDesk can read no speculation numbers from: tok/s only."""

    kind = "generic"
    label = "an OpenAI-compatible server"
    owner: Optional[str] = None  # owned_by in its /v1/models answer
    metric_prefix: Optional[str] = None  # its /metrics names start with this and ":"
    generated_counter: Optional[str] = None  # its counter of generated tokens, after the prefix
    per_request = False  # each reply carries its own drafted / accepted numbers
    switches_speculation = False  # one request can ask for a baseline run
    takes_top_k = False  # top_k is a request field it reads
    running_counts = False  # every streamed chunk says how many tokens the reply has so far

    def per_position(self, has_counters: bool) -> bool:
        """Whether acceptance per draft position can be read (per request or from counter deltas)."""
        return False

    def numbers_text(self, has_counters: bool) -> str:
        return "this server reports no speculation numbers: tok/s only"

    def add_request_fields(self, body: dict) -> None:
        """What a chat request adds so this server sends its numbers."""

    def payload(self, chunk: dict) -> Optional[dict]:
        """This server's per-request numbers in one reply chunk, or None."""
        return None

    def numbers(self, payload: dict) -> ServedNumbers:
        return ServedNumbers("none")


class SpecDeskServe(Dialect):
    kind, label, owner, metric_prefix = "specdesk", "specdesk serve", "specdesk", "specdesk"
    generated_counter = "generation_tokens_total"
    per_request = switches_speculation = takes_top_k = True

    def per_position(self, has_counters: bool) -> bool:
        return True

    def numbers_text(self, has_counters: bool) -> str:
        return "this server reports acceptance and per-position acceptance per request"

    def payload(self, chunk: dict) -> Optional[dict]:
        return chunk["specdesk"] if isinstance(chunk.get("specdesk"), dict) else None

    def numbers(self, s: dict) -> ServedNumbers:
        return ServedNumbers("per request", as_int(s.get("draft_tokens")), as_int(s.get("accepted_tokens")),
                             as_int(s.get("passes")) if "passes" in s else None,
                             tuple(as_int(v) for v in s.get("drafted_per_position") or ()),
                             tuple(as_int(v) for v in s.get("accepted_per_position") or ()),
                             tuple(as_int(v) for v in s.get("accepted_length_histogram") or ()), dict(s))


class LlamaServer(Dialect):
    kind, label, owner, metric_prefix = "llama-server", "llama-server", "llamacpp", "llamacpp"
    generated_counter = "tokens_predicted_total"
    per_request = takes_top_k = running_counts = True

    def per_position(self, has_counters: bool) -> bool:
        return has_counters

    def numbers_text(self, has_counters: bool) -> str:
        return "this server reports acceptance per request" + (
            "; per-position from its /metrics counters" if has_counters else "; per-position needs --metrics")

    def add_request_fields(self, body: dict) -> None:
        body["timings_per_token"] = True  # running predicted_n, draft_n and draft_n_accepted on every chunk

    def payload(self, chunk: dict) -> Optional[dict]:
        timings = chunk.get("timings")
        return timings if isinstance(timings, dict) and "draft_n" in timings else None

    def numbers(self, t: dict) -> ServedNumbers:
        return ServedNumbers("per request", as_int(t.get("draft_n")), as_int(t.get("draft_n_accepted")), raw=dict(t))


class Vllm(Dialect):
    kind, label, owner, metric_prefix = "vllm", "vLLM", "vllm", "vllm"
    generated_counter = "generation_tokens_total"
    per_request = takes_top_k = running_counts = True

    def per_position(self, has_counters: bool) -> bool:
        return True

    def numbers_text(self, has_counters: bool) -> str:
        return ("this server reports acceptance per request when started with "
                "--per-request-spec-decode-metrics, else from its counters around each reply")

    def add_request_fields(self, body: dict) -> None:
        body["stream_options"]["continuous_usage_stats"] = True  # running token count on every chunk

    def payload(self, chunk: dict) -> Optional[dict]:
        metrics = chunk.get("metrics")
        if isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict):
            return metrics["speculative_decoding"]
        return None

    def numbers(self, v: dict) -> ServedNumbers:
        histogram = tuple(as_int(n) for n in v.get("acceptance_histogram") or ())
        steps = as_int(v.get("num_spec_steps"))
        # position i was accepted in every step that accepted more than i drafts
        accepted_at = tuple(sum(histogram[i + 1:]) for i in range(max(0, len(histogram) - 1)))
        drafted_at = drafted_per_position(v, steps, len(accepted_at))
        return ServedNumbers("per request", as_int(v.get("num_draft_tokens")),
                             as_int(v.get("num_accepted_draft_tokens")), None, drafted_at, accepted_at,
                             histogram, dict(v))


class SgLang(Dialect):
    kind, label, owner, metric_prefix = "sglang", "SGLang", "sglang", "sglang"
    per_request = takes_top_k = True

    def numbers_text(self, has_counters: bool) -> str:
        return ("this server reports acceptance per request with return_spec_tokens_details; "
                "its /metrics has only lifetime averages")

    def add_request_fields(self, body: dict) -> None:
        body["return_spec_tokens_details"] = True

    def payload(self, chunk: dict) -> Optional[dict]:
        sglext = chunk.get("sglext")
        if isinstance(sglext, dict) and isinstance(sglext.get("spec_tokens_details"), dict):
            return sglext["spec_tokens_details"]
        return None

    def numbers(self, g: dict) -> ServedNumbers:
        verify = as_int(g.get("spec_verify_ct"))
        histogram = tuple(as_int(n) for n in g.get("spec_correct_drafts_histogram") or ())
        return ServedNumbers("per request", as_int(g.get("spec_num_proposed_drafts")),
                             as_int(g.get("spec_num_correct_drafts")), verify or None, (), (),
                             histogram if histogram and sum(histogram) == verify else (), dict(g))


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
                drafted[i] += sum(as_int(n) for n in buckets)
    return tuple(drafted)


# In the order a server is recognised in (and its reply's numbers looked for), the generic one last.
DIALECTS: dict[str, Dialect] = {d.kind: d for d in (SpecDeskServe(), LlamaServer(), Vllm(), SgLang(), Dialect())}
KINDS = tuple(DIALECTS)


def dialect(kind: str) -> Dialect:
    return DIALECTS[kind]


def recognise(owners: set[str], metric_names: set[str]) -> Dialect:
    """The server whose /v1/models owner or /metrics prefix this is; the generic one otherwise."""
    for candidate in DIALECTS.values():
        if candidate.owner is None:
            continue
        prefix = candidate.metric_prefix + ":"
        if candidate.owner in owners or any(n.startswith(prefix) for n in metric_names):
            return candidate
    return DIALECTS["generic"]
