"""llama.cpp's native drafters (MTP, DFlash, EAGLE-3) driven from SpecDesk on the small demo family:
symbol binding, GGUF export, losslessness, and the errors a user can act on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specdesk.app.runtime.compare import load_prompts
from specdesk.app.demo.export_native_gguf import build_native, export_dflash, initial_dflash_folder
from specdesk.app.storage.paths import assets_dir
from specdesk.engines.llama.binding import GgufContext, GgufModel, llama_lib
from specdesk.engines.llama.engine import LlamaEngine
from specdesk.engines.llama.ext import SYMBOLS, Ext, available_methods
from specdesk.engines.types import SamplingParams, SpecConfig, SpecDeskError

from llama_helpers import copy_gguf, generate_tokens
from sampling_stats import assert_follows_plain_sampling, gguf_exact

PROMPTS = load_prompts(assets_dir() / "prompts" / "code.jsonl")
METHODS = ["mtp", "dflash", "eagle3"]


@pytest.fixture(scope="module")
def native(demo_family, demo_cache_dir):
    """mtp_gguf (the target as glm4moe with one NextN layer), dflash_gguf, eagle3_gguf."""
    return build_native(demo_family, demo_cache_dir / "native")


# One thread: these models are tiny, and a two-thread pool on a loaded two-core machine
# spends far longer waking up than computing.
@pytest.fixture(scope="module")
def mtp_engine(native):
    engine = LlamaEngine(native["mtp_gguf"], n_ctx=256, n_threads=1)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def dflash_engine(demo_family):
    engine = LlamaEngine(demo_family["target_gguf"], n_ctx=256, n_threads=1)
    yield engine
    engine.close()


def _spec(method: str, native: dict, k: int) -> SpecConfig:
    return SpecConfig(method=method, k=k, draft_path=native.get(f"{method}_gguf") if method != "mtp" else None)


def _engine(method, mtp_engine, dflash_engine):
    return mtp_engine if method == "mtp" else dflash_engine



# --- binding -----------------------------------------------------------------------------
def test_every_hidden_state_symbol_resolves_in_the_pinned_libllama(dflash_engine):
    assert not any((reason or "").startswith("disabled") for reason in dflash_engine.method_availability().values())
    assert available_methods() == {"mtp": [], "dflash": [], "eagle3": []}


def test_a_missing_symbol_disables_its_method_with_a_clear_message():
    lib = llama_lib().llama_cpp._lib
    renamed = dict(SYMBOLS)
    mangled, restype, argtypes = renamed["llama_get_embeddings_nextn_ith"]
    renamed["llama_get_embeddings_nextn_ith"] = (mangled + "_gone", restype, argtypes)
    resolved = Ext(lib, renamed)
    assert resolved.missing == ["llama_get_embeddings_nextn_ith"]
    assert resolved.unavailable("dflash") == []
    resolved.require("dflash")
    with pytest.raises(SpecDeskError, match="method 'mtp' is disabled: .*llama_get_embeddings_nextn_ith"):
        resolved.require("mtp")


def test_layer_inputs_read_through_the_bound_symbols_are_the_layer_inputs(demo_family):
    """Layer 0's input is the token embedding row, exactly (llama.cpp keeps it in F32)."""
    from gguf import GGUFReader

    model = GgufModel(demo_family["target_gguf"])
    ctx = GgufContext(model, 64, 1)
    from specdesk.engines.llama.ext import ext, rows

    bound = ext()
    bound.llama_set_embeddings_layer_inp(ctx._ctx, 0, True)
    tokens = model.tokenize(PROMPTS[0])[:8]
    ctx.decode(tokens, all_logits=False)
    got = rows(bound.llama_get_embeddings_layer_inp(ctx._ctx, 0), len(tokens), model.n_embd)
    embedding = next(t for t in GGUFReader(demo_family["target_gguf"]).tensors if t.name == "token_embd.weight")
    table = np.asarray(embedding.data, dtype=np.float32).reshape(-1, model.n_embd)
    np.testing.assert_allclose(got, table[tokens], rtol=0, atol=1e-6)
    ctx.close(), model.close()


