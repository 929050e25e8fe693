"""The real-model tier: SmolLM2-135M-Instruct (a Q4_1 GGUF, 49,152-token BPE vocabulary, ChatML),
a trained instruct model no one here made, fetched as a user fetches it (tests/conftest.py
`smollm2`). Its template and stop, a chat turn through the engine process, auto's cost probe
and what auto decides from it, and the identity verdict judged against the model's own
measured arithmetic noise, with a verifier broken on purpose still called a bug."""

from __future__ import annotations

import threading

import pytest
from verifier_mutants import BY_NAME, mutated_source

from specdesk.app.chat.prompting import chat_prompt
from specdesk.app.runtime.backend import ChatSettings, chat_turn
from specdesk.app.runtime.compare import NEAR_TIE_LOGIT_GAP, Repeats, compare
from specdesk.app.runtime.session import Session
from specdesk.engines.llama.engine import LlamaEngine
from specdesk.engines.speculation import costs as cost_cache
from specdesk.engines.speculation.auto import AutoProposer
from specdesk.engines.speculation.chooser import cannot_pay, economics
from specdesk.engines.speculation.ngram import NgramPoolProposer, NgramProposer
from specdesk.engines.types import GenerationRequest, SamplingParams, SpecConfig

ONCE = Repeats(1, 1)  # the verdicts, not the speed, are under test
QUESTIONS = ["What is 2 + 2?", "Write a Python function that reverses a string.",
             "Give me three tips for better sleep."]


@pytest.fixture(scope="module")
def engine(smollm2):
    engine = LlamaEngine(smollm2, n_ctx=1024, n_threads=1)
    yield engine
    engine.close()


def test_its_chatml_template_renders_and_its_turn_ends_at_im_end(engine):
    messages = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": QUESTIONS[0]}]
    expected = ("<|im_start|>system\nYou are brief.<|im_end|>\n"
                "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n")
    assert chat_prompt(engine, messages) == engine.target.tokenize(expected, add_bos=False, parse_special=True)
    im_end = engine.target.tokenize("<|im_end|>", add_bos=False, parse_special=True)
    assert len(im_end) == 1 and engine.target.is_eog(im_end[0])


def test_a_chat_turn_through_the_engine_process_answers_and_stops(smollm2):
    session = Session()
    session.load(smollm2, None, threads=1)
    try:
        messages = [{"role": "user", "content": QUESTIONS[0]}]
        outcome = chat_turn(session, messages, ChatSettings(SpecConfig(method="ngram", k=3), SamplingParams(), 48),
                            threading.Event())
    finally:
        session.close()
    assert "4" in outcome.text  # "The answer to this classic math problem is 4."
    assert outcome.result.finish_reason == "eos" and "<|im_end|>" not in outcome.text
    assert messages[-1] == {"role": "assistant", "content": outcome.text}


def test_the_cost_probe_prices_its_passes_and_auto_acts_on_them(engine):
    """Whatever this CPU's kernels make of a pass over several tokens: where the probe's costs say
    no draft could pay even at an acceptance few methods reach, auto drafts nothing and says
    why with the measured ratio; where one could, it may draft. Both branches are forced below
    on literal costs (tests/test_auto.py); here the real probe decides."""
    proposers = {"ngram": NgramProposer(), "ngram-pool": NgramPoolProposer()}
    measured = cost_cache.measure_costs(engine, proposers, 4)
    assert len(measured.pass_s) == 5 and all(t > 0 for t in measured.pass_s)
    assert list(measured.pass_s) == sorted(measured.pass_s)  # more tokens never cost less
    assert economics(measured).startswith("a pass over 2 tokens costs ")
    verdict = cannot_pay(measured, list(proposers), 4)
    auto = AutoProposer(proposers, measured, 4, learn_costs=False)
    prompt = chat_prompt(engine, [{"role": "user", "content": QUESTIONS[1]}])
    auto.begin(prompt)
    auto.propose(prompt, 4)
    if verdict is not None:
        assert auto.choice.method == "none" and verdict in auto.choice.reason
        assert f"{measured.pass_s[1] / measured.pass_s[0]:.1f}x" in verdict
    else:
        assert "no draft can pay" not in auto.choice.reason


def test_auto_on_the_real_model_is_lossless(engine):
    prompt = tuple(chat_prompt(engine, [{"role": "user", "content": QUESTIONS[1]}]))
    from specdesk.app.runtime.generation import run_once

    runs = [run_once(engine, GenerationRequest(prompt, max_tokens=48, sampling=SamplingParams(), spec=spec))
            for spec in (SpecConfig(), SpecConfig(method="auto", k=4))]
    assert runs[1].tokens == runs[0].tokens or _explained(engine, prompt, runs)


