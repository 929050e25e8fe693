"""`specdesk compare` on a model with a chat template (the zoo's qwen2: a real tokenizer and the
Qwen2.5 template): prompts go through the template by default, as in the app's Compare tab,
`--no-chat` sends raw text; a run too short to time is said, and its "identical" says how
little was compared; the table's figures are the medians the headline divides."""

from __future__ import annotations

import json
import re

import pytest

from specdesk.app.main import main


@pytest.fixture(scope="module")
def qwen() -> dict[str, str]:
    from benchmarks import zoo

    return zoo.build("qwen2", "F16", small=True)


def compare(capsys, target: str, *extra: str) -> tuple[dict, str]:
    code = main(["compare", "--target", target, "--method", "ngram", "--threads", "1", "--prompt", "Name a prime.",
                 "--json", "-", *extra])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out), captured.err


def test_prompts_go_through_the_chat_template_unless_no_chat(capsys, qwen):
    chat, said = compare(capsys, qwen["target_gguf"], "--max-tokens", "8")
    assert chat["chat_template"] is True and "went through the model's chat template" in said
    raw, said = compare(capsys, qwen["target_gguf"], "--max-tokens", "8", "--no-chat")
    assert raw["chat_template"] is False and "raw text to continue" in said


def test_a_run_too_short_to_time_is_said(capsys, qwen):
    code = main(["compare", "--target", qwen["target_gguf"], "--method", "ngram", "--threads", "1",
                 "--prompt", "Name a prime.", "--max-tokens", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "warning: each run generated 1 token: too few to measure a speedup" in out
    assert "identical outputs: yes (1 token)" in out
    speedup = re.search(r"speedup ([\d.]+)x", out)
    rates = re.findall(r"^(?:baseline|speculative)\s+\d+\s+([\d.]+)", out, re.M)
    assert speedup and len(rates) == 2  # the headline is the speculative median over the baseline's
    assert float(speedup[1]) == pytest.approx(float(rates[1]) / float(rates[0]), rel=0.02, abs=0.01)
