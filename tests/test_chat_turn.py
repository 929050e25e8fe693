"""One chat turn (app/runtime/backend.chat_turn), the same on every backend: the local engine
process (app/runtime/session.Session on the small demo target) and a server (a real
`specdesk serve` on the same target, through app/serving/served.ServedSession).

A turn stopped or failed before any text (Ctrl-C, an error) leaves the conversation as it
was before the user's message; one stopped after some text keeps it as the reply. The
terminal chat, the app and `specdesk serve` all take their turns here."""

from __future__ import annotations

import threading

import pytest

from specdesk.app.runtime.backend import ChatSettings, chat_turn
from specdesk.app.runtime.session import Session
from specdesk.engines.types import SamplingParams, SpecConfig, SpecDeskError

SETTINGS = ChatSettings(SpecConfig(method="ngram", k=3), SamplingParams(), 12)
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
    messages = [{"role": "system", "content": "You write Python."}, user("def f(x):")]
    outcome = chat_turn(backend, messages, SETTINGS, threading.Event())
    assert outcome.text and outcome.result.stats.tokens == 12
    assert messages[-1] == {"role": "assistant", "content": outcome.text} and len(messages) == 3
    answered = [dict(m) for m in messages]

    def interrupt(event) -> None:  # Ctrl-C while the first text is being shown: nothing was
        raise KeyboardInterrupt

    messages.append(user("class A:"))
    with pytest.raises(KeyboardInterrupt):
        chat_turn(backend, messages, SETTINGS, threading.Event(), interrupt)
    assert messages == answered  # the user's turn went with it

    messages.append(user(TOO_LONG))  # refused: an error, and the conversation is as it was
    with pytest.raises(SpecDeskError, match="context|long"):
        chat_turn(backend, messages, SETTINGS, threading.Event())
    assert messages == answered

    stop = threading.Event()
    shown = []

    def stop_after_the_first(event) -> None:  # Stop once some text is shown: it stays as the reply
        shown.append(event.text)
        stop.set()

    messages.append(user("import os"))
    long_reply = ChatSettings(SETTINGS.spec, SETTINGS.sampling, 1000)  # far longer than Stop takes to arrive
    outcome = chat_turn(backend, messages, long_reply, stop, stop_after_the_first)
    assert outcome.result.finish_reason == "cancelled" and shown[0] and outcome.text.startswith(shown[0])
    assert messages == [*answered, user("import os"), {"role": "assistant", "content": outcome.text}]

    # the next turn follows a reply, never a second user message in a row
    messages.append(user("def g(y):"))
    outcome = chat_turn(backend, messages, SETTINGS, threading.Event())
    roles = [m["role"] for m in messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant"] and outcome.text
