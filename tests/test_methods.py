"""The method table (engines/methods.py): the one place facts about a method live."""

from __future__ import annotations

import threading

import pytest

from specdesk.engines.methods import (METHODS, MethodInfo, drafter_for_config, method_info, method_names,
                                      needs_draft_model, proposing_methods, takes_drafter_file, uses_file)
from specdesk.engines.speculation.stats import ProposerCounters
from specdesk.engines.types import Draft, GenerationRequest, SpecConfig, SpecDeskError


def test_the_table_names_every_method_once_in_picker_order():
    assert method_names() == ("none", "auto", "ngram", "ngram-pool", "draft", "crossvocab", "mtp", "dflash", "eagle3")
    assert all(name == info.name for name, info in METHODS.items())


def test_an_unknown_name_gets_the_projects_error_with_the_known_ones():
    with pytest.raises(SpecDeskError, match="unknown method 'warp': choose one of none, auto, ngram"):
        method_info("warp")
    with pytest.raises(SpecDeskError, match="unknown method 'warp'"):
        SpecConfig(method="warp")


def test_what_each_method_takes():
    assert [m for m in method_names() if takes_drafter_file(m)] == ["dflash", "eagle3"]
    assert [m for m in method_names() if needs_draft_model(m)] == ["draft", "crossvocab"]
    assert [m for m in method_names() if uses_file(m)] == ["auto", "draft", "crossvocab", "dflash", "eagle3"]
    assert [m for m in method_names() if method_info(m).reads_hidden] == ["mtp", "dflash", "eagle3"]
    assert proposing_methods() == ("ngram", "ngram-pool", "draft", "crossvocab", "mtp", "dflash", "eagle3")
    assert method_info("eagle3").drafter == "an EAGLE-3 drafter"
    assert method_info("dflash").drafter == "a DFlash drafter"


def test_engines_filter_the_names():
    assert method_names("torch") == method_names("llama.cpp") == method_names()
    assert method_names("no such engine") == ()


@pytest.mark.parametrize("config, kind", [
    ({"architectures": ["DFlashDraftModel"]}, "dflash"),
    ({"architectures": ["Qwen3ForCausalLM"], "dflash_config": {}}, "dflash"),
    ({"architectures": ["Qwen3DSparkModel"], "markov_rank": 256}, "dflash"),
    ({"architectures": ["LlamaForCausalLMEagle3"]}, "eagle3"),
    ({"draft_vocab_size": 32000}, "eagle3"),
    ({"architectures": ["LlamaForCausalLM"]}, None),
    ({"architectures": "not a list"}, None),
])
def test_a_drafter_checkpoint_is_known_by_its_methods_config_keys(config, kind):
    assert drafter_for_config(config) == kind


def test_a_row_that_contradicts_itself_is_refused():
    with pytest.raises(ValueError, match="takes must be one of"):
        MethodInfo("x", "x", "", takes="a file")
    with pytest.raises(ValueError, match="needs its short name"):
        MethodInfo("x", "x", "", takes="drafter_file")


# --- adding a method: one row in the table, one proposer ---------------------------------------
class ScriptProposer:
    """Drafts the tokens of a script, position by position after the prompt: a method that needs
    no model, so its drafts (right or wrong) are fully known to the test."""

    def __init__(self, script: list[int]):
        self.script, self.start = script, 0
        self.counters = ProposerCounters()

    def begin(self, prompt) -> None:
        self.start = len(prompt)

    def propose(self, context, k: int) -> Draft:
        at = len(context) - self.start
        draft = tuple(self.script[at:at + k])
        self.counters.record_proposal(len(draft), 0.0)
        return Draft(tokens=draft)

    def accept(self, n_accepted: int, committed) -> None:
        self.counters.record_accepted(n_accepted)

    def stats(self) -> dict:
        return self.counters.as_dict()


SCRIPT = MethodInfo("script", "script (drafts a fixed text)", "Drafts the tokens of a script; needs no model.")


@pytest.fixture
def script_method(monkeypatch):
    """The one place a method is added: its row in the table and its proposer."""
    from specdesk.engines.speculation.proposers import SHARED_PROPOSERS

    scripts: list[list[int]] = [[]]
    monkeypatch.setitem(METHODS, SCRIPT.name, SCRIPT)
    monkeypatch.setitem(SHARED_PROPOSERS, SCRIPT.name, lambda engine, spec: ScriptProposer(scripts[0]))
    return scripts


def test_an_added_method_is_a_request_auto_may_choose(script_method):
    assert "script" in method_names() and "script" in proposing_methods()
    assert SpecConfig(method="script", k=3).method == "script"
    assert SpecConfig(method="auto", auto_methods=("script", "ngram")).auto_methods == ("script", "ngram")
    assert not uses_file("script") and not needs_draft_model("script")


def test_an_added_method_is_in_the_apps_picker_with_its_help(qtbot, script_method):
    from specdesk.app.storage.settings import Settings
    from specdesk.ui.controls import ControlsPanel

    panel = ControlsPanel(Settings())
    qtbot.addWidget(panel)
    index = panel.method_combo.findData("script")
    assert panel.method_combo.itemText(index) == "script (drafts a fixed text)"
    panel.set_supported_methods(("none", "script"), "llama.cpp")
    assert panel.method_combo.model().item(index).toolTip() == SCRIPT.help
    panel.method_combo.setCurrentIndex(index)
    assert panel.spec(draft_path="ignored.gguf") == SpecConfig(method="script", k=panel.k_spin.value())


def test_an_added_method_runs_on_the_engine_and_changes_no_token(script_method, demo_family):
    from specdesk.engines.llama.engine import LlamaEngine

    from llama_helpers import generate_tokens

    engine = LlamaEngine(demo_family["target_gguf"], n_ctx=256, n_threads=1)
    try:
        prompt = engine.tokenize("def fibonacci(n):")
        baseline = generate_tokens(engine, prompt, SpecConfig(), max_tokens=24, stop_at_eos=False)
        # the right text with every third token wrong: some drafts are kept, some refused
        script_method[0] = [t if i % 3 != 2 else (t + 1) % engine.target.n_vocab for i, t in enumerate(baseline)]
        request = GenerationRequest(tuple(prompt), max_tokens=24, spec=SpecConfig(method="script", k=4),
                                    stop_at_eos=False)
        events = list(engine.generate(request, threading.Event()))
    finally:
        engine.close()
    assert [t for e in events for t in e.tokens] == baseline
    drafted, accepted = sum(e.drafted for e in events), sum(e.accepted for e in events)
    assert 0 < accepted < drafted
