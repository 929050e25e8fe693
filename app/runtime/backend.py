"""What answers a chat, written once for local engines and servers (docs/ARCHITECTURE.md, Layers).

A `ChatBackend` is either the local engine process (app/runtime/session.Session) or a server
(app/serving/served.ServedSession). Its `chat` streams one reply's StepEvents and returns a
`ChatOutcome` as the generator's value; its `compare` runs baseline and speculative on prompts.

`chat_turn` is the one place a turn's bookkeeping lives, for the terminal chat, the app and
`specdesk serve` alike: the backend cuts the conversation to the context and generates, the
reply's measurements are recorded, and the conversation gets the reply. A turn that is
stopped (Stop, Ctrl-C) or fails before any text came is rolled back: its user message
leaves the conversation, so the next turn never sends two user messages in a row. A stopped
or failed turn that did produce text keeps it as the reply.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Generator, Optional, Protocol, Sequence

from specdesk.engines.types import SamplingParams, SpecConfig, StepEvent

from .compare import CompareReport
from .generation import RunResult, drain


@dataclass(frozen=True)
class ChatSettings:
    """How to answer: the method (a server decides its own), sampling and the reply's length
    (None: up to the context's end). With `fit`, the oldest turns are left out when the
    conversation outgrows the context; without, a conversation too long for it is refused, as
    an HTTP API answers. `record` keeps the reply's measured acceptance and speed (the app's
    and the terminal's chats; not a server's requests)."""

    spec: SpecConfig
    sampling: SamplingParams
    max_tokens: Optional[int]
    fit: bool = True
    record: bool = True


@dataclass(frozen=True)
class ChatOutcome:
    """One reply: its RunResult, the prompt's size, and where its numbers came from."""

    result: RunResult
    prompt_tokens: int = 0  # 0 where a server does not say
    dropped_messages: int = 0  # oldest messages left out because the conversation outgrew the context
    numbers: str = "engine"  # "engine" for a local engine; a server's: "per request", "metric deltas", ...
    note: Optional[str] = None  # what could not be read, in one line (a server's)

    @property
    def text(self) -> str:
        return self.result.text


class ChatBackend(Protocol):
    """A local engine or a server, as a chat and a compare see it, and as the window and the
    chat history describe it."""

    local: bool  # the models this machine loads (the left panel's pickers, method and k apply); False: a server
    label: str  # what answers, in a line (a window's title)

    def chat(self, messages: list[dict], settings: ChatSettings, cancel: threading.Event
             ) -> Generator[StepEvent, None, ChatOutcome]:
        """The reply to `messages` (ending in the user's turn), step by step."""

    def record(self, settings: ChatSettings, outcome: ChatOutcome, tally) -> None:
        """Keep the reply's measured acceptance and speed where this backend keeps them."""

    def compare(self, prompts: Sequence[str], settings: ChatSettings, cancel: threading.Event,
                on_event: Optional[Callable[[str, int, StepEvent], None]] = None,
                chat: bool = True) -> CompareReport:
        """Baseline and speculative on the same prompts (a chat message each, or raw text with
        chat=False where the backend can); `on_event(label, prompt index, event)`."""

    def compare_json(self, report: CompareReport) -> dict:
        """The compare's JSON report, with what this backend adds (where the models sat, or
        each arm's server)."""

    def chart_k(self, settings: ChatSettings) -> int:
        """The draft tokens per step a live chart reads from this backend's StepEvents."""

    def token_bytes(self) -> Optional[Callable[[int], bytes]]:
        """Each token's bytes, for a per-token tint; None where events carry text only (a server)."""

    def stream_unit(self) -> str:
        """What a streamed reply's events count: "tokens", or what a server's stream lets us count."""

    def answered_by(self, spec: SpecConfig, last_choice: Optional[str] = None) -> str:
        """What answered a reply, in its footer: the method and k (auto: its `last_choice`), or
        the server's model."""

    def origin(self, spec: SpecConfig) -> dict:
        """What answered a reply, as the chat history keeps it (never an API key)."""

    def compare_refusal(self, spec: SpecConfig) -> Optional[str]:
        """Why a compare cannot run with `spec` here, in one line; None when it can."""

    def arm_titles(self, spec: SpecConfig) -> tuple[str, str]:
        """What a compare's baseline and speculative arms run on."""

    def new_chat(self) -> None:
        """What the backend learned from the previous chat is forgotten."""

    def close(self) -> None:
        """Let go of the engine process or the connections."""


def settle(messages: list[dict], text: str, finished: bool) -> bool:
    """A turn's end for `messages` (ending in the user's turn): a finished reply is appended,
    and so is the text of a stopped or failed one; one that stopped or failed before any text
    takes the user's turn with it. Returns whether the turn was kept."""
    if finished or text:
        messages.append({"role": "assistant", "content": text})
        return True
    if messages and messages[-1].get("role") == "user":
        messages.pop()
    return False


def chat_turn(backend: ChatBackend, messages: list[dict], settings: ChatSettings, cancel: threading.Event,
              on_event: Optional[Callable[[StepEvent], None]] = None) -> ChatOutcome:
    """One turn of a chat: `messages` (ending in the user's message) is updated in place: the
    oldest messages the context could not hold go and the reply is appended, or the turn is
    rolled back by the rule above. An error, Ctrl-C included, is raised after the rollback, and a
    stopped run's text so far is kept as the reply."""
    from specdesk.app.runtime.measurements import MethodTally

    tally = MethodTally(settings.spec.method)
    pieces: list[str] = []

    def observe(event: StepEvent) -> None:
        tally(event)
        if on_event is not None:
            on_event(event)  # shown first: a reply cut by Ctrl-C keeps what was shown
        pieces.append(event.text)

    stream = backend.chat(messages, settings, cancel)
    try:
        outcome: ChatOutcome = drain(stream, observe)
    except BaseException:
        cancel.set()  # the run ends at its next step (Ctrl-C arrives here in a terminal)
        stream.close()
        settle(messages, "".join(pieces), finished=False)
        raise
    backend.record(settings, outcome, tally)
    if settle(messages, outcome.text, outcome.result.finish_reason != "cancelled"):
        del messages[:outcome.dropped_messages]
    return outcome

