"""Cross-vocabulary drafting (engines/speculation/crossvocab.py, retokenize.py) on real tokenizers:
the zoo's (qwen2, llama-bpe, phi-3, command-r, gemma-4: benchmarks/zoo.py), the demo family's and
SmolLM2-135M-Instruct's.

Greedy output must be the target's own, token for token, whatever the draft proposes; sampling
must follow plain sampling's exact distribution (tests/sampling_stats.py), and the same harness
must catch a verifier that ignores the draft's q.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks import zoo
from specdesk.app.runtime.compare import load_prompts
from specdesk.app.storage.paths import assets_dir
from specdesk.engines.llama.binding import GgufModel
from specdesk.engines.llama.engine import LlamaEngine
from specdesk.engines.methods import METHODS
from specdesk.engines.speculation.crossvocab import CrossVocabDrafting
from specdesk.engines.speculation.retokenize import DraftText, continuation, encode, intersection
from specdesk.engines.speculation.verify import VerifyResult, sample, sampling_probs
from specdesk.engines.types import SamplingParams, SpecConfig, SpecDeskError

from llama_helpers import generate_tokens, rewrite_gguf
from sampling_stats import assert_follows_plain_sampling, gguf_exact

# The method whose proposer drafts across vocabularies, read from the table (its row names the class).
METHOD = next(name for name, info in METHODS.items() if CrossVocabDrafting.engine_class in repr(info.proposer))
PROMPTS = load_prompts(assets_dir() / "prompts" / "code.jsonl")
TEXTS = ["Hello world, héllo wörld! 你好，世界 🙂🙂 — ok", "def f(x):\n    return x  *  2\n\n\n# done",
         "  leading spaces\tand\ttabs\r\n", "numbers 1234567 and 3.14159, emoji 👍🏽 end"]


@pytest.fixture(scope="module")
def zoo_paths():
    """family -> the small zoo's paths (built once, cached on disk)."""
    return {name: zoo.build(name, "F16", small=True) for name in sorted(zoo.FAMILIES)}


@pytest.fixture(scope="module")
def vocabs(zoo_paths):
    """family -> a loaded zoo draft model (its real tokenizer)."""
    models = {name: GgufModel(paths["draft_gguf"]) for name, paths in zoo_paths.items()}
    yield models
    for model in models.values():
        model.close()


# --- the retokenizing helpers, on real tokenizers -------------------------------------------

@pytest.mark.parametrize("text", TEXTS)
def test_encodings_spell_the_text_with_true_offsets(vocabs, text):
    data = text.encode()
    for name, model in vocabs.items():
        encoded = encode(model, data)
        assert encoded is not None, name
        assert encoded.ends[-1] == len(data), name
        spelled = b"".join(model.token_bytes(t) for t in encoded.ids)
        assert spelled.endswith(data) and len(spelled) - len(data) in (0, 1), name  # a SentencePiece lead space


