"""This machine's measurements: recorded by compare runs, read back by pairing, which ranks
drafts by them and labels the rest as assumptions."""

from __future__ import annotations

import dataclasses
import json
import shutil
import statistics

import pytest

from specdesk.app.runtime import measurements
from specdesk.app.models.library import read_model
from specdesk.app.models.pairing import MemoryInfo, pair

PLENTY = MemoryInfo(ram_available=64 << 30, ram_total=64 << 30)


def test_records_round_trip_and_damaged_lines_are_skipped(tmp_path):
    path = tmp_path / "m.jsonl"
    measurements.record("t.gguf", "d.gguf", "llama.cpp", "draft", 3, 1.2, 0.7, 96, 0.0, path)
    measurements.record("t.gguf", "d.gguf", "llama.cpp", "draft", 3, 1.4, 0.8, 96, 0.0, path)
    measurements.record("t.gguf", "d.gguf", "llama.cpp", "draft", 5, 1.25, 0.6, 96, 0.0, path)
    measurements.record("t.gguf", "d.gguf", "llama.cpp", "ngram", 6, 3.0, 0.9, 96, 0.0, path)
    with path.open("a") as f:
        f.write('{"broken\n[1, 2]\n')
    records = measurements.read(path)
    assert len(records) == 4
    best = measurements.measured_for("t.gguf", "d.gguf", "draft", records)
    assert (best.k, best.runs) == (3, 2) and abs(best.speedup - 1.3) < 1e-9 and abs(best.acceptance - 0.75) < 1e-9
    assert measurements.measured_for("t.gguf", "other.gguf", "draft", records) is None
    assert measurements.read(tmp_path / "missing.jsonl") == []


def test_pairing_ranks_by_measured_numbers_and_labels_assumptions(demo_family, tmp_path):
    target, draft = demo_family["target_gguf"], demo_family["draft_gguf"]
    other = shutil.copy(draft, tmp_path / "other-draft.gguf")
    entries = [read_model(p, "user") for p in (target, draft, other)]

    assumed = pair(target, entries, memory=PLENTY, records=[])
    assert all(v.basis == "assumed" and v.reasons[0].startswith("assumed, not measured") for v in assumed.compatible)

    path = tmp_path / "m.jsonl"
    measurements.record(target, draft, "llama.cpp", "draft", 4, 0.9, 0.6, 96, 0.0, path)
    measurements.record(target, str(other), "llama.cpp", "draft", 3, 1.21, 0.69, 96, 0.0, path)
    report = pair(target, entries, memory=PLENTY, records=measurements.read(path))
    ranked = [(v.path, v.score, v.k, v.basis) for v in report.compatible]
    assert ranked[:2] == [(str(other), 1.21, 3, "measured"), (draft, 0.9, 4, "measured")]
    assert report.compatible[0].reasons[0].startswith("measured on this machine: 1.21x (1 run) at k = 3, acceptance 69%")
    assert json.loads(json.dumps(report.to_json()))["compatible"][0]["basis"] == "measured"


def test_a_compare_from_the_command_line_is_recorded(demo_family, tmp_path, capsys):
    from specdesk.app.main import main

    code = main(["compare", "--target", demo_family["target_gguf"], "--draft", demo_family["draft_gguf"],
                 "--method", "draft", "--k", "2", "--max-tokens", "8", "--threads", "1",
                 "--prompt", "def main():", "--json", "-"])
    assert code == 0
    [line] = measurements.read()
    assert line["method"] == "draft" and line["k"] == 2 and line["speedup"] > 0
    # the compare ran until its speedup was steady (at least 3 runs, at most 7): the line keeps each run
    assert 3 <= line["runs"] == len(line["values"]) <= 7
    assert line["speedup"] == pytest.approx(statistics.median(line["values"]), abs=1e-3)
    measured = measurements.measured_for(demo_family["target_gguf"], demo_family["draft_gguf"])
    assert measured.runs == line["runs"] and measured.speedup == pytest.approx(line["speedup"], abs=1e-3)


