"""A draft model stored in floats runs on the CPU from a Q8_0 copy (engines/llama/draft_copy.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")

from specdesk.engines.llama.binding import gguf_header  # noqa: E402
from specdesk.engines.llama.draft_copy import float_share, q8_copy, wants_copy  # noqa: E402
from specdesk.engines.llama.engine import LlamaEngine  # noqa: E402
from specdesk.engines.types import GenerationRequest, SamplingParams, SpecConfig, SpecDeskError  # noqa: E402


@pytest.fixture(scope="module")
def full_family(demo_cache_dir) -> dict[str, str]:
    """The shipped demo family (its draft 256 wide: rows Q8_0's blocks divide; the small
    family's 48-wide rows they do not)."""
    from specdesk.app.demo.install import build_family

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECDESK_CACHE_DIR", str(demo_cache_dir))
        return build_family()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECDESK_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "draft-copies"


def greedy_tokens(engine, spec: SpecConfig, prompt: list[int], n: int = 24) -> tuple[list[int], int]:
    request = GenerationRequest(tuple(prompt), n, SamplingParams(temperature=0.0), spec)
    tokens, accepted = [], 0
    for event in engine.generate(request, threading.Event()):
        tokens.extend(event.tokens)
        accepted += event.accepted
    return tokens, accepted


def test_a_float_draft_on_the_cpu_runs_from_a_q8_0_copy_made_once(full_family, cache):
    draft = full_family["draft_gguf"]
    assert 0.8 < float_share(gguf_header(draft)) < 0.9 and wants_copy(gguf_header(draft))  # FFN 688 wide: its down
    # projection's rows are not a multiple of 32, and stay F16
    shares = []
    engine = LlamaEngine(full_family["target_gguf"], n_threads=1)
    try:
        context = engine.load_draft(draft, progress=shares.append)
        copy = Path(context.model.path)
        assert copy.parent == cache and copy.name.endswith("-Q8_0.gguf")
        header = gguf_header(copy)
        assert float_share(header) == 0.0 and not wants_copy(header)  # every matrix Q8_0 holds is Q8_0
        assert shares[0] < 0.5 < shares[-1] == 1.0 and 0.5 in shares and shares == sorted(shares)  # copy, then load
        assert engine.notes == [] and engine.placement_key.endswith("draft-weights=q8")
        prompt = engine.tokenize("def add(a, b):\n    return")
        plain, _ = greedy_tokens(engine, SpecConfig(), prompt)
        drafted, accepted = greedy_tokens(engine, SpecConfig(method="draft", k=3, draft_path=draft), prompt)
        assert drafted == plain and accepted > 0
    finally:
        engine.close()
    made = copy.stat().st_mtime_ns
    assert q8_copy(draft) == (copy, False)  # the next load finds it
    assert copy.stat().st_mtime_ns == made


def test_the_file_itself_when_asked_already_quantized_or_in_rows_q8_0_cannot_hold(full_family, demo_family, cache):
    draft = full_family["draft_gguf"]
    engine = LlamaEngine(full_family["target_gguf"], n_threads=1, draft_weights="file")
    try:
        assert Path(engine.load_draft(draft).model.path) == Path(draft)
        assert not cache.exists()
    finally:
        engine.close()
    copy, made = q8_copy(draft)
    assert made
    engine = LlamaEngine(full_family["target_gguf"], n_threads=1)
    try:  # a quantized draft runs as it is: no copy of the copy
        assert Path(engine.load_draft(copy).model.path) == copy
        assert sorted(p.name for p in cache.iterdir()) == [copy.name]
    finally:
        engine.close()
    small = demo_family["draft_gguf"]  # 48 wide: Q8_0 would hold its FFN's down projection only
    assert not wants_copy(gguf_header(small))
    engine = LlamaEngine(demo_family["target_gguf"], n_threads=1)
    try:
        assert Path(engine.load_draft(small).model.path) == Path(small)
    finally:
        engine.close()
    with pytest.raises(SpecDeskError, match="draft weights 'q4' is not one of q8, file"):
        LlamaEngine(full_family["target_gguf"], n_threads=1, draft_weights="q4")


def test_a_copy_that_cannot_be_made_leaves_the_draft_on_its_own_file(full_family, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("SPECDESK_CACHE_DIR", str(blocker))
    draft = full_family["draft_gguf"]
    engine = LlamaEngine(full_family["target_gguf"], n_threads=1)
    try:
        context = engine.load_draft(draft)
        assert Path(context.model.path) == Path(draft)
        assert len(engine.notes) == 1
        assert engine.notes[0].startswith(f"{draft}: running the draft model from its own file: its Q8_0 copy could "
                                          "not be made (")
        prompt = engine.tokenize("for i in range(")
        plain, _ = greedy_tokens(engine, SpecConfig(), prompt, 12)
        assert greedy_tokens(engine, SpecConfig(method="draft", k=2, draft_path=draft), prompt, 12)[0] == plain
    finally:
        engine.close()
    assert blocker.read_text() == "a file where the cache folder would be"  # nothing saved is touched
