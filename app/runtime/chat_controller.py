"""The chat controller: one conversation's turns, without Qt (docs/ARCHITECTURE.md, "The chat controller").

`ChatController` owns the chat that is open (its id in app/storage/history.py), the transcript
of its active path (`messages`), the user's message being edited and the turn in progress. It
sends, edits, regenerates and switches between a message's versions, and settles each turn as
app/runtime/backend.chat_turn settled it: a reply is saved to the history (a finished one, or
the text of a stopped or failed one), and a turn without text is rolled back (its user message
leaves the transcript and the history, an edited message shows its original again, and the
text goes back to the input).

It neither runs nor draws anything itself:
- a `TurnRunner` runs each turn's chat_turn: the window's engine worker on its thread
  (ui/worker.py, whose signals the window hands on here), or `ThisThread` for the terminal chat
  (app/main.py) and the tests, which reports as it goes;
- a `ChatDisplay` draws the transcript (ui/chat_view.ChatView); the terminal has none.

It sits in runtime/, above chat_turn, rather than in chat/ (templates and prompts, which the
engine side imports): no folder imports one that imports it back.

What answers is the request's backend (app/runtime/backend.ChatBackend: the local models or a
server), which also says what the history keeps about it.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Optional, Protocol, Sequence

from specdesk.app.chat.prompting import with_system_prompt
from specdesk.app.runtime.backend import ChatBackend, ChatOutcome, ChatSettings, chat_turn
from specdesk.app.storage.history import History, chat_title
from specdesk.engines.types import RunStats, SamplingParams, SpecConfig, StepEvent

FINISH_WORDS = {"cancelled": "stopped", "length": "max tokens", "context": "context full", "eos": "done"}


@dataclass
class ChatMessage:
    """A message as the transcript shows it: its text per token and which tokens came from an
    accepted draft, its history id, and the numbers under a reply."""

    role: str  # "user" or "assistant"
    pieces: list[str] = field(default_factory=list)  # text per token (a user message is one piece)
    from_draft: list[bool] = field(default_factory=list)  # (len(pieces),)
    db_id: Optional[int] = None
    footer: str = ""  # numbers of the run, under a reply
    alternative: int = 0  # its place among its alternatives in the history, from 0
    alternatives: int = 1  # how many alternatives it has, itself included

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def draft_spans(self) -> list[list]:
        """Run-length [n_chars, from_draft] pairs: how highlighting is stored in history."""
        spans: list[list] = []
        for piece, drafted in zip(self.pieces, self.from_draft):
            if not piece:
                continue
            if spans and spans[-1][1] == drafted:
                spans[-1][0] += len(piece)
            else:
                spans.append([len(piece), drafted])
        return spans

    @classmethod
    def from_spans(cls, role: str, text: str, spans, db_id: Optional[int] = None, footer: str = "",
                   alternative: int = 0, alternatives: int = 1) -> "ChatMessage":
        pieces, flags, at = [], [], 0
        for span in spans or []:
            try:
                length, drafted = int(span[0]), bool(span[1])
            except (TypeError, ValueError, IndexError):
                break
            pieces.append(text[at:at + length])
            flags.append(drafted)
            at += length
        if at < len(text):  # spans missing or shorter than the text: the rest is plain
            pieces.append(text[at:])
            flags.append(False)
        return cls(role, pieces, flags, db_id, footer, alternative, alternatives)


class TurnRequest(NamedTuple):
    """What a reply is asked of: the method (a server chooses its own), sampling, length, and
    the backend that answers."""

    spec: SpecConfig
    sampling: SamplingParams
    max_tokens: int
    backend: ChatBackend


@dataclass
class Turn:
    """One reply being generated, and what settling it needs."""

    request: TurnRequest
    chat_id: int
    messages: list[dict]  # the conversation, ending in the user's message: chat_turn updates it in place
    reply: ChatMessage  # the reply being generated, in the transcript
    user_id: Optional[int] = None  # the user's message this turn added (it goes when the turn is rolled back)
    user_text: str = ""  # its text (back to the input when the turn is rolled back)
    replaces: Optional[int] = None  # regenerate: the reply this one is another version of
    restore: Optional[int] = None  # edit: the original message, shown again when the turn is rolled back
    job_id: int = 0  # the runner's id for it: its reports carry it
    last_reason: Optional[str] = None  # method auto: the latest step's choice and why
    outcome: Optional[ChatOutcome] = None  # once it finished

    def __post_init__(self) -> None:
        self._asked = self.messages[-1]  # the message answered: settle appends the reply after it, or takes it away

    @property
    def kept(self) -> bool:
        """The turn kept a reply (else chat_turn rolled it back: app/runtime/backend.settle). Not
        merely "the conversation ends in a reply": a turn rolled back after earlier ones does too."""
        return len(self.messages) >= 2 and self.messages[-2] is self._asked and self.messages[-1]["role"] == "assistant"


class TurnRunner(Protocol):
    """What runs a turn's chat_turn: it sets `turn.job_id` before anything is reported, and the
    turn's events, outcome or error reach `controller.add_pieces / finish / fail` (directly,
    or through whoever gets the runner's signals)."""

    def run_turn(self, turn: Turn, controller: "ChatController") -> None: ...

    def stop(self, job_id: int) -> None: ...

    def new_chat(self) -> None:
        """What the backend learned from the previous chat is forgotten."""