# --- export ------------------------------------------------------------------------------
def test_mtp_export_computes_the_same_target(demo_family, native):
    """The glm4moe trunk with all-dense layers is the llama target: same logits."""
    plain, with_mtp = GgufModel(demo_family["target_gguf"]), GgufModel(native["mtp_gguf"], load_mtp=True)
    assert plain._lib.llama_model_n_layer_nextn(with_mtp._model) == 1
    tokens = plain.tokenize(PROMPTS[3])
    a, b = GgufContext(plain, 128, 1), GgufContext(with_mtp, 128, 1)
    np.testing.assert_allclose(a.decode(tokens), b.decode(tokens), rtol=0, atol=1e-3)
    a.close(), b.close(), plain.close(), with_mtp.close()


# --- losslessness ------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("k", [1, 3, 7])
def test_greedy_native_method_equals_baseline(mtp_engine, dflash_engine, native, method, k):
    """Property of the shipped small family relied on: each native drafter has some draft token accepted
    over these prompts (identical weights on every machine: assets/demo-small)."""
    engine = _engine(method, mtp_engine, dflash_engine)
    drafted = accepted = 0
    for prompt in PROMPTS:
        tokens = engine.tokenize(prompt)
        baseline = generate_tokens(engine, tokens, SpecConfig(), max_tokens=40)
        speculative = generate_tokens(engine, tokens, _spec(method, native, k), max_tokens=40)
        assert speculative == baseline, f"{method} k={k} diverged on prompt {prompt[:40]!r}"
        stats = engine.last_proposer.stats()
        drafted, accepted = drafted + stats["drafted"], accepted + stats["accepted"]
    assert drafted > 0 and accepted > 0, f"{method}: {accepted} of {drafted} drafts accepted, the test proved nothing"


@pytest.mark.parametrize("method", METHODS)
def test_a_prompt_prefilled_in_chunks_drafts_what_one_chunk_drafts(mtp_engine, dflash_engine, native, method,
                                                                    monkeypatch):
    """llama.cpp holds one decode's hidden states: a prompt longer than a batch reaches the
    drafter chunk by chunk, and the drafter ends up with the same rows as from one batch.
    Property checked: every draft, token for token, is the same (drafts are computed from
    those rows), whatever the drafter's acceptance on these weights."""
    from specdesk.engines.llama.ext import HiddenStateProposer

    drafts: list[tuple[int, tuple[int, ...]]] = []
    propose = HiddenStateProposer.propose

    def recorded(self, context, k):
        draft = propose(self, context, k)
        drafts.append((len(context), draft.tokens))
        return draft

    monkeypatch.setattr(HiddenStateProposer, "propose", recorded)
    engine = _engine(method, mtp_engine, dflash_engine)
    chunked = LlamaEngine(engine.target.path, n_ctx=256, n_threads=1, n_batch=16)
    try:
        prompt = engine.tokenize(PROMPTS[5] + PROMPTS[3] + PROMPTS[0])
        assert len(prompt) > 3 * 16
        runs = []
        for eng in (engine, chunked):
            drafts.clear()
            tokens = generate_tokens(eng, prompt, _spec(method, native, 4), max_tokens=32)
            stats = eng.last_proposer.stats()
            runs.append((tokens, list(drafts), stats["drafted"], stats["accepted"]))
        assert runs[0][2] > 0 and any(tokens for _, tokens in runs[0][1])
        assert runs[0] == runs[1]
    finally:
        chunked.close()


