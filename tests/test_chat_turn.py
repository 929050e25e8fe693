"""One chat turn (app/runtime/backend.chat_turn), the same on every backend: the local engine
process (app/runtime/session.Session on the small demo target) and a server (a real
`specdesk serve` on the same target, through app/serving/served.ServedSession).

A turn stopped or failed before any text (whitespace aside) leaves the conversation as it
was before the user's message; one that produced text keeps it as the reply, Ctrl-C
included. The terminal chat, the app and `specdesk serve` all take their turns here."""

from __future__ import annotations

import threading

import pytest

from specdesk.app.runtime.backend import ChatSettings, chat_turn
from specdesk.app.runtime.session import Session
from specdesk.engines.types import SamplingParams, SpecConfig, SpecDeskError

SETTINGS = ChatSettings(SpecConfig(method="ngram", k=3), SamplingParams(), 12)
SAMPLED = ChatSettings(SpecConfig(method="ngram", k=3), SamplingParams(temperature=1.0, seed=7), 12)
TOO_LONG = "word " * 200_000  # far past the demo target's context, in characters alone


@pytest.fixture(scope="module")
def local(demo_family):
    session = Session()
    session.load(demo_family["target_gguf"], None, threads=1)
    yield session
    session.close()


@pytest.fixture(scope="module")
def served(demo_family):
    pytest.importorskip("openai")  # test_serve's helpers talk to the server with it too
    from test_serve import start_server, stop_server

    from specdesk.app.serving.endpoint import Endpoint
    from specdesk.app.serving.served import ServedSession

    child, url = start_server("--target", demo_family["target_gguf"], "--method", "ngram", "--k", "3",
                              "--threads", "1")
    endpoint = Endpoint(url, timeout=120.0)
    endpoint.probe()
    yield ServedSession(endpoint)
    endpoint.close()
    stop_server(child)


@pytest.fixture(params=["local", "served"])
def backend(request):
    return request.getfixturevalue(request.param)


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def test_a_turn_without_text_is_rolled_back_and_one_with_text_is_kept(backend):
    """Property of the shipped small family relied on: its greedy chat replies to these prompts
    begin with a newline, and a sampled one soon shows other text."""
    messages = [{"role": "system", "content": "You write Python."}, user("def f(x):")]
    outcome = chat_turn(backend, messages, SETTINGS, threading.Event())
    assert outcome.text and outcome.result.stats.tokens == 12
    assert messages[-1] == {"role": "assistant", "content": outcome.text} and len(messages) == 3
    answered = [dict(m) for m in messages]

    stopped = threading.Event()
    stopped.set()  # Stop at once: at most a step's whitespace came, so the user's turn goes
    messages.append(user("class A:"))
    outcome = chat_turn(backend, messages, SETTINGS, stopped)
    assert not outcome.text.strip() and outcome.result.finish_reason == "cancelled"
    assert messages == answered

    messages.append(user(TOO_LONG))  # refused: an error, and the conversation is as it was
    with pytest.raises(SpecDeskError, match="context|long"):
        chat_turn(backend, messages, SETTINGS, threading.Event())
    assert messages == answered

    shown = []

    def interrupted(event) -> None:  # Ctrl-C while the reply streams: what was shown stays the reply
        shown.append(event.text)
        if "".join(shown).strip():
            raise KeyboardInterrupt

    messages.append(user("import os"))
    with pytest.raises(KeyboardInterrupt):
        chat_turn(backend, messages, SAMPLED, threading.Event(), interrupted)
    assert messages == [*answered, user("import os"), {"role": "assistant", "content": "".join(shown)}]

    # the next turn follows a reply, never a second user message in a row
    messages.append(user("def g(y):"))
    outcome = chat_turn(backend, messages, SETTINGS, threading.Event())
    roles = [m["role"] for m in messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant"] and outcome.text