def test_a_continuation_spells_the_new_text_after_any_cut(vocabs):
    """Cut text anywhere (mid-word, mid-character): the committed part as the model's own
    tokens, the rest as a continuation; together they spell the text whenever a continuation
    is offered, and one is offered at every cut between words."""
    text = "The quick brown fox jumps over the lazy dog. Ünïcödé and 😀 too.".encode()
    for name, model in vocabs.items():
        offered = 0
        for cut in range(1, len(text)):
            committed = encode(model, text[:cut]) if text[:cut].decode("utf-8", "ignore").encode() == text[:cut] \
                else None
            if committed is None:
                continue
            ids = continuation(model, committed.ids, text[cut:])
            if ids:
                offered += 1
                assert b"".join(model.token_bytes(t) for t in ids) == text[cut:], (name, cut)
            elif text[cut - 1:cut] == b" " or text[cut:cut + 1] == b" ":
                pytest.fail(f"{name}: nothing offered at a word boundary (cut {cut})")
        assert offered > len(text) // 2, name


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_draft_text_kept_in_step_spells_what_was_committed(vocabs, chunk):
    """Text arriving a few bytes at a time (characters split too): the draft's tokens spell
    all of it but an unfinished character (after the space a SentencePiece tokenizer puts in
    front of fresh text), and match a fresh encoding but for a few tokens."""
    data = "".join(TEXTS).encode()
    for name, model in vocabs.items():
        kept = DraftText(model)
        lead = b" " if model.token_bytes(encode(model, b"H").ids[0]) == b" H" else b""  # SentencePiece's dummy prefix
        for start in range(0, len(data), chunk):
            ids = kept.extend(data[start:start + chunk])
            spelled = b"".join(model.token_bytes(t) for t in ids).removeprefix(lead)
            assert data[:start + chunk].startswith(spelled), name
            assert len(data[:start + chunk]) - len(spelled) < 4, name  # at most an unfinished character
        fresh = encode(model, data).ids
        assert b"".join(model.token_bytes(t) for t in kept.ids) == lead + data, name
        assert abs(len(fresh) - len(kept.ids)) <= max(3, len(fresh) // 20), name


def test_the_intersection_pairs_tokens_of_the_same_text(vocabs):
    target, draft = vocabs["qwen2"], vocabs["phi-3"]
    shared = intersection(target, draft)
    assert 1000 < shared.size < draft.n_vocab
    for d, t in list(zip(shared.draft_ids, shared.target_ids))[::500]:
        assert draft.token_bytes(int(d)) == target.token_bytes(int(t)) != b""
    assert np.all(shared.draft_to_target[shared.draft_ids] == shared.target_ids)
    assert intersection(target, draft) is shared  # built once per pair


# --- greedy: the target's own output ---------------------------------------------------------

def greedy_pairs(zoo_paths) -> list[tuple[str, str, str, int]]:
    """(label, target, draft, prompts): each zoo vocabulary drafting for the next one, phi-3's
    SentencePiece target with qwen2's BPE draft on all 24 prompts (the others on a few: the
    262k and 256k vocabularies are slow to load and tokenize); and two drafting for themselves
    through the method (the same text both sides: high acceptance exercises the junction and
    the rollback)."""
    names = sorted(zoo_paths)
    pairs = [(f"{n}<-{names[(i + 1) % len(names)]}", zoo_paths[n]["target_gguf"],
              zoo_paths[names[(i + 1) % len(names)]]["draft_gguf"], 24 if n == "phi-3" else 2)
             for i, n in enumerate(names)]
    return pairs + [(f"{n}<-{n}", zoo_paths[n]["target_gguf"], zoo_paths[n]["draft_gguf"], 3)
                    for n in ("phi-3", "qwen2")]


def assert_greedy_identical(target: str, draft: str, prompts: list[str], max_tokens: int, label: str) -> int:
    """Every prompt: the method's tokens equal plain decoding's. Returns draft tokens accepted."""
    engine = LlamaEngine(target, n_ctx=512, n_threads=1)
    accepted = 0
    try:
        spec = SpecConfig(method=METHOD, k=4, draft_path=draft)
        for prompt in prompts:
            tokens = engine.tokenize(prompt)
            plain = generate_tokens(engine, tokens, SpecConfig(method="none"), max_tokens=max_tokens)
            crossed = generate_tokens(engine, tokens, spec, max_tokens=max_tokens)
            assert crossed == plain, f"{label}: {prompt!r}"
            accepted += engine.last_proposer.stats()["accepted"]
    finally:
        engine.close()
    return accepted


def test_greedy_is_plain_decoding_for_zoo_vocabularies(zoo_paths):
    for i, (label, target, draft, n_prompts) in enumerate(greedy_pairs(zoo_paths)):
        prompts = PROMPTS[:n_prompts] if n_prompts == 24 else PROMPTS[3 * i:3 * i + n_prompts]
        accepted = assert_greedy_identical(target, draft, prompts, 12, label)
        own = label.split("<-")[0] == label.split("<-")[1]
        assert not own or accepted > 0, f"{label}: the draft's own text was never accepted"


def test_greedy_is_plain_decoding_for_smollm2_and_the_demo_family(demo_family, smollm2):
    """A trained draft with another vocabulary (SmolLM2's 49k BPE for the demo's 1k one),
    some of its drafts accepted; and the other way round."""
    accepted = assert_greedy_identical(demo_family["target_gguf"], smollm2, PROMPTS[:4], 16, "demo<-smollm2")
    assert accepted > 0
    assert_greedy_identical(smollm2, demo_family["draft_gguf"], PROMPTS[4:5], 8, "smollm2<-demo")


def test_the_draft_method_still_refuses_what_crossvocab_takes(demo_family, smollm2):
    engine = LlamaEngine(demo_family["target_gguf"], n_ctx=256, n_threads=1)
    try:
        tokens = engine.tokenize(PROMPTS[0])
        generate_tokens(engine, tokens, SpecConfig(method=METHOD, k=2, draft_path=smollm2), max_tokens=4)
        with pytest.raises(SpecDeskError, match="not compatible"):
            generate_tokens(engine, tokens, SpecConfig(method="draft", k=2, draft_path=smollm2), max_tokens=4)
    finally:
        engine.close()


# --- sampling: lossless over the shared tokens -------------------------------------------------

SAMPLING = SamplingParams(temperature=0.8, top_p=0.95)


@pytest.fixture(scope="module")
def renamed_draft(demo_family, tmp_path_factory) -> str:
    """The demo draft with every third token renamed: a vocabulary of its own (the draft method
    refuses it), sharing two thirds of the target's tokens."""
    def rename(tokens):
        return [t + "\u00a7" if i % 3 == 2 and i > 16 else t for i, t in enumerate(tokens)]
    return str(rewrite_gguf(demo_family["draft_gguf"], tmp_path_factory.mktemp("vocab") / "renamed.gguf",
                            edit_tokens=rename))


class ResamplesFromP(LlamaEngine):
    """A verifier broken on purpose: a rejected draft token is replaced by a sample from p,
    not from the residual max(0, p - q)."""

    def verify_pass(self, draft, output, sampling, rng):
        rows = [sampling_probs(row, sampling) for row in output]
        for position, token in enumerate(draft.tokens):
            p, q = rows[position], draft.probs[position]
            if rng.random() >= min(1.0, p[token] / q[token]):
                return VerifyResult(position, sample(p, rng))
        return VerifyResult(len(draft.tokens), sample(rows[-1], rng))


@pytest.mark.parametrize("engine_class,follows", [(LlamaEngine, True), (ResamplesFromP, False)], ids=["verify", "broken"])
def test_sampling_follows_plain_sampling_across_vocabularies(demo_family, renamed_draft, engine_class, follows):
    engine = engine_class(demo_family["target_gguf"], n_ctx=256, n_threads=1)
    try:
        prompt = engine.tokenize(PROMPTS[0])
        spec = SpecConfig(method=METHOD, k=4, draft_path=renamed_draft)
        exact = gguf_exact(demo_family["target_gguf"], prompt, SAMPLING)
        if follows:
            assert_follows_plain_sampling(engine, exact, prompt, spec, SAMPLING, label=METHOD)
        else:
            with pytest.raises(AssertionError, match="position"):
                assert_follows_plain_sampling(engine, exact, prompt, spec, SAMPLING, label="broken")
    finally:
        engine.close()


def test_sampled_drafts_keep_to_the_shared_tokens(demo_family, renamed_draft):
    engine = LlamaEngine(demo_family["target_gguf"], n_ctx=256, n_threads=1)
    try:
        draft = GgufModel(renamed_draft)
        prompt = engine.tokenize(PROMPTS[1])
        spec = SpecConfig(method=METHOD, k=4, draft_path=renamed_draft)
        generate_tokens(engine, prompt, spec, SamplingParams(temperature=1.0, seed=3), max_tokens=16)
        proposer = engine.last_proposer
        shared = set(int(t) for t in proposer.shared.target_ids)
        assert proposer.stats()["drafted"] > 0
        renamed = {i for i in range(17, draft.n_vocab) if i % 3 == 2}
        assert not (renamed & set(proposer.shared.draft_ids.tolist())) and len(shared) == proposer.shared.size
        draft.close()
    finally:
        engine.close()


def test_the_method_takes_a_draft_model():
    info = METHODS[METHOD]
    assert info.takes == "draft_model" and info.file_required and not info.reads_hidden


def test_greedy_is_plain_decoding_on_torch(zoo_paths):
    """The PyTorch engine runs the method too: Hugging Face folders of three zoo vocabularies
    drafting for qwen2's, and qwen2's own draft through the method (some of it accepted)."""
    pytest.importorskip("torch")
    from specdesk.engines.torch.engine import TorchEngine

    engine = TorchEngine(zoo_paths["qwen2"]["target_hf"], n_ctx=256, device="cpu", dtype="float32", n_threads=1)
    try:
        for i, family in enumerate(("llama-bpe", "phi-3", "qwen2")):
            spec = SpecConfig(method=METHOD, k=4, draft_path=zoo_paths[family]["draft_hf"])
            accepted = 0
            for prompt in PROMPTS[2 * i:2 * i + 2]:
                tokens = engine.tokenize(prompt)
                plain = generate_tokens(engine, tokens, SpecConfig(method="none"), max_tokens=12)
                assert generate_tokens(engine, tokens, spec, max_tokens=12) == plain, (family, prompt)
                accepted += engine.last_proposer.stats()["accepted"]
            assert family != "qwen2" or accepted > 0
    finally:
        engine.close()


# --- templates: the draft reads the conversation in its own ----------------------------------

def test_the_draft_reads_the_conversation_in_its_own_template(zoo_paths):
    """qwen2's ChatML target, phi-3's template for its draft (rendered by the app,
    prompting.draft_conversation): the draft's cache starts with phi-3's own special tokens,
    the output is still the target's, and it ends at the target's own end of turn."""
    from specdesk.app.chat.prompting import chat_prompt
    from specdesk.app.chat.prompting import draft_conversation

    messages = [{"role": "user", "content": "Write a function that reads the lines of a file."}]
    engine = LlamaEngine(zoo_paths["qwen2"]["target_gguf"], n_ctx=512, n_threads=1)
    try:
        draft = engine.load_draft(zoo_paths["phi-3"]["draft_gguf"], same_vocabulary=False).model
        rendered = draft_conversation(draft, messages)
        assert "<|user|>" in rendered and "<|im_start|>" not in rendered
        prompt = chat_prompt(engine, messages)
        spec = SpecConfig(method=METHOD, k=4, draft_path=zoo_paths["phi-3"]["draft_gguf"], draft_prompt=rendered)
        plain = generate_tokens(engine, prompt, SpecConfig(method="none"), max_tokens=16)
        assert generate_tokens(engine, prompt, spec, max_tokens=16) == plain
        own = draft.tokenize(rendered, parse_special=True)
        assert engine.last_proposer.text.ids[:len(own)] == own
        assert any(draft.token_bytes(t) == b"" for t in own)  # its template's control tokens, not their text
    finally:
        engine.close()


def test_a_draft_without_a_template_reads_the_messages_as_text(zoo_paths, tmp_path):
    import json
    import shutil

    from specdesk.app.chat.prompting import draft_conversation
    from specdesk.engines.torch.tokenizer import HfTokenizer

    folder = Path(shutil.copytree(zoo_paths["llama-bpe"]["draft_hf"], tmp_path / "draft"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Name a prime."}]
    assert draft_conversation(HfTokenizer(folder), messages) == "Be terse.\n\nName a prime.\n\n"


def test_auto_chooses_among_a_cross_vocabulary_draft_with_its_costs_measured(demo_family, smollm2):
    """Method auto given the method among its candidates: its probe measures what the draft's
    tokens cost (retokenizing included), and the output is still the target's."""
    engine = LlamaEngine(demo_family["target_gguf"], n_ctx=256, n_threads=1)
    try:
        prompt = engine.tokenize(PROMPTS[0])
        plain = generate_tokens(engine, prompt, SpecConfig(method="none"), max_tokens=16)
        spec = SpecConfig(method="auto", k=4, draft_path=smollm2, auto_methods=("ngram", METHOD))
        assert generate_tokens(engine, prompt, spec, max_tokens=16) == plain
        auto = engine.last_proposer
        assert set(auto.proposers) == {"ngram", METHOD}
        assert auto.report()["costs"]["draft_token_ms"][METHOD] > 0
    finally:
        engine.close()


def test_a_draft_whose_tokens_outrun_the_context_stops_drafting(demo_family, smollm2):
    """SmolLM2 as the target, the demo's 1k vocabulary drafting: the draft needs more tokens for
    the same text, so near the context's end its own context fills first; drafting stops there
    and the run still ends as plain decoding does."""
    engine = LlamaEngine(smollm2, n_ctx=48, n_threads=1)
    try:
        tokens = engine.tokenize(PROMPTS[0])[:24]
        plain = generate_tokens(engine, tokens, SpecConfig(method="none"), max_tokens=40, stop_at_eos=False)
        spec = SpecConfig(method=METHOD, k=4, draft_path=demo_family["draft_gguf"])
        assert generate_tokens(engine, tokens, spec, max_tokens=40, stop_at_eos=False) == plain
        assert len(plain) == 48 - len(tokens)  # it ran to the context's end
    finally:
        engine.close()


def test_auto_with_a_draft_of_another_vocabulary_drafts_across_vocabularies(demo_family, smollm2):
    """Method auto given a draft the draft method refuses: the cross-vocabulary method takes its
    place among auto's candidates, its costs measured by auto's probe; a same-vocabulary draft
    stays with the draft method."""
    engine = LlamaEngine(demo_family["target_gguf"], n_ctx=256, n_threads=1)
    try:
        prompt = engine.tokenize(PROMPTS[1])
        plain = generate_tokens(engine, prompt, SpecConfig(method="none"), max_tokens=12)
        assert generate_tokens(engine, prompt, SpecConfig(method="auto", k=4, draft_path=smollm2),
                               max_tokens=12) == plain
        assert METHOD in engine.last_proposer.proposers and "draft" not in engine.last_proposer.proposers
        assert METHOD in engine.last_proposer.report()["costs"]["draft_token_ms"]
        generate_tokens(engine, prompt, SpecConfig(method="auto", k=4, draft_path=demo_family["draft_gguf"]),
                        max_tokens=4)
        assert "draft" in engine.last_proposer.proposers and METHOD not in engine.last_proposer.proposers
    finally:
        engine.close()


def test_a_chat_gives_the_draft_the_conversation_in_its_own_template(zoo_paths):
    """A chat's turn (app/runtime/session.stream_chat, what the window, the terminal and serve
    run) renders the conversation in the cross-vocabulary draft's template, for the method and
    for auto given that draft; a draft of the target's own vocabulary, or none, gets nothing."""
    import threading

    from specdesk.app.chat.prompting import draft_conversation, draft_prompt
    from specdesk.app.runtime.backend import ChatSettings
    from specdesk.app.runtime.generation import drain
    from specdesk.app.runtime.session import stream_chat

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three rivers."}]
    engine = LlamaEngine(zoo_paths["qwen2"]["target_gguf"], n_ctx=512, n_threads=1)
    try:
        phi3 = zoo_paths["phi-3"]["draft_gguf"]
        rendered = draft_conversation(engine.load_draft(phi3, same_vocabulary=False).model, messages)
        assert draft_prompt(engine, SpecConfig(method=METHOD, k=3, draft_path=phi3), messages) == rendered
        assert draft_prompt(engine, SpecConfig(method="auto", k=3, draft_path=phi3), messages) == rendered
        assert draft_prompt(engine, SpecConfig(method="draft", k=3, draft_path=zoo_paths["qwen2"]["draft_gguf"]),
                            messages) == ""
        assert draft_prompt(engine, SpecConfig(method="ngram", k=3), messages) == ""
        settings = ChatSettings(SpecConfig(method=METHOD, k=3, draft_path=phi3), SamplingParams(), 8, record=False)
        drain(stream_chat(engine, list(messages), settings, threading.Event()))
        draft = engine.last_proposer.draft
        own = draft.tokenize(rendered, parse_special=True)
        assert engine.last_proposer.text.ids[:len(own)] == own
    finally:
        engine.close()
