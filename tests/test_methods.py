"""The method table (engines/methods.py): the one place facts about a method live."""

from __future__ import annotations

import pytest

from specdesk.engines.methods import (METHODS, MethodInfo, drafter_for_config, method_info, method_names,
                                      needs_draft_model, proposing_methods, takes_drafter_file, uses_file)
from specdesk.engines.types import SpecConfig, SpecDeskError


def test_the_table_names_every_method_once_in_picker_order():
    assert method_names() == ("none", "auto", "ngram", "ngram-pool", "draft", "mtp", "dflash", "eagle3")
    assert all(name == info.name for name, info in METHODS.items())


def test_an_unknown_name_gets_the_projects_error_with_the_known_ones():
    with pytest.raises(SpecDeskError, match="unknown method 'warp': choose one of none, auto, ngram"):
        method_info("warp")
    with pytest.raises(SpecDeskError, match="unknown method 'warp'"):
        SpecConfig(method="warp")


def test_what_each_method_takes():
    assert [m for m in method_names() if takes_drafter_file(m)] == ["dflash", "eagle3"]
    assert [m for m in method_names() if needs_draft_model(m)] == ["draft"]
    assert [m for m in method_names() if uses_file(m)] == ["auto", "draft", "dflash", "eagle3"]
    assert [m for m in method_names() if method_info(m).reads_hidden] == ["mtp", "dflash", "eagle3"]
    assert proposing_methods() == ("ngram", "ngram-pool", "draft", "mtp", "dflash", "eagle3")
    assert method_info("eagle3").drafter == "an EAGLE-3 drafter"
    assert method_info("dflash").drafter == "a DFlash drafter"


def test_engines_filter_the_names():
    assert method_names("torch") == method_names("llama.cpp") == method_names()
    assert method_names("no such engine") == ()


@pytest.mark.parametrize("config, kind", [
    ({"architectures": ["DFlashDraftModel"]}, "dflash"),
    ({"architectures": ["Qwen3ForCausalLM"], "dflash_config": {}}, "dflash"),
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