class ChatDisplay(Protocol):
    """What draws the transcript (ui/chat_view.ChatView)."""

    def set_messages(self, messages: list[ChatMessage]) -> None: ...

    def add_message(self, message: ChatMessage) -> ChatMessage: ...

    def reply_grew(self, message: ChatMessage) -> None: ...

    def end_reply(self, message: ChatMessage, footer: str) -> None: ...

    def offer_input(self, text: str) -> bool:
        """A rolled-back turn's text back in an empty input; whether it went there."""


class ThisThread:
    """Runs each turn on the calling thread, reporting to the controller as it goes (the
    terminal chat, tests). `show` sees each step's text first; an error, Ctrl-C included, is
    raised after the turn was settled, and `stop` (from another thread) ends the turn at its
    next step."""

    def __init__(self, backend: ChatBackend, show: Optional[Callable[[str], None]] = None):
        self.backend = backend
        self.show = show
        self._ids = itertools.count(1)
        self._cancel: dict[int, threading.Event] = {}
        self._forget = False  # a new chat began during a turn: the backend forgets before the next

    def run_turn(self, turn: Turn, controller: "ChatController") -> None:
        turn.job_id = job_id = next(self._ids)
        if self._forget:
            self._forget = False
            self.backend.new_chat()
        cancel = self._cancel[job_id] = threading.Event()

        def observe(event: StepEvent) -> None:
            if self.show is not None:
                self.show(event.text)  # shown first: a reply cut by Ctrl-C keeps what was shown
            controller.add_pieces(job_id, [event.text], [False], event.reason)

        try:
            spec, sampling, max_tokens, backend = turn.request
            outcome = chat_turn(backend, turn.messages, ChatSettings(spec, sampling, max_tokens), cancel, observe)
        except BaseException as e:  # settled first: what came before the error stays as the reply
            controller.fail(job_id, "stopped" if isinstance(e, KeyboardInterrupt) else str(e) or type(e).__name__)
            raise
        finally:
            self._cancel.pop(job_id, None)
        controller.finish(job_id, outcome)

    def stop(self, job_id: int) -> None:
        cancel = self._cancel.get(job_id)
        if cancel is not None:
            cancel.set()

    def new_chat(self) -> None:
        """Now, or after the turn in progress (a new chat from its own callback), as the
        window's worker runs it after the job before it."""
        if self._cancel:
            self._forget = True
        else:
            self.backend.new_chat()


