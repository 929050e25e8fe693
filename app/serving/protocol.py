"""What `specdesk serve` answers, in OpenAI's shapes (the requests are read in request_checks.py).

Two fields beyond OpenAI's:
- request  "speculative": {"method": "none" | "ngram" | "draft" | ..., "k": 1..16} runs this
  request with another speculation method or k than the server's (method "none" is a
  baseline run, to compare against);
- response "specdesk": what speculation did for this request (`speculation_summary`): drafts
  (verification steps that checked draft tokens), draft_tokens, accepted_tokens, acceptance_rate,
  drafted_per_position / accepted_per_position / acceptance_per_position,
  accepted_length_histogram (index n: passes that accepted n drafts), passes, tokens,
  seconds, tok_per_s, draft_s, verify_s, method, k. Streamed, it is in the last chunk.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Optional

from specdesk.engines.types import RunStats, SpecConfig

from ..runtime.generation import RunResult


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


@dataclass(frozen=True)
class Outcome:
    """How one generation ended, after its text pieces."""

    text: str  # the tail held back by the stop matcher
    result: RunResult
    prompt_tokens: int
    finish_reason: str  # OpenAI's: "stop" or "length"
    summary: dict

    def usage(self) -> dict:
        n = self.result.stats.tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": n, "total_tokens": self.prompt_tokens + n}


@dataclass(frozen=True)
class Reply:
    """The shapes of one response: a chat or a completion, whole or streamed as server-sent events."""

    chat: bool
    stream: bool
    model: str
    include_usage: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    ident: str = ""

    def __post_init__(self) -> None:
        if not self.ident:
            object.__setattr__(self, "ident", ("chatcmpl-" if self.chat else "cmpl-") + secrets.token_hex(12))

    @property
    def object(self) -> str:
        if not self.chat:
            return "text_completion"
        return "chat.completion.chunk" if self.stream else "chat.completion"

    def choice(self, text: Optional[str], finish: Optional[str], first: bool = False) -> dict:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        if self.stream:
            delta = {} if text is None else {"content": text}
            if first:
                delta["role"] = "assistant"
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                "finish_reason": finish}

    def whole(self, text: str, outcome: Outcome) -> dict:
        """The body of a response that is not streamed."""
        return {"id": self.ident, "object": self.object, "created": int(time.time()), "model": self.model,
                "choices": [self.choice(text, outcome.finish_reason)], "usage": outcome.usage(),
                "specdesk": outcome.summary}

    def chunk(self, choices: list, **extra) -> str:
        """One server-sent event of a streamed response."""
        payload = {"id": self.ident, "object": self.object, "created": self.created, "model": self.model,
                   "choices": choices}
        if self.include_usage:
            payload["usage"] = None
        payload.update(extra)
        return f"data: {json.dumps(payload)}\n\n"

    def last_chunks(self, outcome: Outcome, first: bool) -> list[str]:
        """The events that end a stream: the held-back tail, the finish reason, the summary
        (and the usage, when asked for)."""
        chunks = []
        if outcome.text:
            chunks.append(self.chunk([self.choice(outcome.text, None, first)]))
            first = False
        if first and self.chat:
            chunks.append(self.chunk([self.choice("", None, True)]))
        final = {} if self.include_usage else {"specdesk": outcome.summary}
        chunks.append(self.chunk([self.choice(None if self.chat else "", outcome.finish_reason)], **final))
        if self.include_usage:
            chunks.append(self.chunk([], usage=outcome.usage(), specdesk=outcome.summary))
        return chunks