def _explained(engine, prompt, runs) -> bool:
    """A greedy difference that the model's measured batched-against-single noise explains."""
    from specdesk.app.runtime.compare import PromptResult, classify_divergence, divergence_noise

    pair = PromptResult("", runs[0], runs[1])
    divergence = classify_divergence(engine, 0, list(prompt), pair, noise=divergence_noise(engine, list(prompt), pair))
    return divergence is not None and divergence.kind == "near_tie"


def test_a_divergence_within_the_measured_noise_is_the_arithmetic_and_beyond_it_a_bug(engine):
    """Whether llama.cpp's batched and single-token logits differ depends on the CPU's kernels
    (bit-identical for Q4_1 on some AVX-512 modules, up to 0.7 apart on others), so both sides
    of the rule are forced here with the noise given: the same divergence (a run that took the
    target's second choice where the top two are more than the fixed tolerance apart) is the
    arithmetic within a noise above its gap, and a bug below it."""
    from specdesk.app.runtime.compare import PromptResult, classify_divergence
    from specdesk.app.runtime.generation import RunResult, run_once
    from specdesk.engines.speculation.stats import StatsAccumulator

    def result_of_tokens(ids) -> RunResult:
        return RunResult(tuple(ids), "", StatsAccumulator(0).finish(), "length")

    tokens = chat_prompt(engine, [{"role": "user", "content": QUESTIONS[2]}])
    noise = engine.logit_noise(tokens)
    assert noise >= 0.0 and noise == pytest.approx(engine.logit_noise(tokens), rel=1e-6, abs=1e-9)
    baseline = run_once(engine, GenerationRequest(tuple(tokens), max_tokens=32, sampling=SamplingParams(),
                                                  spec=SpecConfig())).tokens
    at, top = next((i, top) for i in range(len(baseline))
                   if (top := engine.top_logits([*tokens, *baseline[:i]], 2))[0][1] - top[1][1] > NEAR_TIE_LOGIT_GAP)
    gap = top[0][1] - top[1][1]
    pair = PromptResult("", result_of_tokens(baseline), result_of_tokens([*baseline[:at], top[1][0]]))
    within = classify_divergence(engine, 0, tokens, pair, noise=gap * 1.5)
    beyond = classify_divergence(engine, 0, tokens, pair, noise=gap / 2)
    assert (within.kind, beyond.kind) == ("near_tie", "mismatch")
    assert "the arithmetic, not a bug" in within.describe() and f"{gap * 1.5:.3g}" in within.describe()
    assert "a mismatch, a bug" in beyond.describe()


def test_compare_calls_the_arithmetic_the_arithmetic_and_a_broken_verifier_a_bug(engine, monkeypatch):
    prompts = [f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n" for q in QUESTIONS]
    spec = SpecConfig(method="ngram-pool", k=4)

    def tokenize(text):
        return engine.target.tokenize(text, add_bos=False, parse_special=True)

    report = compare(engine, prompts, spec, SamplingParams(), 48, tokenize, warm=False, repeats=ONCE)
    assert all(d.kind == "near_tie" and d.noise is not None and d.logit_gap <= d.noise for d in report.divergences)
    assert all("not a bug" in d.describe() for d in report.divergences)

    import specdesk.engines.llama.engine as llama_engine

    path, source = mutated_source(BY_NAME["greedy-always-accept"])
    broken: dict = {"__name__": "specdesk.engines.speculation.verify", "__package__": "specdesk.engines.speculation"}
    exec(compile(source, path, "exec"), broken)
    monkeypatch.setattr(llama_engine, "verify", broken["verify"])
    report = compare(engine, prompts, spec, SamplingParams(), 48, tokenize, warm=False, repeats=ONCE)
    assert report.identical_outputs is False
    assert any(d.kind == "mismatch" and "a bug" in d.describe() for d in report.divergences)


def test_the_library_lists_it_by_its_name_not_its_training_runs(smollm2, monkeypatch, tmp_path):
    """Its file's general.name is a training run's ("Smollm2 135M 8k Lc100K Mix1 Ep2"); the
    library shows what the project fetched under its own name."""
    from pathlib import Path

    from specdesk.app.models.library import LibraryConfig, scan_library

    monkeypatch.setenv("SPECDESK_CACHE_DIR", str(Path(smollm2).parent.parent))
    config = LibraryConfig(hf_cache=tmp_path / "none", include_hf_cache=False, demo_root=tmp_path / "none",
                           include_apps=False)
    [entry] = [e for e in scan_library(config) if Path(e.path).name == Path(smollm2).name]
    assert entry.name == "SmolLM2 135M Instruct (Q4_1)" and entry.source == "specdesk"
