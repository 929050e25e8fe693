"""The GGUF to Hugging Face converter (app/models/gguf_to_hf.py) on real files: the demo target,
which exists in both forms, converts to its own Hugging Face folder's weights and greedy output;
SmolLM2's Q4_1 file (a real model no one here made, a `smollm` pre-tokenizer, grouped keys and
values, tied embeddings) converts to a folder whose tokenizer gives llama.cpp's ids and whose
greedy tokens on the PyTorch engine are llama.cpp's; the tokenizer.json conversion matches
llama.cpp's reference tokenizations for every byte-level BPE vocabulary it claims; and what it
cannot convert is refused by name."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from specdesk.app.models.gguf_to_hf import convert
from specdesk.engines.types import GenerationRequest, SpecConfig, SpecDeskError

from llama_helpers import _finish, copy_gguf

TEXTS = [
    "def parse(text):\n    return [int(x) for x in text.split(',')]  # 42\n",
    "Hello world! 1234567 3.14159 x=10**9 and 1,000,000.00$ at 99%",
    "  leading,   internal   spaces\t\ttabs\n\n\nnewlines   \n ",
    "naïve café — Ünïcödé 東京タワー 🙂👍🏽 مرحبا Ελληνικά",
    "''' don't won't I'll we've \"quoted\" `code` {x: [1, 2]} <b>html</b> ",
    "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n",
    "", " ", "\n", "a", "   ", "\t\n \r\n",
]
CHAT = "<|im_start|>user\nWrite a Python function that reverses a string.<|im_end|>\n<|im_start|>assistant\n"
QUESTIONS = ["Write a Python function that reverses a string.", "What is the capital of France?",
             "Give me three tips for better sleep."]
MARGIN = 1.0  # a top-2 logit gap above Q4_1's arithmetic noise (llama.cpp quantizes activations too)


def greedy(engine, prompt: list[int], max_tokens: int) -> list[int]:
    request = GenerationRequest(tuple(prompt), max_tokens=max_tokens, spec=SpecConfig(), stop_at_eos=False)
    return [t for event in engine.generate(request, threading.Event()) for t in event.tokens]


def torch_engine(folder):
    pytest.importorskip("torch")  # the GGUF-only install has no PyTorch engine
    from specdesk.engines.torch.engine import TorchEngine

    return TorchEngine(str(folder), n_ctx=512, device="cpu", dtype="float32", n_threads=2)


def tokenizer_mismatches(gguf: str, folder: Path, texts: list[str]) -> list:
    """(text, parse_special, ids, llama.cpp's ids) wherever the folder's tokenizer.json, read by the
    `tokenizers` library, and the PyTorch engine's tokenizer over it differ from llama.cpp. Without
    parse_special, text that spells a control token is plain text to both (tokenizers'
    encode_special_tokens)."""
    from tokenizers import Tokenizer

    from specdesk.engines.llama.binding import GgufModel
    from specdesk.engines.torch.tokenizer import HfTokenizer

    plain = Tokenizer.from_file(str(folder / "tokenizer.json"))
    plain.encode_special_tokens = True
    engine = HfTokenizer(folder)
    wrong = []
    with GgufModel(gguf, vocab_only=True) as llama:
        for text in texts:
            expected = llama.tokenize(text, add_bos=False, parse_special=False)
            if plain.encode(text, add_special_tokens=False).ids != expected:
                wrong.append((text, False, plain.encode(text, add_special_tokens=False).ids, expected))
            expected = llama.tokenize(text, add_bos=False, parse_special=True)
            if engine.tokenize(text, add_bos=False, parse_special=True) != expected:
                wrong.append((text, True, engine.tokenize(text, add_bos=False, parse_special=True), expected))
    return wrong


# --- the demo target: the same model in both forms --------------------------------------
@pytest.fixture(scope="module")
def demo_converted(demo_family, tmp_path_factory) -> Path:
    return convert(demo_family["target_gguf"], tmp_path_factory.mktemp("demo") / "target-hf", dtype="float32")


def test_the_demo_gguf_converts_to_its_own_folders_weights(demo_family, demo_converted):
    from safetensors.numpy import load_file

    original = load_file(str(Path(demo_family["target_hf"]) / "model.safetensors"))
    converted = load_file(str(demo_converted / "model.safetensors"))
    assert converted.keys() == original.keys()
    # the F16 GGUF holds the folder's float16 values: every tensor comes back exactly, Q and K
    # rows in rotate-half order again
    differing = [name for name in original if not np.array_equal(converted[name], original[name].astype(np.float32))]
    assert differing == []
    config = json.loads((demo_converted / "config.json").read_text())
    own = json.loads((Path(demo_family["target_hf"]) / "config.json").read_text())
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "rope_theta", "max_position_embeddings", "vocab_size", "bos_token_id", "eos_token_id",
                "tie_word_embeddings", "architectures"):
        assert config[key] == own[key], key
    assert np.float32(config["rms_norm_eps"]) == np.float32(own["rms_norm_eps"])  # the GGUF keeps a float32
    assert config["torch_dtype"] == "float32"


def test_the_converted_demo_runs_greedy_on_torch_as_its_own_folder_does(demo_family, demo_converted):
    own, converted = torch_engine(demo_family["target_hf"]), torch_engine(demo_converted)
    try:
        prompt = own.tokenize("def read_lines(path):\n", add_bos=True)
        assert converted.tokenize("def read_lines(path):\n", add_bos=True) == prompt
        assert greedy(converted, prompt, 24) == greedy(own, prompt, 24)
        assert converted.target.chat_template() == own.target.chat_template()
    finally:
        own.close()
        converted.close()


def test_the_converted_demo_tokenizes_as_llama_cpp(demo_family, demo_converted):
    assert tokenizer_mismatches(demo_family["target_gguf"], demo_converted, TEXTS + ["<|bos|>x<|eos|>"]) == []


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_folders_in_shards_load_and_agree(demo_family, demo_converted, tmp_path, dtype):
    """float16 is the demo folder's own precision; bfloat16 rounds, so its greedy output is only
    checked to start like float32's. A small shard limit splits the weights with an index."""
    from safetensors import safe_open

    folder = convert(demo_family["target_gguf"], tmp_path / dtype, dtype=dtype, shard_bytes=1 << 20)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and not (folder / "model.safetensors").exists()
    with safe_open(str(folder / shards[0]), framework="pt") as f:
        assert str(f.get_tensor(next(iter(f.keys()))).dtype) == f"torch.{dtype}"
    assert json.loads((folder / "config.json").read_text())["torch_dtype"] == dtype
    half, full = torch_engine(folder), torch_engine(demo_converted)
    try:
        prompt = full.tokenize("import os\n\n\ndef main():\n", add_bos=True)
        expected = greedy(full, prompt, 16)
        got = greedy(half, prompt, 16)
        assert got == expected if dtype == "float16" else got[:4] == expected[:4]
    finally:
        half.close()
        full.close()


# --- SmolLM2: a real model that reaches us as a Q4_1 GGUF ---------------------------------
@pytest.fixture(scope="module")
def smollm2_hf(smollm2, tmp_path_factory) -> Path:
    return convert(smollm2, tmp_path_factory.mktemp("smollm2") / "SmolLM2-hf", dtype="float32")


def test_smollm2s_folder_says_what_its_header_says(smollm2, smollm2_hf):
    from specdesk.engines.llama.binding import GgufModel

    config = json.loads((smollm2_hf / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["intermediate_size"], config["vocab_size"]) == (576, 30, 9, 3, 1536,
                                                                                                49152)
    assert config["tie_word_embeddings"] is True and config["rms_norm_eps"] == 1e-05
    assert config["rope_theta"] == 100000.0 and config["max_position_embeddings"] == 8192
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    tokenizer_config = json.loads((smollm2_hf / "tokenizer_config.json").read_text())
    assert tokenizer_config["add_bos_token"] is False and "<|im_start|>" in tokenizer_config["chat_template"]
    with GgufModel(smollm2, vocab_only=True) as llama:  # <|endoftext|>, <|im_end|> and a FIM token
        ends = [t for t in range(config["vocab_size"]) if llama.is_eog(t)]
    assert json.loads((smollm2_hf / "generation_config.json").read_text())["eos_token_id"] == ends
    assert {0, 2} <= set(ends)


def test_smollm2s_tokenizer_gives_llama_cpps_ids(smollm2, smollm2_hf):
    assert tokenizer_mismatches(smollm2, smollm2_hf, TEXTS + [CHAT]) == []


def test_smollm2_on_torch_says_what_llama_cpp_says_on_the_q4_1_file(smollm2, smollm2_hf):
    """Teacher-forced over llama.cpp's own greedy answers: wherever llama.cpp's top two logits are
    further apart than Q4_1's arithmetic noise, the converted model's argmax is llama.cpp's; and
    the torch engine's greedy tokens are llama.cpp's up to the first near tie (on the first
    question, "Here" and "Sure" are 0.08 apart at the first token), for 8 tokens or more on one."""
    from specdesk.engines.llama.binding import GgufContext
    from specdesk.engines.llama.engine import LlamaEngine

    llama = LlamaEngine(smollm2, n_ctx=512, n_threads=2)
    engine = torch_engine(smollm2_hf)
    agreed = []
    try:
        for question in QUESTIONS:
            chat = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
            prompt = llama.target.tokenize(chat, add_bos=False, parse_special=True)
            assert engine.target.tokenize(chat, add_bos=False, parse_special=True) == prompt
            answer = greedy(llama, prompt, 12)
            context = GgufContext(llama.target, 512, 2)
            try:
                reference = context.decode(prompt + answer)[len(prompt) - 1:]  # (12 + 1, V)
            finally:
                context.close()
            engine.context.rollback(0)
            logits = engine.context.decode(prompt + answer).logits.detach().float().numpy()[len(prompt) - 1:]
            top2 = np.sort(reference, axis=-1)[:, -2:]
            clear = top2[:, 1] - top2[:, 0] > MARGIN
            assert clear.sum() >= len(clear) // 2, f"{question}: too few positions clear of Q4_1's noise"
            assert (logits.argmax(-1)[clear] == reference.argmax(-1)[clear]).all(), question
            first_tie = len(answer) if clear[:-1].all() else int(np.argmin(clear))
            got = greedy(engine, prompt, len(answer))
            assert got[:first_tie] == answer[:first_tie], (question, got, answer, first_tie)
            agreed.append(first_tie)
    finally:
        llama.close()
        engine.close()
    assert max(agreed) >= 8, agreed


# --- the tokenizer conversion against llama.cpp's reference tokenizations -----------------
def reference_cases(vocab: Path) -> list[tuple[str, list[int]]]:
    """(text, ids) of llama.cpp's .inp/.out files for a vocab GGUF, split as test-tokenizer-0 does."""
    texts = Path(f"{vocab}.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    if texts and texts[-1].endswith("\n__ggml_vocab_test__"):
        texts[-1] = texts[-1][: -len("\n__ggml_vocab_test__")]
    lines = Path(f"{vocab}.out").read_text(encoding="utf-8").split("\n")
    return [(text, [int(t) for t in line.split()]) for text, line in zip(texts, lines)]


@pytest.mark.parametrize("name", ["gpt-2", "mpt", "starcoder", "refact", "command-r", "llama-bpe", "qwen2"])
def test_every_claimed_pre_tokenizer_tokenizes_as_llama_cpps_reference(name):
    from tokenizers import Tokenizer

    from benchmarks.zoo import vocab_models_dir
    from specdesk.app.models.gguf_tokenizer import BPE_PRE_TOKENIZERS, tokenizer_json, vocab_values

    vocab = vocab_models_dir() / f"ggml-vocab-{name}.gguf"
    fields = vocab_values(vocab)
    assert fields["tokenizer.ggml.pre"] in BPE_PRE_TOKENIZERS
    tokenizer = Tokenizer.from_str(tokenizer_json(fields, str(vocab)))
    cases = reference_cases(vocab)
    wrong = [(text, ids) for text, ids in cases if tokenizer.encode(text, add_special_tokens=False).ids != ids]
    assert len(cases) > 20 and wrong == [], wrong[:3]


def test_an_unknown_pre_tokenizer_is_refused_by_name():
    from specdesk.app.models.gguf_tokenizer import tokenizer_json

    fields = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "falcon", "tokenizer.ggml.tokens": ["a"],
              "tokenizer.ggml.token_type": [1], "tokenizer.ggml.merges": []}
    with pytest.raises(SpecDeskError, match="x.gguf: its vocabulary's pre-tokenizer 'falcon'"):
        tokenizer_json(fields, "x.gguf")


# --- refusals ------------------------------------------------------------------------------
def tiny_gguf(path: Path, arch: str) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_embedding_length(8)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    return _finish(writer, path)


def test_another_architecture_is_refused_naming_the_file_and_it(tmp_path):
    path = tiny_gguf(tmp_path / "tiny-gpt2.gguf", "gpt2")
    with pytest.raises(SpecDeskError, match="architecture 'gpt2' cannot be converted") as caught:
        convert(path, tmp_path / "out")
    assert str(path) in str(caught.value) and not (tmp_path / "out").exists()


def test_a_tensor_with_no_place_in_llama_is_refused_by_name(demo_family, tmp_path):
    path = copy_gguf(demo_family["target_gguf"], tmp_path / "extra.gguf", {},
                     extra_tensors={"blk.0.attn_sinks.weight": np.ones(8, np.float32)})
    with pytest.raises(SpecDeskError, match="tensor blk.0.attn_sinks.weight has no place in LlamaForCausalLM") as caught:
        convert(path, tmp_path / "out")
    assert str(path) in str(caught.value) and list(tmp_path.iterdir()) == [path]


def test_the_command_converts_and_says_what_is_wrong(demo_family, tmp_path, capsys):
    from specdesk.app.main import main

    out = tmp_path / "demo-hf"
    assert main(["models", "to-hf", demo_family["target_gguf"], "--out", str(out), "--dtype", "float16",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"gguf": demo_family["target_gguf"], "path": str(out),
                                                   "dtype": "float16"}
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors", "tokenizer.json",
                                               "tokenizer_config.json", "generation_config.json"}
    assert [p.name for p in tmp_path.iterdir()] == ["demo-hf"]  # no temporary folder left behind
    assert (out / "model.safetensors").stat().st_mode == (out / "config.json").stat().st_mode

    assert main(["models", "to-hf", demo_family["target_gguf"], "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["models", "to-hf", demo_family["target_gguf"], "--out", str(out), "--force"]) == 0
    capsys.readouterr()

    missing = tmp_path / "missing.gguf"
    assert main(["models", "to-hf", str(missing)]) == 2
    assert f"{missing}: no such file" in capsys.readouterr().err
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    assert main(["models", "to-hf", str(text)]) == 2
    assert f"{text}: not a GGUF file" in capsys.readouterr().err
