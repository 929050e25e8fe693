"""The worker's pieces without a window: event batching on literal events, and jobs on the real engine."""

from __future__ import annotations

import threading

import pytest

from specdesk.app.runtime.backend import ChatSettings
from specdesk.app.runtime.generation import drain
from specdesk.app.runtime.session import chat_tokens, run_sweep, stream_chat
from specdesk.engines.types import SamplingParams, SpecConfig, SpecDeskError, StepEvent
from specdesk.ui.jobs import EventBatcher

TOKEN_BYTES = {1: b"a", 2: b"\xc3", 3: b"\xa9", 4: b"b", 5: b"\xe2\x82"}.__getitem__  # 2+3 = "é"; 5 is half of "€"


def event(tokens, from_draft, finished=False):
    accepted = sum(from_draft)
    return StepEvent(tokens=tuple(tokens), text="", drafted=accepted + 1, accepted=accepted,
                     position_accepted=(True,) * accepted + (False,), from_draft=tuple(from_draft),
                     draft_s=0.001, verify_s=0.002, finished=finished, finish_reason="length" if finished else None)


def test_pieces_never_split_a_character_and_batches_are_coalesced():
    sent = []
    batcher = EventBatcher(7, "chat", 2, TOKEN_BYTES, sent.append, interval_s=3600)
    batcher(event([1, 2], [True, False]))  # the first event goes out at once (nothing sent for an hour before)
    batcher(event([3, 4], [True, False]))
    batcher(event([1], [False]))
    assert len(sent) == 1 and sent[0].first and sent[0].pieces == ("a", "")
    batcher.flush()
    assert len(sent) == 2 and not sent[1].first
    assert sent[1].pieces == ("é", "b", "a") and sent[1].from_draft == (True, False, False)
    assert len(sent[1].events) == len(sent[1].times) == 2 and sent[1].k == 2 and sent[1].job_id == 7
    batcher(event([5], [False], finished=True))  # the last event flushes what is held back (invalid: U+FFFD)
    assert len(sent) == 3 and sent[2].pieces == ("\ufffd",)


@pytest.mark.parametrize("boot_clock", [0.0, 0.004, 12.5])
def test_first_event_goes_out_at_once_on_a_freshly_booted_machine(monkeypatch, boot_clock):
    """perf_counter() starts near 0 at boot: the first batch must not wait for it to pass the interval."""
    import specdesk.ui.jobs as jobs

    monkeypatch.setattr(jobs.time, "perf_counter", lambda: boot_clock)
    sent = []
    batcher = EventBatcher(1, "chat", 2, TOKEN_BYTES, sent.append, interval_s=3600)
    batcher(event([1], [False]))
    assert len(sent) == 1 and sent[0].first and sent[0].times == (boot_clock,)
    batcher(event([4], [False]))  # the same instant: held back by the interval
    assert len(sent) == 1


def test_throttle_lets_the_first_call_through_whatever_the_clock_reads():
    from specdesk.ui.jobs import Throttle

    throttle = Throttle(1.0, clock=lambda: 0.0)  # a clock that has only just started
    assert throttle.due()
    throttle.mark()
    assert not throttle.due() and not throttle.due(0.999)
    assert throttle.due(1.0)
    throttle.mark(1.0)
    assert not throttle.due(1.5) and throttle.due(2.25)


def test_flush_without_events_sends_nothing():
    sent = []
    EventBatcher(1, "chat", 0, TOKEN_BYTES, sent.append).flush()
    assert sent == []


@pytest.fixture(scope="module")
def engine(demo_family):
    from specdesk.engines.llama.engine import LlamaEngine

    engine = LlamaEngine(demo_family["target_gguf"], n_threads=1)
    yield engine
    engine.close()


def test_chat_job_streams_what_it_returns(engine):
    sent = []
    batcher = EventBatcher(1, "chat", 3, engine.target.token_bytes, sent.append)
    result = drain(stream_chat(engine, [{"role": "user", "content": "def f(x):"}],
                               ChatSettings(SpecConfig(method="ngram", k=3), SamplingParams(), 24), threading.Event()),
                   batcher)
    batcher.flush()
    assert "".join(p for b in sent for p in b.pieces) == result.result.text
    assert sum(len(b.pieces) for b in sent) == result.result.stats.tokens == 24
    assert result.dropped_messages == 0


def test_old_turns_are_dropped_when_the_chat_outgrows_the_context(engine):
    long_turn = "word " * 60
    messages = [{"role": "user", "content": long_turn}, {"role": "assistant", "content": long_turn},
                {"role": "user", "content": "def f(x):"}]
    tokens, dropped = chat_tokens(engine, messages, max_tokens=64)
    assert dropped >= 1 and len(tokens) + 64 <= engine.n_ctx
    with pytest.raises(SpecDeskError, match="no message"):
        chat_tokens(engine, [], 8)


def test_sweep_reports_baseline_then_each_k_and_stops_when_cancelled(engine):
    points = []
    sweep = run_sweep(engine, "def f(x):", SpecConfig(method="ngram", k=4), SamplingParams(), 16, (1, 2, 3),
                      threading.Event(), points.append, chat=False)
    assert [p.k for p in points] == [0, 1, 2, 3] and [p.k for p in sweep.points] == [1, 2, 3]
    assert sweep.fastest() in sweep.points and sweep.best() in (None, sweep.fastest())
    assert all(p.rate.runs >= 3 and p.speedup.runs == p.rate.runs for p in sweep.points)
    cancel = threading.Event()
    cancel.set()
    stopped = run_sweep(engine, "def f(x):", SpecConfig(method="ngram", k=4), SamplingParams(), 16, (1, 2, 3),
                        cancel, lambda p: None, chat=False)
    assert stopped.points == ()
    with pytest.raises(SpecDeskError, match="speculation method"):
        run_sweep(engine, "x", SpecConfig(method="none"), SamplingParams(), 8, (1,), threading.Event(), lambda p: None)
