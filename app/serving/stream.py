"""A streamed chat completion, read chunk by chunk: its text, how many tokens each chunk
carried, and the server's own numbers.

Servers stream text, not token ids: each chunk with text becomes one StepEvent whose tokens
are UNKNOWN_TOKEN placeholders, as many as the chunk carried, so the live tok/s chart is the
stream's. How many that is comes from, in this order:

  1. the server's running count on the chunk: llama-server's timings.predicted_n
     (timings_per_token), or usage.completion_tokens on every chunk (vLLM's
     stream_options.continuous_usage_stats);
  2. the target's tokenizer, when the caller knows it (`count_tokens`);
  3. else the chunk's characters, and `unit` says so: a chunk is not a token (specdesk serve
     sends one chunk per verified pass, often several tokens).

The reply's final count is the server's (usage on the last chunk, asked for with
stream_options.include_usage), so the RunStats and the footer are in tokens whichever way
the chunks were counted.
"""

from __future__ import annotations

import json
from typing import Callable, Optional

from specdesk.engines.types import RunStats

from .dialects import DIALECTS, ServedNumbers, as_int
from .transport import EndpointError

UNKNOWN_TOKEN = -1  # a streamed token whose id the server did not send
UNIT_TOKENS = "tokens"
UNIT_TOKENIZER = "tokens (counted with the target's tokenizer)"
UNIT_CHARACTERS = "characters (the server sends no token counts while streaming)"
# Delta fields that carry what the model generated: a chunk with any of them moves the reply on
# (a reasoning model's thinking and a tool call are output too, though not shown as text)
GENERATED_FIELDS = ("content", "reasoning_content", "reasoning", "tool_calls")


class StreamReader:
    """Folds server-sent chat completion chunks: text, counts and each server's numbers."""

    def __init__(self, url: str, count_tokens: Optional[Callable[[str], int]] = None):
        self.url = url
        self.count_tokens = count_tokens
        self.pieces: list[str] = []
        self.done = False
        self.finish_reason: Optional[str] = None
        self.error: Optional[str] = None
        self.chunks = 0  # chunks that carried text
        self.moved = 0  # chunks that carried anything generated (GENERATED_FIELDS)
        self.usage_tokens: Optional[int] = None
        self.timings: Optional[dict] = None
        self.payloads: dict[str, dict] = {}  # each server's per-request numbers, by dialect kind
        self.units: set[str] = set()  # how the chunks so far were counted
        self._counted = 0  # what the events handed out so far count, in their unit
        self._tokens = 0  # tokens so far: the server's count or the tokenizer's, at least one per chunk
        self._drafted = self._accepted = 0  # running llama-server counts already handed out

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def unit(self) -> str:
        """What the events' counts are: tokens, unless a chunk had to be counted otherwise."""
        for unit in (UNIT_CHARACTERS, UNIT_TOKENIZER):
            if unit in self.units:
                return unit
        return UNIT_TOKENS

    def feed(self, line: str) -> Optional[tuple[str, int, int, int]]:
        """One SSE line; (text, count, drafted, accepted) when it carried text, else None. The
        count is in `unit` (tokens where the server or the tokenizer says how many)."""
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
        running_usage = None
        if isinstance(usage, dict) and "completion_tokens" in usage:
            self.usage_tokens = running_usage = as_int(usage["completion_tokens"])
        if isinstance(chunk.get("timings"), dict):
            self.timings = chunk["timings"]
        for kind, dialect in DIALECTS.items():
            payload = dialect.payload(chunk)
            if payload is not None:
                self.payloads[kind] = payload
        text, moved = "", False
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if isinstance(choice, dict):
                delta = choice.get("delta") or {}
                if isinstance(delta, dict):
                    content = delta.get("content")
                    text += content if isinstance(content, str) else ""
                    moved = moved or any(delta.get(name) for name in GENERATED_FIELDS)
                if choice.get("finish_reason") and isinstance(choice["finish_reason"], str):
                    self.finish_reason = {"stop": "eos"}.get(choice["finish_reason"], choice["finish_reason"])
        self.moved += moved
        if not text:
            return None
        self.pieces.append(text)
        self.chunks += 1
        count = self._count(text, running_usage)
        drafted = accepted = 0
        if self.timings is not None and "draft_n" in self.timings:
            drafted = max(0, as_int(self.timings.get("draft_n")) - self._drafted)
            accepted = max(0, as_int(self.timings.get("draft_n_accepted")) - self._accepted)
            self._drafted += drafted
            self._accepted += accepted
        return text, count, drafted, accepted

    def _count(self, text: str, running_usage: Optional[int]) -> int:
        """This chunk's count (see the module's order), and the running token total."""
        running = as_int(self.timings["predicted_n"]) if self.timings is not None and "predicted_n" in self.timings \
            else running_usage
        if running is not None:
            tokens, unit = max(1, running - self._tokens), UNIT_TOKENS
            count = tokens
        elif self.count_tokens is not None:
            tokens, unit = max(1, self.count_tokens(text)), UNIT_TOKENIZER
            count = tokens
        else:
            tokens, unit = 1, UNIT_CHARACTERS  # at least one token: a server sends no empty chunk
            count = len(text)
        self.units.add(unit)
        self._tokens += tokens
        self._counted += count
        return count

    def cut(self, tokens: int) -> None:
        """Forget the last chunk with text: the reply ends with the `tokens` tokens before it."""
        self.pieces.pop()
        self.chunks -= 1
        self._tokens = self.usage_tokens = tokens

    @property
    def tokens_seen(self) -> int:
        """Tokens the reply has carried so far (at least one per chunk with text)."""
        return self._tokens

    def completion_tokens(self) -> int:
        if self.usage_tokens is not None:
            return self.usage_tokens
        if self.timings is not None and "predicted_n" in self.timings:
            return as_int(self.timings["predicted_n"])
        if "specdesk" in self.payloads:
            return as_int(self.payloads["specdesk"].get("tokens"))
        return self._tokens

    def per_request_numbers(self) -> ServedNumbers:
        """The reply's own numbers, from whichever server sent them."""
        for kind, payload in self.payloads.items():
            return DIALECTS[kind].numbers(payload)
        return ServedNumbers("none")


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