def test_the_mtp_draft_primed_in_the_catch_up_is_the_one_drafted_alone(mtp_engine, native, monkeypatch):
    """The MTP drafter computes its first draft row inside the catch-up decode; every draft, token
    for token, is the one it gives when that row is dropped and drafted in a decode of its own."""
    from specdesk.engines.llama.ext import HiddenStateProposer
    from specdesk.engines.llama.mtp import MtpDrafter

    drafts: list[tuple[int, ...]] = []
    propose, draft = HiddenStateProposer.propose, MtpDrafter.draft

    def recorded(self, context, k):
        result = propose(self, context, k)
        drafts.append(result.tokens)
        return result

    primed_used = []

    def alone(self, context, k, p_min=0.0):
        primed_used.append(self.primed is not None)
        self._drop_primed()
        return draft(self, context, k, p_min)

    monkeypatch.setattr(HiddenStateProposer, "propose", recorded)
    prompt = mtp_engine.tokenize(PROMPTS[1] + PROMPTS[4])
    runs = []
    for primed in (True, False):
        if not primed:
            monkeypatch.setattr(MtpDrafter, "draft", alone)
        drafts.clear()
        tokens = generate_tokens(mtp_engine, prompt, _spec("mtp", native, 3), max_tokens=40)
        runs.append((tokens, list(drafts)))
    assert runs[0] == runs[1]
    assert sum(len(d) for d in runs[0][1]) > 0
    # every draft after a target pass had been primed (the first follows a prompt already cached, so no catch-up)
    assert len(primed_used) > 3 and all(primed_used[1:])


def test_the_mtp_row_a_draft_started_from_is_not_computed_again(mtp_engine, native, monkeypatch):
    """The row a draft starts from reads only the target's rows, so the catch-up after the pass
    keeps it: every draft, token for token, is the one drafted when the catch-up writes it again,
    with one row fewer fed to the MTP context per catch-up."""
    from specdesk.engines.llama.ext import HiddenStateProposer, NativeContext
    from specdesk.engines.llama.mtp import MtpDrafter

    drafts: list[tuple[int, ...]] = []
    fed: list[int] = []
    propose, process, keep = HiddenStateProposer.propose, NativeContext.process, MtpDrafter._keep_first_row

    def recorded(self, context, k):
        result = propose(self, context, k)
        drafts.append(result.tokens)
        return result

    def counted(self, entries, encode=False):
        if drafts:  # rows fed after the first draft: the drafts and the catch-ups (not the prompt's)
            fed.append(len(entries))
        return process(self, entries, encode)

    monkeypatch.setattr(HiddenStateProposer, "propose", recorded)
    monkeypatch.setattr(NativeContext, "process", counted)
    prompt = mtp_engine.tokenize(PROMPTS[2] + PROMPTS[0])
    runs = []
    for kept in (True, False):
        monkeypatch.setattr(MtpDrafter, "_keep_first_row", keep if kept else (lambda self, start, token: 0))
        mtp_engine.reset_chat()  # each run prefills the prompt through the MTP context
        drafts.clear(), fed.clear()
        tokens = generate_tokens(mtp_engine, prompt, _spec("mtp", native, 3), max_tokens=40)
        runs.append((tokens, list(drafts), sum(fed)))
    assert runs[0][:2] == runs[1][:2] and sum(len(d) for d in runs[0][1]) > 0
    assert runs[1][2] - runs[0][2] == len(runs[0][1])  # a row fewer in the catch-up after each draft


@pytest.mark.parametrize("method", METHODS)
def test_chat_turns_and_method_switches_stay_identical(mtp_engine, dflash_engine, native, method):
    """The drafter's cache follows the target's prefix reuse, also after turns without it."""
    engine = _engine(method, mtp_engine, dflash_engine)
    history = engine.tokenize(PROMPTS[5])
    for turn, spec in enumerate([_spec(method, native, 4), SpecConfig(), SpecConfig(method="ngram"),
                                 _spec(method, native, 5)]):
        reference = generate_tokens(engine, history, SpecConfig(), max_tokens=24)
        assert generate_tokens(engine, history, spec, max_tokens=24) == reference, f"turn {turn}"
        history = history + reference + engine.tokenize("\n\n# next\ndef ", add_bos=False)


