"""The demo family's derived files: widening, HF and GGUF exports, and the cached build."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import tokenizers
import torch
from safetensors.numpy import load_file

from specdesk.app.demo.config import llama_config, tensor_shapes
from specdesk.app.demo.export_gguf import permute_rope_rows
from specdesk.app.demo.export_hf import load_hf
from specdesk.app.demo.train import token_logits
from specdesk.app.demo.widen import widen
from specdesk.engines.llama.binding import llama_lib
from specdesk.engines.torch.model import Transformer
from specdesk.engines.types import SpecDeskError

# llama-cpp-python with its backends loaded: a GGML_BACKEND_DL build keeps them in modules
# that only SpecDesk's binding loads (engines/llama/binding.load_backend_modules)
llama_cpp = llama_lib()

SAMPLES = [
    "def parse_args(argv):\n    return argv[1:]\n",
    "class A:\n\tpass\n\n\n\n# trailing   \n",
    "  \t\n\n   x  =  'héllo wörld'  # ünïcode ✓ 🚀 日本語\r\n",
    "a=1;b='''\n  x\n'''\n  \n \n    ",
    "ﬁ ’s 's 'S I'LL 123456 3.14159 1e-5 __init__(self, *args, **kw)",
]
PROMPTS = ["import os\n\ndef ", "class Parser:\n    def __init__(self"]
NEW_TOKENS = 20
# llama.cpp runs fp16 matmuls on CPU, torch fp32 on the same fp16 weights: a greedy pick may
# only flip where the top two logits are closer than this.
NEAR_TIE = 1e-2


def _tokenizer(roles: dict[str, str]) -> tokenizers.Tokenizer:
    return tokenizers.Tokenizer.from_file(roles["tokenizer"])


def _card(roles: dict[str, str]) -> dict:
    return json.loads(Path(roles["card"]).read_text())


@torch.no_grad()
def _torch_greedy(model: Transformer, prompt: list[int], n: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(int(token_logits(model, torch.tensor([tokens]))[0, -1].argmax()))
    return tokens[len(prompt):]


def _llama_greedy(llm: llama_cpp.Llama, prompt: list[int], n: int) -> list[int]:
    llm.reset()
    llm.eval(prompt)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([out[-1]])
    return out


@pytest.fixture(scope="module")
def llamas(demo_family: dict[str, str]) -> dict[str, llama_cpp.Llama]:
    # One thread for prompts too: llama.cpp's default batch threads spin on a busy CPU.
    return {role: llama_cpp.Llama(model_path=demo_family[f"{role}_gguf"], n_ctx=256, n_threads=1,
                                  n_threads_batch=1, logits_all=True, verbose=False)
            for role in ("target", "draft")}


def test_permute_pairs_rotate_half_rows_as_llama_cpp_expects() -> None:
    one_head = np.arange(8).reshape(8, 1)  # HF rotates halves [0 1 2 3 | 4 5 6 7]
    assert permute_rope_rows(one_head, 1).ravel().tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    two_heads = np.arange(8).reshape(8, 1)
    assert permute_rope_rows(two_heads, 2).ravel().tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_tensor_shapes_are_the_engine_transformers_state_dict_shapes() -> None:
    config = llama_config(vocab_size=48, hidden_size=16, num_hidden_layers=2, num_attention_heads=3,
                          intermediate_size=40, head_dim=8)
    with torch.device("meta"):
        state = Transformer(config).state_dict()
    assert tensor_shapes(config) == {name: tuple(tensor.shape) for name, tensor in state.items()}


def test_widened_core_computes_what_the_core_computes(demo_family: dict[str, str]) -> None:
    wide_shape = _card(demo_family)["wide"]
    core_config, core = load_hf(Path(demo_family["core_hf"]))
    core_state = {name: t.astype(np.float32)
                  for name, t in load_file(str(Path(demo_family["core_hf"]) / "model.safetensors")).items()}
    wide_config, wide_state = widen(core_config, core_state, wide_shape["hidden_size"],
                                    wide_shape["num_attention_heads"], wide_shape["intermediate_size"])
    wide = Transformer(wide_config)
    wide.load_state_dict({name: torch.from_numpy(array) for name, array in wide_state.items()})
    assert load_hf(Path(demo_family["target_hf"]))[0] == wide_config

    tokens = _tokenizer(demo_family).encode("".join(SAMPLES)).ids[:96]
    with torch.no_grad():
        batch = torch.tensor([tokens])
        difference = (token_logits(core, batch) - token_logits(wide, batch)).abs().max().item()
    assert difference < 1e-5
    assert _torch_greedy(wide, tokens[:12], NEW_TOKENS) == _torch_greedy(core, tokens[:12], NEW_TOKENS)

    # New heads and units are real (they read the stream) but silent (they write nothing).
    inner = core_config.num_attention_heads * core_config.head_dim
    layer = "model.layers.0."
    assert np.abs(wide_state[layer + "self_attn.q_proj.weight"][inner:]).sum() > 0
    assert np.abs(wide_state[layer + "self_attn.o_proj.weight"][:, inner:]).sum() == 0
    assert np.abs(wide_state[layer + "mlp.down_proj.weight"][:, core_config.intermediate_size:]).sum() == 0


def test_hf_exports_load_with_their_metadata(demo_family: dict[str, str]) -> None:
    card = _card(demo_family)
    for role, expected_hidden in (("target", card["wide"]["hidden_size"]), ("draft", card["draft"]["config"]["hidden_size"])):
        folder = Path(demo_family[f"{role}_hf"])
        config, _ = load_hf(folder)
        assert config.hidden_size == expected_hidden
        hf_config = json.loads((folder / "config.json").read_text())
        assert hf_config["architectures"] == ["LlamaForCausalLM"] and hf_config["torch_dtype"] == "float16"
        assert hf_config["num_key_value_heads"] == hf_config["num_attention_heads"]
        tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
        assert tokenizer_config["chat_template"] == card["chat_template"]
        assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    # HF users get the BOS that llama.cpp adds (add_bos_token) from the tokenizer itself.
    assert _tokenizer(demo_family).encode("x = 1").ids[0] == hf_config["bos_token_id"]


def test_gguf_metadata_is_what_real_files_carry(demo_family: dict[str, str]) -> None:
    card = _card(demo_family)
    for role, hidden in (("target", card["wide"]["hidden_size"]), ("draft", card["draft"]["config"]["hidden_size"])):
        reader = gguf.GGUFReader(demo_family[f"{role}_gguf"])
        fields = {name: field.contents() for name, field in reader.fields.items()}
        assert fields["general.architecture"] == "llama"
        assert fields["general.file_type"] == gguf.LlamaFileType.MOSTLY_F16
        assert fields["llama.context_length"] == card["core"]["config"]["max_position_embeddings"]
        assert fields["llama.embedding_length"] == hidden
        assert fields["tokenizer.ggml.model"] == "gpt2" and fields["tokenizer.ggml.pre"] == "gpt-2"
        assert (fields["tokenizer.ggml.bos_token_id"], fields["tokenizer.ggml.eos_token_id"]) == (0, 1)
        assert fields["tokenizer.ggml.add_bos_token"] is True and fields["tokenizer.ggml.add_eos_token"] is False
        assert fields["tokenizer.chat_template"] == card["chat_template"]
        assert len(fields["tokenizer.ggml.tokens"]) == fields["llama.vocab_size"] == card["core"]["config"]["vocab_size"]
        assert fields["tokenizer.ggml.token_type"][:3] == [gguf.TokenType.CONTROL, gguf.TokenType.CONTROL,
                                                          gguf.TokenType.NORMAL]
        for tensor in reader.tensors:
            expected = gguf.GGMLQuantizationType.F32 if len(tensor.shape) == 1 else gguf.GGMLQuantizationType.F16
            assert tensor.tensor_type == expected, tensor.name


@pytest.mark.parametrize("text", SAMPLES)
def test_llama_cpp_tokenizes_like_tokenizer_json(llamas: dict, demo_family: dict[str, str], text: str) -> None:
    expected = _tokenizer(demo_family).encode(text, add_special_tokens=False).ids
    assert llamas["draft"].tokenize(text.encode(), add_bos=False, special=False) == expected
    assert llamas["target"].tokenize(text.encode(), add_bos=True, special=False) == [0, *expected]
    assert llamas["target"].detokenize(expected).decode() == text


@pytest.mark.parametrize("role", ["target", "draft"])
def test_gguf_and_hf_exports_decode_the_same(llamas: dict, demo_family: dict[str, str], role: str) -> None:
    _, model = load_hf(Path(demo_family[f"{role}_hf"]))  # fp16 values in fp32, as the GGUF holds them
    tokenizer = _tokenizer(demo_family)
    for prompt in PROMPTS:
        prompt_ids = tokenizer.encode(prompt).ids
        assert llamas[role].tokenize(prompt.encode()) == prompt_ids
        from_llama = _llama_greedy(llamas[role], prompt_ids, NEW_TOKENS)
        from_torch = _torch_greedy(model, prompt_ids, NEW_TOKENS)
        if from_llama != from_torch:
            at = next(i for i, (a, b) in enumerate(zip(from_llama, from_torch)) if a != b)
            with torch.no_grad():
                logits = token_logits(model, torch.tensor([prompt_ids + from_torch[:at]]))[0, -1]
            gap = (logits[from_torch[at]] - logits[from_llama[at]]).item()
            assert gap < NEAR_TIE, f"{role}: diverged at token {at} ({from_llama} vs {from_torch}), logit gap {gap}"


def test_damaged_derived_files_are_rebuilt(demo_family: dict[str, str], demo_cache_dir: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from specdesk.app.demo.install import build_family

    monkeypatch.setenv("SPECDESK_CACHE_DIR", str(demo_cache_dir))  # reuses the session's training
    out = tmp_path / "family"
    roles = build_family(small=True, out=out)
    truncated, corrupted = Path(roles["target_gguf"]), Path(roles["draft_hf"]) / "model.safetensors"
    missing = Path(roles["core_hf"]) / "config.json"
    untouched = Path(roles["target_hf"]) / "model.safetensors"
    originals = {path: path.read_bytes() for path in (truncated, corrupted, missing)}
    untouched_mtime = untouched.stat().st_mtime_ns

    truncated.write_bytes(originals[truncated][: len(originals[truncated]) // 2])
    flipped = bytearray(originals[corrupted])
    flipped[-1] ^= 0xFF
    corrupted.write_bytes(bytes(flipped))
    missing.unlink()

    messages: list[str] = []
    assert build_family(small=True, out=out, progress=messages.append) == roles
    for path, data in originals.items():
        assert path.read_bytes() == data, f"{path} was not rebuilt"
    assert untouched.stat().st_mtime_ns == untouched_mtime
    report = "\n".join(messages)
    for name in (truncated.name, "draft-hf/model.safetensors", "core-hf/config.json"):
        assert name in report
    llama_cpp.Llama(model_path=str(truncated), vocab_only=True, verbose=False)


def _ship_small_family(demo_cache_dir: Path, assets: Path) -> Path:
    """An assets/ folder holding the shipped small family in the full family's place."""
    from specdesk.app.demo.install import shipped_folder, trained_files, verify_trained

    shipped = assets / "demo"
    shipped.mkdir(parents=True)
    for name in ("card.json", *trained_files(verify_trained(shipped_folder(small=True)))):
        shutil.copy(shipped_folder(small=True) / name, shipped / name)
    return shipped


