"""The application layer (app/runtime/session.py) without a window: engine choice, drafter detection,
demo resolution shared by the CLI and the app, the context rule, and a Session across loads."""

from __future__ import annotations

import argparse
import json
import threading

import pytest

from specdesk.app.runtime import session
from specdesk.app.runtime.backend import ChatSettings, chat_turn
from specdesk.app.storage.settings import DEMO, DEMO_DFLASH, DEMO_HF, DEMO_MTP
from specdesk.engines.types import SamplingParams, SpecConfig, SpecDeskError


def test_the_target_format_chooses_the_engine(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    assert session.engine_kind(str(tmp_path)) == "torch" and session.engine_kind(DEMO_HF) == "torch"
    assert session.engine_kind(str(gguf)) == "llama" and session.engine_kind(DEMO) == "llama"


@pytest.mark.parametrize("architectures, kind", [(["DFlashDraftModel"], "dflash"), (["LlamaForCausalLMEagle3"], "eagle3"),
                                                 (["LlamaForCausalLM"], "draft"), (None, "draft")])
def test_a_drafter_folder_is_known_by_its_architecture(tmp_path, architectures, kind):
    if architectures is not None:
        (tmp_path / "config.json").write_text(json.dumps({"architectures": architectures}))
    assert session.drafter_kind(str(tmp_path)) == kind


def test_a_draft_gguf_and_an_unreadable_file_are_draft_models(demo_family, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf")
    assert session.drafter_kind(demo_family["draft_gguf"]) == "draft"
    assert session.drafter_kind(str(broken)) == "draft"  # the engine's own load says what is wrong


def test_draft_fit_is_checked_for_gguf_drafts_of_a_gguf_target(tmp_path):
    folder = tmp_path / "hf-draft"
    folder.mkdir()
    choices = ["a.gguf", "", str(folder), DEMO]
    assert session.verdict_choices("target.gguf", choices) == ["a.gguf", DEMO]
    assert session.verdict_choices(str(tmp_path), choices) == []


def test_paths_that_are_not_demo_placeholders_are_kept_without_a_build():
    def progress(message: str) -> None:
        raise AssertionError(f"a build started: {message}")

    assert session.resolve_demo("t.gguf", "d.gguf", "small", progress) == ("t.gguf", "d.gguf")


@pytest.fixture
def demo_cache(demo_family, demo_cache_dir, monkeypatch):
    monkeypatch.setenv("SPECDESK_CACHE_DIR", str(demo_cache_dir))
    return demo_family


def test_the_cli_and_the_app_resolve_the_demo_family_alike(demo_cache):
    from specdesk.app.options import resolve_models

    def cli(engine: str, method: str):
        return resolve_models(argparse.Namespace(target=None, draft=None, engine=engine, method=method,
                                                 small_demo=True))

    quiet = lambda message: None  # noqa: E731
    assert cli("llama", "draft") == session.resolve_demo(DEMO, DEMO, "small", quiet) \
        == (demo_cache["target_gguf"], demo_cache["draft_gguf"])
    assert cli("torch", "draft") == session.resolve_demo(DEMO_HF, DEMO, "small", quiet) \
        == (demo_cache["target_hf"], demo_cache["draft_hf"])
    assert cli("torch", "dflash") == (demo_cache["target_hf"], demo_cache["dflash_hf"])
    # On llama.cpp the demo's native drafters are the exported GGUFs.
    from specdesk.app.demo.export_native_gguf import build_native

    native = build_native(demo_cache)
    assert session.resolve_demo(DEMO, DEMO_DFLASH, "small", quiet) == (demo_cache["target_gguf"], native["dflash_gguf"])
    assert session.resolve_demo(DEMO_MTP, None, "small", quiet) == (native["mtp_gguf"], None)


def test_auto_given_a_native_drafter_says_which_method_runs_it(demo_cache):
    """Method auto drafts with a draft model; a drafter made for one target (an EAGLE-3 or DFlash
    file or folder) is refused with the method that runs it, not loaded as a draft model (which
    failed as a context that could not be created)."""
    from specdesk.app.demo.export_native_gguf import build_native
    from specdesk.app.options import resolve_models

    def cli(engine: str, draft: str):
        return resolve_models(argparse.Namespace(target=demo_cache["target_gguf"] if engine == "llama"
                                                 else demo_cache["target_hf"], draft=draft, engine=engine,
                                                 method="auto", small_demo=True))

    native = build_native(demo_cache)
    for engine, drafter in (("llama", native["dflash_gguf"]), ("torch", demo_cache["dflash_hf"])):
        with pytest.raises(SpecDeskError, match="use --method dflash for this file") as refused:
            cli(engine, drafter)
        assert drafter in str(refused.value) and "a DFlash drafter" in str(refused.value)
    assert cli("llama", demo_cache["draft_gguf"]) == (demo_cache["target_gguf"], demo_cache["draft_gguf"])


def test_a_conversation_keeps_room_for_the_reply_up_to_half_the_context(local):
    turn = "word " * 40
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": turn} for i in range(9)]
    tokens, dropped = session.chat_tokens(local, messages, max_tokens=10**6)  # more than the context
    assert 0 < dropped < len(messages) and len(tokens) + local.n_ctx // 2 <= local.n_ctx
    small_tokens, small_dropped = session.chat_tokens(local, messages, max_tokens=8)
    assert small_dropped < dropped and len(small_tokens) + 8 <= local.n_ctx


def test_a_session_keeps_its_engine_and_a_refused_draft_keeps_the_previous_one(demo_family, tmp_path):
    """Property of the shipped small family relied on: the demo draft has some token accepted in a 12-token
    reply."""
    bad_draft = tmp_path / "bad.gguf"
    bad_draft.write_bytes(b"not a gguf")
    app = session.Session()
    try:
        first = app.load(demo_family["target_gguf"], demo_family["draft_gguf"], threads=1,
                         drafts=(demo_family["draft_gguf"],))
        engine = app.engine
        assert first.draft_error is None and first.info.draft_path == demo_family["draft_gguf"]
        assert "draft" in first.info.supported_methods and dict(first.info.draft_verdicts)[demo_family["draft_gguf"]] == ()
        again = app.load(demo_family["target_gguf"], str(bad_draft), threads=1)
        assert app.engine is engine  # the same target and context: the engine stays
        assert again.draft_error and again.info.draft_path == demo_family["draft_gguf"]
        spec = SpecConfig(method="draft", k=3, draft_path=app.draft_path)
        reply = chat_turn(app, [{"role": "user", "content": "def f(x):"}], ChatSettings(spec, SamplingParams(), 12),
                          threading.Event())
        assert reply.result.stats.tokens == 12 and reply.result.stats.accepted > 0
    finally:
        app.close()
    assert app.engine is None
    with pytest.raises(SpecDeskError, match="no model is loaded"):
        app.need_engine()


def test_auto_is_prepared_in_the_engine_process_before_its_first_reply(demo_family, tmp_path, monkeypatch):
    """The app measures auto's costs after a load, while the user types (Session.prepare, in the engine
    process): the cost file is written then, and the first auto reply measures nothing more."""
    monkeypatch.setenv("SPECDESK_CACHE_DIR", str(tmp_path / "cache"))
    app = session.Session()
    try:
        app.load(demo_family["target_gguf"], demo_family["draft_gguf"], threads=1)
        spec = SpecConfig(method="auto", k=3, draft_path=app.draft_path)
        costs = tmp_path / "cache" / "costs"
        assert not list(costs.glob("costs-*.json"))
        app.prepare(spec)
        written = sorted(costs.glob("costs-*.json"))
        assert len(written) == 1
        stamp = written[0].stat().st_mtime_ns
        app.prepare(spec)  # from memory: nothing is measured or written again
        assert written[0].stat().st_mtime_ns == stamp
        reply = chat_turn(app, [{"role": "user", "content": "def f(x):"}], ChatSettings(spec, SamplingParams(), 12),
                          threading.Event())
        assert reply.result.stats.tokens == 12
        assert sorted(costs.glob("costs-*.json")) == written  # the reply used the prepared costs' key
    finally:
        app.close()
