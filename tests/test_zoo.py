"""Conformance on the small real-shaped zoo (benchmarks/zoo.py): real tokenizers and chat
templates from llama.cpp's source, both engines.

The zoo is built once and cached on disk (the first run fetches the llama-cpp-python source
with pip; without it these tests fail, they do not skip).
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from benchmarks import zoo
from specdesk.app.chat.prompting import chat_prompt
from specdesk.app.chat.templates import TemplateLimits, render_chat
from specdesk.engines.llama.binding import GgufModel
from specdesk.engines.llama.engine import LlamaEngine
from specdesk.engines.speculation.compat import check_compatible
from specdesk.engines.types import GenerationRequest, SpecConfig, SpecDeskError

FAMILIES = sorted(zoo.FAMILIES)
TORCH_FAMILIES = [name for name in FAMILIES if zoo.FAMILIES[name].hf_arch]
# What each vocabulary declares to end a generation (llama.cpp finds them by text). The
# llama-bpe vocabulary is Llama 3.0's: its id 128008 is a reserved token, not 3.1's <|eom_id|>.
EOG_TEXTS = {"qwen2": ["<|im_end|>", "<|endoftext|>"], "llama-bpe": ["<|eot_id|>", "<|end_of_text|>"],
             "phi-3": ["<|end|>", "<|endoftext|>"], "command-r": ["<|END_OF_TURN_TOKEN|>"],
             "gemma-4": ["<turn|>", "<eos>"]}
CONVERSATION = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a prime."},
                {"role": "assistant", "content": "Seven."}, {"role": "user", "content": "Another one?"}]
UNHURRIED = TemplateLimits(max_seconds=60.0)  # the test checks what renders, not how fast on a busy machine
METHODS = [SpecConfig(method="ngram", k=4), SpecConfig(method="ngram-pool", k=4)]


@pytest.fixture(scope="session")
def built():
    """family, quant -> the zoo's paths, built (or found in the cache) once per session."""
    cache: dict = {}

    def get(family: str, quant: str = "F16") -> dict:
        if (family, quant) not in cache:
            cache[family, quant] = zoo.build(family, quant, small=True)
        return cache[family, quant]
    return get


def reference_cases(vocab_gguf: str) -> list[tuple[str, list[int]]]:
    """(text, token ids) pairs of llama.cpp's .inp/.out files, split as test-tokenizer-0 does."""
    raw = Path(vocab_gguf + ".inp").read_text(encoding="utf-8")
    texts = raw.split("\n__ggml_vocab_test__\n")
    lines = Path(vocab_gguf + ".out").read_text(encoding="utf-8").split("\n")
    if texts and texts[-1].endswith("\n__ggml_vocab_test__"):
        texts[-1] = texts[-1][: -len("\n__ggml_vocab_test__")]
    assert len(lines) >= len(texts)
    return [(text, [int(t) for t in line.split()]) for text, line in zip(texts, lines)]


def generate(engine, prompt, spec: SpecConfig, max_tokens: int = 24, stop_at_eos: bool = True) -> tuple[list[int], int]:
    """(tokens, drafted tokens accepted)"""
    out: list[int] = []
    accepted = 0
    request = GenerationRequest(tuple(prompt), max_tokens=max_tokens, spec=spec, stop_at_eos=stop_at_eos)
    for event in engine.generate(request, threading.Event()):
        out.extend(event.tokens)
        accepted += event.accepted
    return out, accepted


def run(engine, prompt, spec: SpecConfig, max_tokens: int = 24, stop_at_eos: bool = True) -> list[int]:
    return generate(engine, prompt, spec, max_tokens, stop_at_eos)[0]


# --- tokenization ------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_reference_tokenization_llama(built, family):
    paths = built(family)
    model = GgufModel(paths["target_gguf"], vocab_only=True)
    cases = reference_cases(paths["vocab_gguf"])
    wrong = [(text, model.tokenize(text, add_bos=False), ids) for text, ids in cases
             if model.tokenize(text, add_bos=False) != ids]
    assert len(cases) > 20 and not wrong, wrong[:3]


@pytest.mark.parametrize("family", FAMILIES)
def test_reference_tokenization_hf(built, family):
    from specdesk.engines.torch.tokenizer import HfTokenizer

    paths = built(family)
    tokenizer = HfTokenizer(paths["target_hf"])
    cases = reference_cases(paths["vocab_gguf"])
    wrong = [(text, tokenizer.tokenize(text, add_bos=False), ids) for text, ids in cases
             if tokenizer.tokenize(text, add_bos=False) != ids]
    assert not wrong, wrong[:3]


