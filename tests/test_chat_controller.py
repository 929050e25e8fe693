"""The chat controller without Qt (app/runtime/chat_controller.py): branches, edit, regenerate,
rollback and save, driven as the terminal chat drives it (`ThisThread`: each turn's chat_turn
on this thread) on the small demo target in its engine process, and on a served engine (the
replayed vLLM recording, tests/served/). The window's chat tests (tests/test_chat_features.py,
tests/test_ui.py, tests/test_served_ui.py) drive the same controller through the window."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from served_replay import Replay, load  # noqa: E402
from test_chat_turn import local as session  # noqa: E402,F401  (the small demo target's Session, module-wide)

from specdesk.app.runtime.chat_controller import ChatController, ChatMessage, ThisThread, TurnRequest  # noqa: E402
from specdesk.app.storage.history import History  # noqa: E402
from specdesk.engines.types import SamplingParams, SpecConfig, SpecDeskError  # noqa: E402

TOO_LONG = "word " * 200_000  # far past the demo target's context: refused before any text


class Transcript:
    """A display that keeps what a chat view would draw (ui/chat_view.ChatView draws the same
    calls), and an input box."""

    def __init__(self) -> None:
        self.messages: list[ChatMessage] = []
        self.ended: list[tuple[ChatMessage, str]] = []
        self.grown = 0
        self.input = ""

    def set_messages(self, messages) -> None:
        self.messages = list(messages)

    def add_message(self, message: ChatMessage) -> ChatMessage:
        self.messages.append(message)
        return message

    def reply_grew(self, message: ChatMessage) -> None:
        self.grown += bool(self.messages) and self.messages[-1] is message  # drawn when on screen

    def end_reply(self, message: ChatMessage, footer: str) -> None:
        self.ended.append((message, footer))

    def offer_input(self, text: str) -> bool:
        if self.input.strip():
            return False
        self.input = text
        return True


def make_chat(backend, history: History, spec: SpecConfig = SpecConfig(method="ngram", k=3), max_tokens: int = 12,
              temperature: float = 0.0, system: str = "", show=None):
    """A controller as the terminal makes one; `request` may be swapped for the next turn."""
    transcript, lists = Transcript(), []
    chat = ChatController(history, ThisThread(backend, show), lambda: chat.next_request, lambda: system,
                          transcript, lambda: lists.append(chat.chat_id))
    chat.next_request = TurnRequest(spec, SamplingParams(temperature=temperature, seed=1), max_tokens, backend)
    return chat, transcript, lists


@pytest.fixture
def history(tmp_path):
    history = History(tmp_path / "history.sqlite3")
    yield history
    history.close()


def texts(chat: ChatController) -> list[str]:
    return [m.text for m in chat.messages]


def test_a_turn_is_saved_with_its_numbers_and_drawn(session, history):
    chat, transcript, lists = make_chat(session, history, system="You write Python.")
    turn = chat.send("def parse_args(argv):")
    assert turn.outcome.text and chat.turn is None and turn.kept
    assert [m.role for m in chat.messages] == ["user", "assistant"] and chat.messages[1] is turn.reply
    assert transcript.messages == chat.messages and transcript.ended == [(turn.reply, turn.reply.footer)]
    assert transcript.grown == turn.outcome.result.stats.passes  # each step's text drawn as it came
    saved = history.messages(chat.chat_id)
    assert [(m.role, m.content) for m in saved] == [("user", "def parse_args(argv):"), ("assistant", turn.outcome.text)]
    assert history.chat(chat.chat_id).system_prompt == "You write Python."
    meta = saved[1].meta
    assert (meta["method"], meta["k"], meta["tokens"]) == ("ngram", 3, 12) and "numbers_from" not in meta
    assert meta["footer"].startswith("max tokens · ngram, k = 3 · 12 tokens") and meta["footer"] == turn.reply.footer
    assert sum(n for n, _ in meta["draft_spans"]) == len(turn.outcome.text)
    # the model was given the chat's system prompt, then the conversation on screen
    assert turn.messages[0] == {"role": "system", "content": "You write Python."}
    assert lists and lists[-1] == chat.chat_id
    # the next turn is answered from the whole conversation, and opening the chat again shows it
    second = chat.send("and then?")
    assert second.messages[1:4] == [{"role": "user", "content": "def parse_args(argv):"},
                                    {"role": "assistant", "content": turn.outcome.text},
                                    {"role": "user", "content": "and then?"}]
    chat.new_chat()
    assert chat.chat_id is None and chat.messages == [] and transcript.messages == []
    chat.open_chat(history.chats()[0].id)
    assert texts(chat) == ["def parse_args(argv):", turn.outcome.text, "and then?", second.outcome.text]
    assert chat.messages[1].footer == turn.reply.footer and chat.messages[1].draft_spans() == meta["draft_spans"]


def test_edit_and_regenerate_keep_both_branches_and_switch_between_them(session, history):
    chat, transcript, _ = make_chat(session, history, temperature=0.9)
    first = chat.send("def parse_args(argv):")
    first_user, first_reply = chat.messages[0].db_id, first.outcome.text
    # Edit: the text for the input, then Send answers the new version under it
    assert chat.start_edit(1) is None  # a reply is not edited
    assert chat.start_edit(0) == "def parse_args(argv):" and chat.editing == first_user
    assert chat.cancel_edit() and chat.editing is None and not chat.cancel_edit()
    chat.start_edit(0)
    edited = chat.send("def main():")
    assert texts(chat) == ["def main():", edited.outcome.text] and edited.restore == first_user
    assert (chat.messages[0].alternative, chat.messages[0].alternatives) == (1, 2)
    assert len(history.alternatives(first_user)) == 2 and edited.messages[-1]["role"] == "assistant"
    assert edited.messages[-2] == {"role": "user", "content": "def main():"}  # the new version was answered
    # Regenerate the reply under the edit: another version of it, written from the conversation before it
    chat.next_request = chat.next_request._replace(sampling=SamplingParams(temperature=0.9, seed=2))
    again = chat.regenerate(1)
    assert again.replaces == edited.reply.db_id and again.messages[-2]["content"] == "def main():"
    assert (chat.messages[1].alternative, chat.messages[1].alternatives) == (1, 2)
    assert [m.role for m in history.all_messages(chat.chat_id)] == ["user", "assistant", "user", "assistant",
                                                                    "assistant"]
    # the arrows: back to the first version of the user's message, with its own reply
    assert chat.switch(0, -1)
    assert texts(chat) == ["def parse_args(argv):", first_reply] and transcript.messages == chat.messages
    chat.switch(0, +1)
    assert texts(chat) == ["def main():", again.outcome.text] and chat.messages[1].alternatives == 2
    chat.switch(1, -1)
    assert texts(chat) == ["def main():", edited.outcome.text]
    # the conversation the model is given follows the branch on screen
    follow = chat.send("and then?")
    assert [m["content"] for m in follow.messages[:3]] == ["def main():", edited.outcome.text, "and then?"]
    # nothing starts while a turn is in progress, nor on what cannot be regenerated
    assert chat.regenerate(0) is None and chat.switch(9, 1) is False


def test_a_turn_without_text_is_rolled_back_and_its_text_returns_to_the_input(session, history):
    chat, transcript, lists = make_chat(session, history)
    with pytest.raises(SpecDeskError, match="context|long"):
        chat.send(TOO_LONG)
    # a chat that was only this turn goes with it, and nothing typed is lost
    assert chat.chat_id is None and history.chats() == [] and chat.messages == [] and chat.turn is None
    assert transcript.input == TOO_LONG and lists
    transcript.input = ""
    answered = chat.send("def f(x):")
    kept = [(m.role, m.content) for m in history.messages(chat.chat_id)]
    with pytest.raises(SpecDeskError):
        chat.send(TOO_LONG)
    assert [(m.role, m.content) for m in history.messages(chat.chat_id)] == kept
    assert texts(chat) == ["def f(x):", answered.outcome.text]
    # a failed edit shows the original again and is still an edit of it
    transcript.input = ""
    chat.start_edit(0)
    with pytest.raises(SpecDeskError):
        chat.send(TOO_LONG)
    assert texts(chat) == ["def f(x):", answered.outcome.text] and chat.editing == chat.messages[0].db_id
    assert history.alternatives(chat.messages[0].db_id) == [chat.messages[0].db_id]
    assert transcript.input == TOO_LONG
    # a typed input is never overwritten by a rolled-back turn's text
    transcript.input = "something else"
    chat.cancel_edit()
    with pytest.raises(SpecDeskError):
        chat.send(TOO_LONG)
    assert transcript.input == "something else" and chat.editing is None


def test_a_request_that_cannot_be_made_changes_nothing(session, history):
    chat, transcript, _ = make_chat(session, history)
    answered = chat.send("def f(x):")

    def refuse():
        raise SpecDeskError("no model is loaded yet")

    chat.request = refuse
    for act in (lambda: chat.send("more"), lambda: chat.regenerate(), lambda: chat.start_edit(0) and chat.send("g")):
        with pytest.raises(SpecDeskError, match="no model"):
            act()
    assert texts(chat) == ["def f(x):", answered.outcome.text] and len(history.all_messages(chat.chat_id)) == 2
    assert chat.editing == chat.messages[0].db_id  # the edit goes on: Send again once a model is loaded


def test_a_stopped_reply_keeps_its_text_and_a_deleted_chat_gets_none(session, history):
    chat, transcript, _ = make_chat(session, history, max_tokens=1000)
    shown: list[str] = []

    def stop_after_the_first(text: str) -> None:  # Stop once some text is shown: it stays as the reply
        shown.append(text)
        chat.stop()

    chat.runner.show = stop_after_the_first
    turn = chat.send("import os")
    assert turn.outcome.result.finish_reason == "cancelled" and turn.outcome.text.startswith(shown[0])
    saved = history.messages(chat.chat_id)[-1]
    assert saved.content == turn.outcome.text and saved.meta["footer"].startswith("stopped · ngram, k = 3")

    def delete_the_chat(text: str) -> None:  # the chat goes while its reply is generated
        if chat.chat_id is not None and history.chat(chat.chat_id) is not None:
            history.delete_chat(chat.chat_id)
            chat.chat_deleted(chat.chat_id)

    chat.runner.show = delete_the_chat
    chat.next_request = chat.next_request._replace(max_tokens=8)
    lost = chat.send("class A:")
    assert lost.kept and lost.reply.db_id is None and history.chats() == []  # nothing saved to a chat that is gone
    assert chat.chat_id is None and chat.messages == [] and chat.turn is None


def test_the_terminal_chat_keeps_its_turns_in_a_controller(session, monkeypatch, tmp_path):
    from specdesk.app.main import terminal_chat
    from specdesk.app.runtime.backend import ChatSettings

    lines = iter(["def f(x):", TOO_LONG, "/save " + str(tmp_path / "chat.md"), "/reset", "class A:", None])
    monkeypatch.setattr("specdesk.app.main.next_user_line", lambda: next(lines))
    conversation = terminal_chat(session, ChatSettings(SpecConfig(method="ngram", k=3), SamplingParams(), 6),
                                 "You write Python.")
    assert [m["role"] for m in conversation] == ["system", "user", "assistant"]
    assert conversation[1]["content"] == "class A:"
    saved = (tmp_path / "chat.md").read_text(encoding="utf-8")
    assert saved.startswith("# SpecDesk chat\n") and "## You\n\ndef f(x):\n" in saved and "word word" not in saved


@pytest.fixture
def served():
    from specdesk.app.serving.endpoint import Endpoint
    from specdesk.app.serving.served import ServedSession

    def open_replay(replay: Replay) -> ServedSession:
        endpoint = Endpoint(replay.url, timeout=30.0)
        endpoint.probe()
        return ServedSession(endpoint)

    return open_replay


def test_a_served_reply_says_which_server_and_a_dropped_one_is_kept_or_rolled_back(served, history):
    recording = load("vllm_per_request.json")
    with Replay(recording) as replay:
        backend = served(replay)
        chat, _, _ = make_chat(backend, history, spec=SpecConfig(), max_tokens=64)
        turn = chat.send("Write a function that parses command line arguments.")
    expected = "".join(c["choices"][0]["delta"].get("content") or "" for c in recording["stream"] if c["choices"])
    assert chat.messages[-1].text == expected == turn.outcome.text
    meta = history.messages(chat.chat_id)[-1].meta
    assert meta["server"] == {"url": replay.url, "model": "meta-llama/Llama-3.3-70B-Instruct"}
    assert meta["numbers_from"] == "per request" and "method" not in meta
    assert f"· {backend.endpoint.model} ·" in meta["footer"] and "numbers: per request" in meta["footer"]

    with Replay(load("vllm_counters.json"), drop_after=5) as replay:  # some text, then the stream ends
        chat.runner.backend = backend = served(replay)
        chat.next_request = chat.next_request._replace(backend=backend)
        with pytest.raises(SpecDeskError, match="closed the stream mid-reply"):
            chat.send("hello")
    partial = history.messages(chat.chat_id)[-1]
    assert partial.meta["partial"] and partial.content == chat.messages[-1].text != ""
    assert partial.meta["footer"].startswith("partial reply · ") and partial.meta["server"]["url"] == replay.url

    with Replay(load("vllm_counters.json"), drop_after=0) as replay:  # no text: the turn is rolled back
        chat.next_request = chat.next_request._replace(backend=served(replay))
        with pytest.raises(SpecDeskError, match="after 0 characters"):
            chat.send("hello again")
    assert history.messages(chat.chat_id)[-1] == partial and chat.messages[-1].text == partial.content


def test_an_auto_reply_footer_says_what_auto_did_over_the_reply(session, history):
    """Not the last step's passing choice ("auto (last: ngram, k = 1: re-probing …)"): the
    verdict when no draft could pay, else its choices by share of the reply's steps."""
    from specdesk.app.runtime.chat_controller import auto_footer

    assert auto_footer({"verdict": "checking 2 tokens costs 2.1x one here, so no draft can pay",
                        "steps_by_choice": {"none": 1.0}}) == (
        "auto: speculation off (checking 2 tokens costs 2.1x one here, so no draft can pay)")
    assert auto_footer({"verdict": None, "steps_by_choice": {"ngram-pool k=2": 0.62, "none": 0.38}}) == (
        "auto: ngram-pool k = 2 62%, none 38% of steps")
    assert auto_footer({"verdict": None, "steps_by_choice": {"none": 1.0}}) == "auto: no speculation paid in this reply"
    chat, _, _ = make_chat(session, history, spec=SpecConfig(method="auto", k=3))
    turn = chat.send("def parse_args(argv):")
    report = turn.outcome.result.auto_report
    assert report and turn.reply.footer.split(" · ")[1] == auto_footer(report) and "(last:" not in turn.reply.footer