@pytest.mark.parametrize("method", METHODS)
def test_native_sampling_distribution_matches_plain_sampling(mtp_engine, dflash_engine, demo_family, native, method):
    """T=0.8, top-p 0.95: positions 0 and 1 follow plain sampling's exact distribution, with the
    drafter's top-1 token as a one-hot q (tests/sampling_stats.py: 2000 speculative runs, power
    against a 6% shift).
    Property of the shipped small family relied on: on this prompt the drafter gets at least 50 draft
    tokens accepted over the runs."""
    engine = _engine(method, mtp_engine, dflash_engine)
    sampling = SamplingParams(temperature=0.8, top_p=0.95)
    if method == "eagle3":  # where the seeded EAGLE-3 head agrees with the target often enough
        text = PROMPTS[0]
    else:
        text = "def f(a, b):\n    return g(a, b)\n\n\ndef h(x):\n    return g(x, x)\n\n\ndef k(y):\n    return g("
    prompt = engine.tokenize(text)
    exact = gguf_exact(native["mtp_gguf"] if method == "mtp" else demo_family["target_gguf"], prompt, sampling)
    assert_follows_plain_sampling(engine, exact, prompt, _spec(method, native, 4), sampling, label=method)


# --- errors ------------------------------------------------------------------------------
def test_mtp_on_a_gguf_without_nextn_layers_is_refused(dflash_engine):
    with pytest.raises(SpecDeskError, match="has no MTP \\(NextN\\) layers"):
        generate_tokens(dflash_engine, dflash_engine.tokenize(PROMPTS[0]), SpecConfig(method="mtp"), max_tokens=4)


def test_dflash_needs_a_drafter_path(dflash_engine):
    with pytest.raises(SpecDeskError, match="needs a DFlash drafter GGUF"):
        generate_tokens(dflash_engine, dflash_engine.tokenize(PROMPTS[0]), SpecConfig(method="dflash"), max_tokens=4)


def test_dflash_refuses_a_file_that_is_not_a_dflash_drafter(dflash_engine, demo_family):
    with pytest.raises(SpecDeskError, match="not a DFlash drafter \\(its architecture is 'llama'"):
        dflash_engine.load_native("dflash", demo_family["draft_gguf"])


def test_dflash_refuses_a_drafter_with_other_layer_ids(dflash_engine, native, tmp_path):
    bad = copy_gguf(native["dflash_gguf"], tmp_path / "layers.gguf", {"dflash.target_layers": [1, 9]})
    with pytest.raises(SpecDeskError, match="reads target layers \\[1, 9\\] .* different target"):
        dflash_engine.load_native("dflash", bad)


def test_dflash_refuses_a_drafter_with_another_hidden_size(dflash_engine, demo_family, tmp_path):
    """A drafter made for the (narrower) draft model of the family."""
    config, weights = initial_dflash_folder(Path(demo_family["draft_hf"]))
    bad = export_dflash(config, weights, Path(demo_family["draft_gguf"]), tmp_path / "narrow.gguf")
    with pytest.raises(SpecDeskError, match="hidden size .* different target"):
        dflash_engine.load_native("dflash", bad)


def test_dflash_refuses_a_target_without_layer_inputs(mtp_engine, native):
    with pytest.raises(SpecDeskError, match="cannot hand out layer inputs of a 'glm4moe' model"):
        mtp_engine.load_native("dflash", native["dflash_gguf"])


def test_eagle3_refuses_a_file_that_is_not_an_eagle3_drafter(dflash_engine, native):
    with pytest.raises(SpecDeskError, match="not an EAGLE-3 drafter \\(its architecture is 'dflash'"):
        dflash_engine.load_native("eagle3", native["dflash_gguf"])


@pytest.mark.parametrize("edit, message", [
    ({"eagle3.target_layers": [0, 1, 9]}, "reads target layers \\[0, 1, 9\\] .* different target"),
    ({"eagle3.target_hidden_size": 4096}, "hidden size 4096, .* different target"),
])
def test_eagle3_refuses_a_drafter_for_another_target(dflash_engine, native, tmp_path, edit, message):
    bad = copy_gguf(native["eagle3_gguf"], tmp_path / "bad.gguf", edit)
    with pytest.raises(SpecDeskError, match=message):
        dflash_engine.load_native("eagle3", bad)