# --- chat templates ----------------------------------------------------------------------
def test_every_template_renders_or_is_refused_in_one_line(built):
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    templates = sorted((Path(built("qwen2")["vocab_gguf"]).parent / "templates").glob("*.jinja"))
    rendered, differ = [], []
    for path in templates:
        source = path.read_text(encoding="utf-8")
        try:
            ours = render_chat(source, CONVERSATION, bos_token="<s>", eos_token="</s>", source=path.name,
                               limits=UNHURRIED)
        except SpecDeskError as e:
            assert "\n" not in str(e) and path.name in str(e)
            continue
        assert "Another one?" in ours, path.name
        rendered.append(path.name)
        try:
            theirs = Jinja2ChatFormatter(source, eos_token="</s>", bos_token="<s>")(messages=CONVERSATION).prompt
        except Exception:  # llama-cpp-python's formatter cannot render it: nothing to compare
            continue
        if theirs != ours:
            differ.append(path.name)
    assert len(templates) > 60 and not differ, differ
    for family in FAMILIES:
        assert Path(built(family)["template"]).name in rendered


# --- stopping ----------------------------------------------------------------------------
def promote_token(src: str, dst: Path, token: int, instead_of: int) -> Path:
    """A copy of a GGUF whose output row for `token` is 1.05 x that of `instead_of`: where the
    model would emit `instead_of` (a positive logit), it now emits `token`."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    from specdesk.engines.llama.binding import gguf_header

    infos = gguf_header(src).tensor_infos  # the project's header reader: no per-token Python objects
    head = "output.weight" if "output.weight" in infos else "token_embd.weight"
    info = infos[head]
    if info.type_name in ("F16", "F32"):
        # A float head: copy the file and change the one row in place (parsing and rewriting a
        # 262k-token vocabulary's file field by field took most of this test's time).
        shutil.copyfile(src, dst)
        rows = np.memmap(dst, dtype=np.float16 if info.type_name == "F16" else np.float32, mode="r+",
                         offset=info.offset, shape=tuple(reversed(info.shape)))
        rows[token] = rows[instead_of] * 1.05
        rows.flush()
        del rows
        return dst
    reader = GGUFReader(src)
    writer = GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        main = field.types[0]
        writer.add_key_value(name, field.contents(), main, sub_type=field.types[-1] if main == GGUFValueType.ARRAY else None)
    for tensor in reader.tensors:
        data = np.array(tensor.data)
        if tensor.name == head:
            data[token] = data[instead_of] * 1.05
        writer.add_tensor(tensor.name, data, raw_shape=list(data.shape), raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def promote_token_hf(src: str, dst: Path, token: int, instead_of: int) -> Path:
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    head = "lm_head.weight" if "lm_head.weight" in tensors else "model.embed_tokens.weight"
    tensors[head][token] = tensors[head][instead_of] * 1.05
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def check_stops(engine_for, family_paths, prompt_text: str, eog_ids: list[int], tmp_path: Path, hf: bool):
    base_engine = engine_for(family_paths["target_hf" if hf else "target_gguf"])
    prompt = base_engine.tokenize(prompt_text)
    baseline = run(base_engine, prompt, SpecConfig(method="none", k=0), max_tokens=16, stop_at_eos=False)
    base_engine.close()
    step = next(i for i in range(3, len(baseline)) if baseline[i] not in baseline[:i])
    draft = family_paths["draft_hf" if hf else "draft_gguf"]
    for token in eog_ids:
        where = tmp_path / f"stop-{token}{'' if hf else '.gguf'}"
        source = family_paths["target_hf" if hf else "target_gguf"]
        (promote_token_hf if hf else promote_token)(source, where, token, baseline[step])
        engine = engine_for(where)
        outputs = [run(engine, prompt, spec, max_tokens=16)
                   for spec in (SpecConfig(method="none", k=0), SpecConfig(method="ngram", k=4),
                                SpecConfig(method="draft", k=4, draft_path=draft))]
        engine.close()
        out = outputs[0]
        assert out[-1] == token and len(out) <= step + 1 and out[:-1] == baseline[: len(out) - 1], (token, out)
        assert outputs[1] == out and outputs[2] == out, (token, outputs)


@pytest.mark.parametrize("family", FAMILIES)
def test_llama_engine_stops_at_every_end_of_generation_token(built, family, tmp_path):
    paths = built(family)
    vocab = GgufModel(paths["target_gguf"], vocab_only=True)
    ids = [vocab.tokenize(text, add_bos=False, parse_special=True)[0] for text in EOG_TEXTS[family]]
    assert all(vocab.is_eog(t) for t in ids), [(t, vocab.token_text(t)) for t in ids]
    check_stops(lambda p: LlamaEngine(p, n_ctx=512, n_threads=2), paths, "Once upon a time", ids, tmp_path, hf=False)


@pytest.mark.parametrize("family", TORCH_FAMILIES)
def test_torch_engine_stops_at_every_end_of_generation_token(built, family, tmp_path):
    pytest.importorskip("torch")  # the GGUF-only install has no PyTorch engine
    from specdesk.engines.torch.engine import TorchEngine
    from specdesk.engines.torch.tokenizer import HfTokenizer

    paths = built(family)
    tokenizer = HfTokenizer(paths["target_hf"])
    ids = [tokenizer.tokenize(text, add_bos=False, parse_special=True)[0] for text in EOG_TEXTS[family]]
    assert all(tokenizer.is_eog(t) for t in ids)
    check_stops(lambda p: TorchEngine(p, n_ctx=512, device="cpu"), paths, "Once upon a time", ids, tmp_path, hf=True)


# --- greedy identity through the chat template ---------------------------------------------
# Every family in the types the zoo's real-shape benchmarks use; Q4_1 (its own batched kernel,
# packaging/llama-patches/0003) on one family, which is what that kernel needs to be held to.
GREEDY_CASES = [(family, quant) for quant in ("F16", "Q8_0", "Q4_K_M") for family in FAMILIES] + [("phi-3", "Q4_1")]


@pytest.mark.parametrize("family,quant", GREEDY_CASES)
def test_llama_greedy_speculation_is_lossless_through_chat(built, family, quant):
    """Property of the shipped small family relied on: the zoo's draft (the target's own first layers,
    built by the zoo) has some token accepted."""
    paths = built(family, quant)
    engine = LlamaEngine(paths["target_gguf"], n_ctx=1024, n_threads=2)
    prompt = chat_prompt(engine, CONVERSATION)
    baseline = run(engine, prompt, SpecConfig(method="none", k=0), stop_at_eos=False)
    for spec in METHODS + [SpecConfig(method="draft", k=4, draft_path=paths["draft_gguf"])]:
        tokens, accepted = generate(engine, prompt, spec, stop_at_eos=False)
        assert tokens == baseline, spec.method
        assert accepted > 0 or spec.method != "draft"
    engine.close()
    assert len(baseline) == 24


@pytest.mark.parametrize("family", TORCH_FAMILIES)
def test_torch_greedy_speculation_is_lossless_through_chat(built, family):
    pytest.importorskip("torch")  # the GGUF-only install has no PyTorch engine
    from specdesk.engines.torch.engine import TorchEngine

    paths = built(family)
    engine = TorchEngine(paths["target_hf"], n_ctx=1024, device="cpu")
    prompt = chat_prompt(engine, CONVERSATION)
    baseline = run(engine, prompt, SpecConfig(method="none", k=0), stop_at_eos=False)
    for spec in METHODS + [SpecConfig(method="draft", k=4, draft_path=paths["draft_hf"])]:
        assert run(engine, prompt, spec, stop_at_eos=False) == baseline, spec.method
    engine.close()


def test_both_engines_tokenize_the_chat_prompt_alike(built):
    """Byte-level BPE families only: with SentencePiece, tokenizer.json puts a space prefix after
    each special token, where llama.cpp puts one at the start of the text only."""
    pytest.importorskip("torch")  # the GGUF-only install has no PyTorch engine
    from specdesk.engines.torch.engine import TorchEngine

    for family in ("qwen2", "llama-bpe"):
        paths = built(family)
        llama, torch_engine = LlamaEngine(paths["target_gguf"], n_ctx=1024, n_threads=2), \
            TorchEngine(paths["target_hf"], n_ctx=1024, device="cpu")
        assert chat_prompt(llama, CONVERSATION) == chat_prompt(torch_engine, CONVERSATION), family
        llama.close()
        torch_engine.close()


# --- pairing -----------------------------------------------------------------------------
def test_same_family_drafts_pair_and_other_families_are_refused_by_vocab_size(built):
    models = {family: (GgufModel(built(family)["target_gguf"], vocab_only=True),
                       GgufModel(built(family)["draft_gguf"], vocab_only=True)) for family in FAMILIES}
    for family, (target, draft) in models.items():
        check_compatible(target, draft)
        for other, (_, other_draft) in models.items():
            if other == family:
                continue
            with pytest.raises(SpecDeskError) as refused:
                check_compatible(target, other_draft)
            sizes = f"vocab size {target.vocab.n_tokens} vs {other_draft.vocab.n_tokens}"
            assert sizes in str(refused.value) or "vocab type" in str(refused.value), str(refused.value)
    qwen, llama = models["qwen2"][0], models["llama-bpe"][1]
    with pytest.raises(SpecDeskError, match="vocab size 151936 vs 128256"):
        check_compatible(qwen, llama)
