""""Use this model" picks the draft that goes with a target, and the first-run card's suggestion
fits the machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdesk.app.models import pairing
from specdesk.app.models.choose import choose_for, draft_misfit
from specdesk.app.models.curated import load_pairs, suggest
from specdesk.app.models.library import read_model
from specdesk.engines.types import SpecDeskError


@pytest.fixture(scope="module")
def zoo_pairs():
    from benchmarks import zoo

    return zoo.build("qwen2", "F16", small=True), zoo.build("llama-bpe", "Q4_K_M", small=True)


@pytest.fixture(autouse=True)
def _plenty_of_memory(monkeypatch):
    monkeypatch.setattr(pairing, "available_memory", lambda: pairing.MemoryInfo(64 << 30, 64 << 30))


def test_a_new_target_gets_its_familys_draft_and_drops_the_previous_targets(zoo_pairs, demo_family):
    qwen, llama = zoo_pairs
    entries = [read_model(p) for p in (demo_family["target_gguf"], demo_family["draft_gguf"], qwen["target_gguf"],
                                       qwen["draft_gguf"], llama["draft_gguf"])]
    choice = choose_for(demo_family["target_gguf"], entries, current_draft=qwen["draft_gguf"], records=[])
    assert choice.draft == demo_family["draft_gguf"]
    assert "x expected at k = " in choice.why
    # the current draft stays while it fits
    kept = choose_for(demo_family["target_gguf"], entries, current_draft=demo_family["draft_gguf"], records=[])
    assert kept.draft == demo_family["draft_gguf"] and "kept" in kept.why
    # a compatible draft as large as its target is not expected to pay: none, and why
    same_size = choose_for(qwen["target_gguf"], entries, current_draft=demo_family["draft_gguf"], records=[])
    assert same_size.draft is None and "no draft here is expected to pay" in same_size.why


def test_a_target_with_no_fitting_draft_gets_none_and_says_why(zoo_pairs, demo_family):
    qwen, llama = zoo_pairs
    entries = [read_model(p) for p in (llama["target_gguf"], qwen["draft_gguf"], demo_family["draft_gguf"])]
    choice = choose_for(llama["target_gguf"], entries, current_draft=qwen["draft_gguf"], records=[])
    assert choice.draft is None
    assert "no draft here fits its vocabulary" in choice.why


def test_use_as_draft_names_the_misfit(zoo_pairs):
    qwen, llama = zoo_pairs
    entries = [read_model(p) for p in (qwen["target_gguf"], qwen["draft_gguf"], llama["draft_gguf"])]
    assert draft_misfit(qwen["target_gguf"], qwen["draft_gguf"], entries) is None
    why = draft_misfit(qwen["target_gguf"], llama["draft_gguf"], entries)
    assert why and "vocab size 151936 vs 128256" in why


def test_a_target_that_cannot_load_is_refused_with_its_file(tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 12)
    with pytest.raises(SpecDeskError, match="broken.gguf"):
        choose_for(str(broken), [], records=[])


def test_the_suggestion_is_the_largest_pair_that_fits():
    pairs = load_pairs()
    assert len(pairs) >= 3
    for p in pairs:  # a target and a draft of one family, each a GGUF file on the hub
        assert p.target.file.endswith(".gguf") and p.draft.file.endswith(".gguf")
        assert p.draft.bytes < p.target.bytes / 2
    by_size = sorted(pairs, key=lambda p: p.total_bytes)
    assert suggest(by_size[0].total_bytes - 1, pairs) is None
    assert suggest(by_size[0].total_bytes, pairs) == by_size[0]
    assert suggest(by_size[-1].total_bytes, pairs) == max(pairs, key=lambda p: p.target.bytes)
    middle = by_size[len(by_size) // 2]
    chosen = suggest(middle.total_bytes, pairs)
    assert chosen.total_bytes <= middle.total_bytes and chosen.target.bytes >= middle.target.bytes


def test_a_broken_suggestion_list_names_its_file(tmp_path):
    bad = tmp_path / "curated.json"
    bad.write_text(json.dumps({"pairs": [{"name": "x"}]}))
    with pytest.raises(SpecDeskError, match="curated.json"):
        load_pairs(bad)


def test_a_drafter_trained_here_is_chosen_only_when_it_paid(demo_family, tmp_path):
    """train-drafter's provenance.json beside a drafter decides: one that did not beat what the
    target had is listed with its verdict and kept, never the default; one that did is chosen
    first, with its measured speedup."""
    import shutil

    out = tmp_path / "target-hf-dflash-trained"
    drafter = out / "dflash"
    shutil.copytree(demo_family["dflash_hf"], drafter)
    target = read_model(demo_family["target_hf"])
    entries = [target, read_model(str(drafter))]
    assert choose_for(target.path, entries, records=[]).draft == str(drafter)  # no provenance: made for it

    def trained(adopted: bool, reason: str) -> None:
        (out / "provenance.json").write_text(json.dumps({
            "method": "dflash", "drafter": str(drafter), "gguf": None, "trained_here": True,
            "trained_at": "2026-12-02T07:00:00+00:00", "speedup": 1.62 if adopted else 0.47,
            "adopted": adopted, "reason": reason}))

    trained(False, "trained DFlash: 0.47x, below n-gram 1.24x")
    native = [d for d in pairing.native_drafters(target, entries) if d.get("path") == str(drafter)]
    assert native and native[0]["trained"]["adopted"] is False
    assert "trained here 2026-12-02, kept, not adopted: trained DFlash: 0.47x, below n-gram 1.24x" in native[0]["why"]
    choice = choose_for(target.path, entries, records=[])
    assert choice.draft is None
    assert "the dflash drafter trained here is kept, not used (trained DFlash: 0.47x, below n-gram 1.24x)" in choice.why

    trained(True, "trained DFlash: 1.62x, above n-gram 1.24x")
    choice = choose_for(target.path, entries, records=[])
    assert choice.draft == str(drafter) and "trained here (1.62x measured)" in choice.why

    (out / "provenance.json").write_text("{not json")  # damaged: a drafter like any other
    assert choose_for(target.path, entries, records=[]).draft == str(drafter)