def test_shipped_family_is_verified_before_use(demo_family: dict[str, str], demo_cache_dir: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from specdesk.app.demo import install

    shipped = _ship_small_family(demo_cache_dir, tmp_path / "assets")
    monkeypatch.setenv("SPECDESK_ASSETS_DIR", str(tmp_path / "assets"))
    monkeypatch.setenv("SPECDESK_CACHE_DIR", str(tmp_path / "cache"))
    roles = install.build_family()
    assert Path(roles["target_gguf"]).is_relative_to(tmp_path / "cache" / "demo")

    damaged = bytearray((shipped / "core.safetensors").read_bytes())
    damaged[-1] ^= 0xFF
    (shipped / "core.safetensors").write_bytes(bytes(damaged))
    with pytest.raises(SpecDeskError, match=r"core\.safetensors is damaged"):
        install.build_family()


NO_TORCH_INSTALL = """
import json, sys
sys.modules["torch"] = None  # every `import torch` below raises ImportError, as if it were not installed
from specdesk.app.demo.export_hf import load_hf
from specdesk.app.demo.install import build_family
from specdesk.engines.types import SpecDeskError

roles = build_family(out=sys.argv[1])
errors = []
for needs_torch in (lambda: build_family(small=True, retrain=True, out=sys.argv[1] + "-small"),
                   lambda: load_hf(roles["core_hf"])):
    try:
        needs_torch()
    except SpecDeskError as e:
        errors.append(str(e))
print(json.dumps({"roles": roles, "errors": errors}))
"""


def test_shipped_family_installs_without_torch(demo_family: dict[str, str], demo_cache_dir: Path,
                                               tmp_path: Path) -> None:
    _ship_small_family(demo_cache_dir, tmp_path / "assets")
    env = {**os.environ, "SPECDESK_ASSETS_DIR": str(tmp_path / "assets"),
           "SPECDESK_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "family"
    done = subprocess.run([sys.executable, "-c", NO_TORCH_INSTALL, str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["errors"] == [
        "training the demo family needs PyTorch: pip install 'specdesk[torch]'",
        "loading an exported demo model into torch needs PyTorch: pip install 'specdesk[torch]'",
    ]
    # Without torch the install writes the very files the session's build (with torch) wrote.
    manifest = json.loads((out / "manifest.json").read_text())
    with_torch = json.loads((Path(demo_family["card"]).parent / "manifest.json").read_text())
    assert manifest["units"] == with_torch["units"]
    assert Path(result["roles"]["target_gguf"]) == (out / "specdesk-demo-target-F16.gguf").resolve()