def format_status(stats: RunStats, k: int) -> str:
    """A run's numbers in a line: tokens, speed, and what speculation did where it drafted."""
    parts = [f"{stats.tokens} tokens", f"{stats.tok_per_s:.1f} tok/s"]
    if k > 0:
        parts += [f"acceptance {stats.acceptance_rate:.2f}", f"{stats.mean_accepted_length:.2f} tok/pass"]
    else:
        parts += ["no speculation"]
    busy = stats.draft_s + stats.verify_s
    if busy > 0:
        share = stats.draft_s / busy
        parts.append(f"draft/verify {share:.0%}/{1 - share:.0%}")
    return " · ".join(parts)


def reply_record(turn: Turn, outcome: ChatOutcome) -> tuple[str, dict]:
    """A finished reply's footer (why it ended, what answered it, its numbers) and what the
    history keeps of its run."""
    run, spec, backend = outcome.result, turn.request.spec, turn.request.backend
    stats = run.stats
    served = outcome.numbers != "engine"  # where a server's numbers came from
    answered = auto_footer(run.auto_report) if run.auto_report else backend.answered_by(spec, turn.last_reason)
    parts = [FINISH_WORDS.get(run.finish_reason, run.finish_reason or "done"),
             answered, format_status(stats, drafted_per_step(turn, stats))]
    parts += ([f"numbers: {outcome.numbers}"] if served else []) + ([outcome.note] if outcome.note else [])
    return " · ".join(parts), {"finish_reason": run.finish_reason, "tokens": stats.tokens, "tok_per_s": round(stats.tok_per_s, 3),
                    "acceptance": round(stats.acceptance_rate, 4), "tok_per_pass": round(stats.mean_accepted_length, 4),
                    **({"numbers_from": outcome.numbers} if served else {})}


def auto_footer(report: dict) -> str:
    """What method auto did over a whole reply, for its footer (not the last step's passing
    choice): "auto: speculation off (checking 2 tokens costs 2.1x one here, so no draft can
    pay)", or its choices by share of steps, "auto: ngram-pool k=2 62%, none 38% of steps"."""
    if report.get("verdict"):
        return f"auto: speculation off ({report['verdict']})"
    shares = list((report.get("steps_by_choice") or {}).items())
    if not shares:
        return "auto"
    if [label for label, _ in shares] == ["none"]:
        return "auto: no speculation paid in this reply"
    named = ", ".join(f"{label.replace(' k=', ' k = ')} {share:.0%}" for label, share in shares[:3])
    return f"auto: {named}" + (", …" if len(shares) > 3 else "") + " of steps"


def _likelier(shift: float) -> str:
    """A log-odds shift in words: "more often" or "less often"."""
    return "more often" if shift > 0 else "less often"


def auto_details(report: dict) -> str:
    """Auto's measurements behind a reply, a few lines for the status line's details: what a
    pass over 1..K+1 tokens costs here (and against one), each method's drafting per token, the
    draft tails it cut, its steps and its verdict."""
    costs = report.get("costs") or {}
    lines = ["auto's measurements on this machine:"]
    pass_ms = costs.get("pass_ms") or []
    if pass_ms:
        sizes = ", ".join(str(n) for n in range(1, len(pass_ms) + 1))
        ratios = ", ".join(f"{t / pass_ms[0]:.1f}x" for t in pass_ms)
        lines.append(f"a pass over {sizes} tokens: {', '.join(f'{t:.1f}' for t in pass_ms)} ms ({ratios} one)")
    drafting = costs.get("draft_token_ms") or {}
    if drafting:
        lines.append("drafting per token: " + ", ".join(f"{m} {t:.2f} ms" for m, t in drafting.items()))
    tails = report.get("draft_p_min") or {}
    if tails:
        shifts = report.get("tail_calibration") or {}
        lines.append("draft tails cut below: " + ", ".join(
            f"{m} p = {p:.2f}" + (f" (its rows accepted {_likelier(shifts[m])} than its confidence says)"
                                  if abs(shifts.get(m, 0.0)) >= 0.1 else "")
            for m, p in tails.items()))
    catch_up = {m: scale for m, scale in (report.get("catch_up_scale") or {}).items() if scale != 1.0}
    if catch_up:
        lines.append("catching up after other methods drafted: " + ", ".join(
            f"{m} {scale:.1f}x the price its drafting speed suggests" for m, scale in catch_up.items()))
    if report.get("reprobe_steps"):
        lines.append(f"re-probes: {report['reprobe_steps']} of {report.get('steps', 0)} steps drafted with a method "
                     "expected to be slower, to see whether the text changed (fewer the longer it keeps losing)")
    lines.append(auto_footer(report))
    return "\n".join(lines)