def test_chat_replies_record_acceptance_and_tok_s_but_no_speedup(tmp_path):
    from specdesk.engines.types import RunStats, StepEvent

    def step(method, drafted, accepted):
        return StepEvent(tokens=(1,) * (accepted + 1), text="x", drafted=drafted, accepted=accepted,
                         position_accepted=(), from_draft=(), draft_s=0.0, verify_s=0.01, method=method)

    tally = measurements.MethodTally("auto")
    for event in (step("draft", 3, 2), step("draft", 3, 1), step("ngram", 4, 4), step("none", 0, 0)):
        tally(event)
    stats = RunStats(tokens=12, seconds=0.5, passes=4, drafted=10, accepted=7, draft_s=0.0, verify_s=0.04,
                     per_position_drafted=(), per_position_accepted=(), accepted_length_histogram=())
    path = tmp_path / "m.jsonl"
    measurements.record("t.gguf", "d.gguf", "llama.cpp", "draft", 3, 1.2, 0.7, 96, 0.0, path)
    measurements.record_chat("t.gguf", "d.gguf", "llama.cpp", "auto", 4, stats, 0.7, tally, path)
    measurements.record_chat("t.gguf", "d.gguf", "llama.cpp", "ngram", 5, stats, 0.0, None, path)
    empty = dataclasses.replace(stats, tokens=0)
    measurements.record_chat("t.gguf", "d.gguf", "llama.cpp", "draft", 3, empty, 0.0, None, path)  # not recorded

    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 3
    auto = lines[1]
    assert auto["kind"] == "chat" and auto["speedup"] is None  # nothing ran beside it: no speedup claimed
    assert (auto["method"], auto["k"], auto["tokens"], auto["tok_per_s"], auto["acceptance"]) == ("auto", 4, 12, 24.0, 0.7)
    assert auto["methods"] == {
        "draft": {"passes": 2, "drafted": 6, "accepted": 3, "tokens": 5, "acceptance": 0.5},
        "ngram": {"passes": 1, "drafted": 4, "accepted": 4, "tokens": 5, "acceptance": 1.0},
        "none": {"passes": 1, "drafted": 0, "accepted": 0, "tokens": 1, "acceptance": None}}
    assert lines[2]["draft"] is None and "methods" not in lines[2]  # an n-gram reply is not the draft file's

    records = measurements.read(path)
    assert len(records) == 3
    # an older reader (a numeric speedup) skips chat lines; pairing's speedups never count them
    assert [r for r in records if isinstance(r.get("speedup"), (int, float))] == records[:1]
    best = measurements.measured_for("t.gguf", "d.gguf", "draft", records)
    assert (best.k, best.runs, best.speedup) == (3, 1, 1.2)
    assert measurements.measured_for("t.gguf", "d.gguf", "auto", records) is None
    chat = measurements.chat_measured_for("t.gguf", "d.gguf", "auto", records)
    assert (chat.replies, chat.tokens, chat.tok_per_s, chat.acceptance) == (1, 12, 24.0, 0.7)
    assert measurements.chat_measured_for("t.gguf", "d.gguf", "ngram", records).replies == 1


def test_chat_replies_in_the_app_and_the_terminal_are_recorded(demo_family, monkeypatch):
    """A real chat on the demo pair: the app's session (fixed draft, then auto) and the terminal chat.
    Property of the shipped small family relied on: the demo draft has some token accepted in the fixed-
    draft reply."""
    import threading

    from specdesk.app.runtime import session
    from specdesk.app.main import main
    from specdesk.app.runtime.backend import ChatSettings, chat_turn
    from specdesk.engines.types import SamplingParams, SpecConfig

    target, draft = demo_family["target_gguf"], demo_family["draft_gguf"]
    app = session.Session()
    try:
        app.load(target, draft, threads=1)
        messages = [{"role": "user", "content": "def f(x):"}]
        seen = []
        reply = chat_turn(app, list(messages), ChatSettings(SpecConfig(method="draft", k=3, draft_path=draft),
                                                            SamplingParams(), 12), threading.Event(), seen.append)
        assert len(seen) == reply.result.stats.passes  # the caller still gets every event
        auto = chat_turn(app, list(messages), ChatSettings(SpecConfig(method="auto", k=4, draft_path=draft),
                                                           SamplingParams(), 24), threading.Event())
    finally:
        app.close()
    fixed, chosen = measurements.read()
    stats = reply.result.stats
    assert (fixed["kind"], fixed["method"], fixed["k"], fixed["speedup"]) == ("chat", "draft", 3, None)
    assert fixed["target"] == measurements._real(target) and fixed["draft"] == measurements._real(draft)
    assert fixed["tokens"] == stats.tokens == 12 and fixed["acceptance"] == round(stats.acceptance_rate, 4) > 0
    assert fixed["tok_per_s"] == round(stats.tok_per_s, 3) > 0 and fixed["engine"] == "llama.cpp"
    assert chosen["method"] == "auto" and chosen["tokens"] == auto.result.stats.tokens
    assert sum(c["passes"] for c in chosen["methods"].values()) == auto.result.stats.passes
    assert sum(c["drafted"] for c in chosen["methods"].values()) == auto.result.stats.drafted
    assert measurements.measured_for(target, draft) is None  # a chat measured no speedup

    answers = iter(["def g(y):", None])
    monkeypatch.setattr("specdesk.app.main.next_user_line", lambda: next(answers))
    assert main(["chat", "--target", target, "--draft", draft, "--method", "draft", "--k", "2",
                 "--max-tokens", "8", "--threads", "1"]) == 0
    terminal = measurements.read()[-1]
    assert (terminal["kind"], terminal["method"], terminal["k"], terminal["tokens"]) == ("chat", "draft", 2, 8)
    assert measurements.chat_measured_for(target, draft, "draft").replies == 2


def test_pairing_takes_the_median_of_every_run_and_says_how_many(tmp_path):
    path = tmp_path / "m.jsonl"
    # one compare of three runs, one of a single run (an older record), at the same k
    measurements.record("t.gguf", "d.gguf", "llama.cpp", "draft", 3, 1.5, 0.7, 96, 0.0, path,
                        values=(1.4, 1.5, 1.6))
    measurements.record("t.gguf", "d.gguf", "llama.cpp", "draft", 3, 10.2, 0.7, 96, 0.0, path)
    [line, _] = measurements.read(path)
    assert (line["runs"], line["spread"], line["values"]) == (3, 0.1, [1.4, 1.5, 1.6])
    measured = measurements.measured_for("t.gguf", "d.gguf", "draft", measurements.read(path))
    assert (measured.k, measured.runs) == (3, 4)
    assert measured.speedup == pytest.approx(1.55)  # the one wild run does not carry the mean away
    # said as the runs' range, which a wild run cannot make read larger than the figure itself
    assert measured.measure.ranged() == "1.55x (1.40–10.20 over 4 runs)"