def drafted_per_step(turn: Turn, stats: RunStats) -> int:
    """The k a turn's charts and footer read: a server's per-position numbers come with the
    reply's end, a local run's from its spec."""
    return len(stats.per_position_drafted) or turn.request.spec.draft_tokens or (1 if stats.drafted else 0)


class ChatController:
    """A conversation's branches, edits, regenerations, rollbacks and saves (module docstring).

    `request()` says how the next reply is asked for, raising SpecDeskError when none can be
    (no model loaded): the action is then undone and the error raised. `system_prompt()` is
    what a new chat starts with; `chats_changed` is told when the chat list may have changed."""

    def __init__(self, history: History, runner: TurnRunner, request: Callable[[], TurnRequest],
                 system_prompt: Callable[[], str] = lambda: "", display: Optional[ChatDisplay] = None,
                 chats_changed: Callable[[], None] = lambda: None):
        self.history = history
        self.runner = runner
        self.request = request
        self.system_prompt = system_prompt
        self.display = display
        self.chats_changed = chats_changed
        self.chat_id: Optional[int] = None
        self.messages: list[ChatMessage] = []  # the open chat's active path, as drawn
        self.editing: Optional[int] = None  # the user's message being edited (its history id)
        self.turn: Optional[Turn] = None  # the reply being generated

    # --- which chat ---------------------------------------------------------------------
    def new_chat(self) -> None:
        self.stop()  # a reply still generating is saved to the chat it belongs to
        self.chat_id = None
        self.editing = None
        self._show([])
        self.runner.new_chat()
        self.chats_changed()

    def open_chat(self, chat_id: int) -> bool:
        """Show a chat of the history; False when it is the one open."""
        if chat_id == self.chat_id:
            return False
        self.stop()
        self.chat_id = chat_id
        self.editing = None
        self.show_chat()
        self.runner.new_chat()
        self.chats_changed()
        return True

    def chat_deleted(self, chat_id: int) -> bool:
        """The history lost a chat: a new one when it was open (then True)."""
        if chat_id != self.chat_id:
            return False
        self.new_chat()
        return True

    def chat_system_prompt(self) -> str:
        """The open chat's system prompt; with none open, the one a new chat starts with."""
        chat = self.history.chat(self.chat_id) if self.chat_id is not None else None
        return chat.system_prompt if chat is not None else self.system_prompt()

    def set_system_prompt(self, text: str) -> bool:
        """The open chat's system prompt is `text`; False when no chat is open (it is then the
        next new chat's, which `system_prompt()` says)."""
        if self.chat_id is None or not self.history.is_open:
            return False
        self.history.set_system_prompt(self.chat_id, text)
        return True

    def show_chat(self) -> None:
        """The open chat's active path, from the history, each message with its alternatives."""
        saved = self.history.messages(self.chat_id) if self.chat_id is not None else []
        self._show([ChatMessage.from_spans(m.role, m.content, m.meta.get("draft_spans"), m.id,
                                           m.meta.get("footer", ""), m.alternative, m.alternatives) for m in saved])

    def _show(self, messages: list[ChatMessage]) -> None:
        self.messages = messages
        if self.display is not None:
            self.display.set_messages(messages)

    def _add(self, message: ChatMessage) -> ChatMessage:
        self.messages.append(message)
        if self.display is not None:
            self.display.add_message(message)
        return message

    # --- what the user asks -----------------------------------------------------------
    def send(self, text: str) -> Optional[Turn]:
        """What was typed: a new message, or another version of the one being edited."""
        if self.turn is not None:
            return None
        editing, self.editing = self.editing, None
        index = self.index_of(editing)
        if index is not None:
            return self.edit(index, text)
        request = self.request()
        return self._start(request, user_id=self.add_user_message(text), user_text=text)

    def add_user_message(self, text: str) -> int:
        """The user's message in the transcript and the history (a new chat, with the system
        prompt new chats start with, when none is open); returns its history id."""
        if self.chat_id is None:
            self.chat_id = self.history.create_chat(chat_title(text), system_prompt=self.system_prompt())
        message = ChatMessage("user", [text], [False])
        message.db_id = self.history.add_message(self.chat_id, "user", text)
        self._add(message)
        self.chats_changed()
        return message.db_id

    def index_of(self, message_id: Optional[int]) -> Optional[int]:
        """Where the message with this history id is in the transcript (None: not in it)."""
        return next((i for i, m in enumerate(self.messages) if message_id is not None and m.db_id == message_id),
                    None)

    def _at(self, index: Optional[int]) -> Optional[ChatMessage]:
        return self.messages[index] if index is not None and 0 <= index < len(self.messages) else None

    def start_edit(self, index: int) -> Optional[str]:
        """Edit the user's message at `index`: returns its text for the input (None: it cannot
        be edited now); the next send keeps the original as another version."""
        message = self._at(index)
        if self.turn is not None or message is None or message.role != "user" or message.db_id is None:
            return None
        self.editing = message.db_id
        return message.text

    def cancel_edit(self) -> bool:
        """Not an edit any more; False when none was in progress."""
        if self.editing is None:
            return False
        self.editing = None
        return True

    def edit(self, index: int, text: str) -> Optional[Turn]:
        """The user's message at `index` gets another version, `text`, answered at once; the
        original and what follows it stay, one arrow away."""
        original = self._at(index)
        if self.turn is not None or original is None or original.role != "user" or original.db_id is None:
            return None
        try:
            request = self.request()
        except Exception:
            self.editing = original.db_id  # still editing: nothing typed is lost
            raise
        user_id = self.history.add_alternative(original.db_id, text)
        self.show_chat()
        self.chats_changed()
        return self._start(request, user_id=user_id, user_text=text, restore=original.db_id)

    def regenerate(self, index: Optional[int] = None) -> Optional[Turn]:
        """Answer again: the reply at `index` of the transcript (by default the last one) gets
        another version, written from the conversation before it; the old one stays, one arrow away."""
        if index is None:
            index = next((i for i in range(len(self.messages) - 1, -1, -1)
                          if self.messages[i].role == "assistant"), None)
        message = self._at(index)
        if self.turn is not None or message is None or message.role != "assistant" or message.db_id is None:
            return None
        request = self.request()
        self._show(self.messages[:index])
        return self._start(request, replaces=message.db_id)

    def switch(self, index: int, step: int) -> bool:
        """Show the previous (step -1) or next (+1) version of the message at `index`, and the
        conversation that follows it."""
        message = self._at(index)
        if self.turn is not None or message is None or message.db_id is None:
            return False
        self.history.switch_alternative(message.db_id, step)
        self.show_chat()
        return True

    def stop(self) -> None:
        if self.turn is not None:
            self.runner.stop(self.turn.job_id)

    def conversation(self, messages: Sequence[ChatMessage]) -> list[dict]:
        """Messages as the chat template gets them: after the open chat's system prompt."""
        return with_system_prompt([{"role": m.role, "content": m.text} for m in messages],
                                  self.chat_system_prompt())

    def _start(self, request: TurnRequest, **turn) -> Turn:
        """A reply to the transcript (ending in the user's message)."""
        conversation = self.conversation(self.messages)
        reply = self._add(ChatMessage("assistant"))
        self.turn = Turn(request, self.chat_id, conversation, reply, **turn)
        started = self.turn
        self.runner.run_turn(started, self)
        return started

    # --- what the runner reports ---------------------------------------------------------
    def _current(self, job_id: int) -> Optional[Turn]:
        return self.turn if self.turn is not None and self.turn.job_id == job_id else None

    def add_pieces(self, job_id: int, pieces: Sequence[str], from_draft: Sequence[bool],
                   reason: Optional[str] = None) -> Optional[Turn]:
        """Streamed tokens of the turn `job_id` (None: not the turn in progress); `reason`:
        method auto's latest choice."""
        turn = self._current(job_id)
        if turn is None:
            return None
        turn.reply.pieces.extend(pieces)
        turn.reply.from_draft.extend(from_draft)
        if reason:
            turn.last_reason = reason
        if self.display is not None:
            self.display.reply_grew(turn.reply)
        return turn

    def finish(self, job_id: int, outcome: ChatOutcome) -> Optional[Turn]:
        """The turn ended: its reply saved with its numbers, or the turn rolled back."""
        return self._end(job_id, outcome=outcome)

    def fail(self, job_id: int, message: str) -> Optional[Turn]:
        """The turn failed: the reply so far stays, marked, or the turn is rolled back."""
        return self._end(job_id, error=message)

    def _end(self, job_id: int, outcome: Optional[ChatOutcome] = None, error: Optional[str] = None) -> Optional[Turn]:
        turn = self._current(job_id)
        if turn is None:
            return None
        self.turn, turn.outcome = None, outcome
        if not turn.kept:  # stopped or failed before any text: the turn is rolled back
            self._roll_back(turn)
        elif error is not None:
            self._save_reply(turn, f"partial reply · {error}",
                             {"finish_reason": "error", "partial": True, "error": error})
        else:
            self._save_reply(turn, *reply_record(turn, outcome))
        return turn

    def _save_reply(self, turn: Turn, footer: str, meta: dict) -> None:
        message = turn.reply
        meta = {**meta, **turn.request.backend.origin(turn.request.spec), "draft_spans": message.draft_spans(),
                "footer": footer}
        if not self.history.is_open or self.history.chat(turn.chat_id) is None:
            return  # closing, or its chat was deleted while it generated
        if turn.replaces is not None:
            message.db_id = self.history.add_alternative(turn.replaces, message.text, meta)
        else:
            parent = {} if turn.user_id is None else {"parent_id": turn.user_id}
            message.db_id = self.history.add_message(turn.chat_id, "assistant", message.text, meta, **parent)
        versions = self.history.alternatives(message.db_id)
        message.alternative, message.alternatives = versions.index(message.db_id), len(versions)
        message.footer = footer
        if self.display is not None:
            self.display.end_reply(message, footer)
        self.chats_changed()

    def _roll_back(self, turn: Turn) -> None:
        """A turn without a reply leaves nothing: the user's message it added leaves the history
        (a chat that was only this turn goes with it) and its text returns to the input; an
        edited message shows its original again, a regenerated reply its previous version."""
        if not self.history.is_open:
            return  # closing
        if turn.user_id is not None:
            self.history.delete_message(turn.user_id)
            if turn.restore is not None and self.history.chat(turn.chat_id) is not None:
                self.history.select(turn.restore)
            if not self.history.messages(turn.chat_id):  # a chat that was only this turn goes with it
                self.history.delete_chat(turn.chat_id)
            self.chats_changed()
        if self.chat_id != turn.chat_id:
            return  # another chat is on screen now
        if self.history.chat(turn.chat_id) is None:
            self.chat_id = None
            self.chats_changed()
        self.show_chat()
        if turn.user_text and self.display is not None and self.display.offer_input(turn.user_text):
            if turn.restore is not None:
                self.editing = turn.restore  # still an edit of the original
