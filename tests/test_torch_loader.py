"""Checkpoints in each real format, loaded by tensor name: Llama (single file and sharded
index), grouped-query attention, Qwen2 biases, Qwen3 q/k norms and tied embeddings, MiMo and
DeepSeek MTP layers, z-lab DFlash drafters; and the errors for a missing tensor, a tensor of
the wrong shape, a missing shard and an unsupported config, each naming what is wrong."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from safetensors.numpy import load_file, save_file  # noqa: E402

from specdesk.engines.torch.context import TorchContext, TorchModel  # noqa: E402
from specdesk.engines.torch.dflash import DFlashDrafter  # noqa: E402
from specdesk.engines.torch.loader import open_checkpoint  # noqa: E402
from specdesk.engines.torch.mtp import MtpDrafter, mtp_problem  # noqa: E402
from specdesk.engines.types import SpecDeskError  # noqa: E402

TOKENS = [0, 17, 233, 5, 91, 400, 12, 7, 300, 44]


def read_tensors(folder: Path) -> dict[str, np.ndarray]:
    checkpoint = open_checkpoint(folder)
    tensors: dict[str, np.ndarray] = {}
    for shard in sorted(set(checkpoint.weight_map.values())):
        tensors.update(load_file(str(folder / shard)))
    return tensors


def write_checkpoint(src: Path, dst: Path, edit: Callable[[dict], dict] = lambda t: t, shards: int = 1,
                     config_edit: Callable[[dict], None] = lambda c: None) -> Path:
    """Copy a model folder with its tensors edited, written as one file or `shards` shards plus an index."""
    shutil.copytree(src, dst)
    tensors = edit(read_tensors(src))
    for old in list(dst.glob("*.safetensors")) + list(dst.glob("*.index.json")):
        old.unlink()
    names = sorted(tensors)
    if shards == 1:
        save_file({n: tensors[n] for n in names}, str(dst / "model.safetensors"))
    else:
        weight_map = {}
        for i in range(shards):
            file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = names[i::shards]
            save_file({n: tensors[n] for n in part}, str(dst / file))
            weight_map.update({n: file for n in part})
        (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config = json.loads((dst / "config.json").read_text())
    config_edit(config)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def logits_of(folder: Path, tokens=TOKENS) -> np.ndarray:
    model = TorchModel(folder, "cpu", torch.float32)
    return TorchContext(model, 64).decode(tokens).logits.numpy()


@pytest.fixture(scope="module")
def target(demo_family) -> Path:
    return Path(demo_family["target_hf"])


def test_demo_target_is_a_sharded_mimo_checkpoint(target):
    checkpoint = open_checkpoint(target)
    assert set(checkpoint.weight_map.values()) == {"model.safetensors", "model-mtp.safetensors"}
    assert checkpoint.config["num_nextn_predict_layers"] == 1
    assert checkpoint.has("model.mtp_layers.0.input_proj.weight")
    assert mtp_problem(checkpoint) is None


def test_single_file_and_shards_load_the_same(target, tmp_path):
    single = write_checkpoint(target, tmp_path / "single", shards=1)
    sharded = write_checkpoint(target, tmp_path / "three", shards=3)
    assert len(open_checkpoint(sharded).weight_map) == len(read_tensors(target))
    np.testing.assert_array_equal(logits_of(single), logits_of(sharded))
    np.testing.assert_array_equal(logits_of(single), logits_of(target))


def test_missing_tensor_is_named(target, tmp_path):
    name = "model.layers.1.mlp.up_proj.weight"
    folder = write_checkpoint(target, tmp_path / "missing", edit=lambda t: {k: v for k, v in t.items() if k != name})
    with pytest.raises(SpecDeskError, match=f"tensor {name} is missing"):
        TorchModel(folder, "cpu", torch.float32)


def test_index_naming_a_tensor_its_shard_lacks(target, tmp_path):
    folder = write_checkpoint(target, tmp_path / "lying-index", shards=2)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    name = "model.layers.0.self_attn.o_proj.weight"
    index["weight_map"][name] = next(f for n, f in index["weight_map"].items() if f != index["weight_map"][name])
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(SpecDeskError, match=f"tensor {name} is missing \\(the index says it is here\\)"):
        TorchModel(folder, "cpu", torch.float32)


def test_missing_shard_is_named(target, tmp_path):
    folder = write_checkpoint(target, tmp_path / "no-shard", shards=2)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(SpecDeskError, match="lists shard model-00002-of-00002.safetensors, which is missing"):
        TorchModel(folder, "cpu", torch.float32)


def test_wrong_shape_is_named(target, tmp_path):
    name = "model.layers.0.self_attn.k_proj.weight"

    def shrink(t):
        t[name] = t[name][:-1]
        return t

    folder = write_checkpoint(target, tmp_path / "wrong-shape", edit=shrink)
    with pytest.raises(SpecDeskError, match=f"tensor {name} has shape \\(\\d+, \\d+\\), config.json implies"):
        TorchModel(folder, "cpu", torch.float32)


def test_config_errors_say_what(target, tmp_path):
    folder = write_checkpoint(target, tmp_path / "gemma",
                              config_edit=lambda c: c.update(architectures=["Gemma3ForCausalLM"]))
    with pytest.raises(SpecDeskError, match="architecture Gemma3ForCausalLM is not supported"):
        TorchModel(folder, "cpu", torch.float32)
    folder = write_checkpoint(target, tmp_path / "no-heads", config_edit=lambda c: c.pop("num_attention_heads"))
    with pytest.raises(SpecDeskError, match="config.json has no 'num_attention_heads'"):
        TorchModel(folder, "cpu", torch.float32)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecDeskError, match="config.json is missing"):
        TorchModel(tmp_path / "empty", "cpu", torch.float32)


def _tiny_llama(folder: Path, kv_heads: int, extra_config: dict = {}, seed: int = 0) -> dict[str, np.ndarray]:
    """A random 2-layer Llama-family checkpoint (reusing the demo tokenizer files)."""
    rng = np.random.default_rng(seed)
    d, heads, hd, ffn, vocab = 64, 4, 16, 96, 1024
    tensors = {"model.embed_tokens.weight": rng.standard_normal((vocab, d)), "model.norm.weight": 1 + 0.1 * rng.standard_normal(d),
               "lm_head.weight": rng.standard_normal((vocab, d)) * 0.1}
    for i in range(2):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": 1 + 0.1 * rng.standard_normal(d),
            p + "post_attention_layernorm.weight": 1 + 0.1 * rng.standard_normal(d),
            p + "self_attn.q_proj.weight": rng.standard_normal((heads * hd, d)) * 0.2,
            p + "self_attn.k_proj.weight": rng.standard_normal((kv_heads * hd, d)) * 0.2,
            p + "self_attn.v_proj.weight": rng.standard_normal((kv_heads * hd, d)) * 0.2,
            p + "self_attn.o_proj.weight": rng.standard_normal((d, heads * hd)) * 0.1,
            p + "mlp.gate_proj.weight": rng.standard_normal((ffn, d)) * 0.1,
            p + "mlp.up_proj.weight": rng.standard_normal((ffn, d)) * 0.1,
            p + "mlp.down_proj.weight": rng.standard_normal((d, ffn)) * 0.1,
        })
    tensors = {k: v.astype(np.float32) for k, v in tensors.items()}
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": d,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": hd,
              "intermediate_size": ffn, "num_hidden_layers": 2, "vocab_size": vocab, "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0, "max_position_embeddings": 128, **extra_config}
    return tensors, config


def _save(folder: Path, tensors: dict, config: dict, tokenizer_from: Path) -> Path:
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_from / name, folder / name)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_grouped_query_attention_equals_repeated_heads(target, tmp_path):
    tensors, config = _tiny_llama(tmp_path, kv_heads=2)
    gqa = _save(tmp_path / "gqa", tensors, config, target)
    repeated = dict(tensors)
    for i in range(2):
        for proj in ("k_proj", "v_proj"):
            name = f"model.layers.{i}.self_attn.{proj}.weight"
            repeated[name] = np.repeat(tensors[name].reshape(2, 16, 64), 2, axis=0).reshape(64, 64)
    mha = _save(tmp_path / "mha", repeated, {**config, "num_key_value_heads": 4}, target)
    np.testing.assert_allclose(logits_of(gqa), logits_of(mha), rtol=0, atol=1e-4)


def test_qwen2_biases(target, tmp_path):
    tensors, config = _tiny_llama(tmp_path, kv_heads=2)
    llama = _save(tmp_path / "llama", tensors, config, target)
    zero_bias = dict(tensors)
    for i in range(2):
        for proj, size in (("q_proj", 64), ("k_proj", 32), ("v_proj", 32)):
            zero_bias[f"model.layers.{i}.self_attn.{proj}.bias"] = np.zeros(size, np.float32)
    qwen2 = {**config, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}
    np.testing.assert_allclose(logits_of(_save(tmp_path / "qwen2", zero_bias, qwen2, target)), logits_of(llama),
                               rtol=0, atol=1e-5)
    zero_bias["model.layers.0.self_attn.k_proj.bias"] = np.full(32, 0.5, np.float32)
    assert np.abs(logits_of(_save(tmp_path / "qwen2-bias", zero_bias, qwen2, target)) - logits_of(llama)).max() > 1e-3
    del zero_bias["model.layers.1.self_attn.v_proj.bias"]
    with pytest.raises(SpecDeskError, match="tensor model.layers.1.self_attn.v_proj.bias is missing"):
        TorchModel(_save(tmp_path / "qwen2-no-bias", zero_bias, qwen2, target), "cpu", torch.float32)


def test_qwen3_qk_norm_and_tied_embeddings(target, tmp_path):
    tensors, config = _tiny_llama(tmp_path, kv_heads=2)
    del tensors["lm_head.weight"]
    for i in range(2):
        tensors[f"model.layers.{i}.self_attn.q_norm.weight"] = np.ones(16, np.float32)
        tensors[f"model.layers.{i}.self_attn.k_norm.weight"] = np.full(16, 1.5, np.float32)
    qwen3 = {**config, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "tie_word_embeddings": True}
    logits = logits_of(_save(tmp_path / "qwen3", tensors, qwen3, target))
    model = TorchModel(tmp_path / "qwen3", "cpu", torch.float32)
    hidden = TorchContext(model, 64).decode(TOKENS).hidden
    with torch.inference_mode():
        tied = (hidden @ model.network.model.embed_tokens.weight.T).numpy()
    np.testing.assert_allclose(logits, tied, atol=1e-5)
    del tensors["model.layers.0.self_attn.q_norm.weight"]
    with pytest.raises(SpecDeskError, match="tensor model.layers.0.self_attn.q_norm.weight is missing"):
        TorchModel(_save(tmp_path / "qwen3-no-norm", tensors, qwen3, target), "cpu", torch.float32)


def _to_deepseek(tensors: dict, n_layers: int) -> dict:
    """MiMo MTP tensors renamed and rearranged into DeepSeek-V3's layout (same function)."""
    out = {k: v for k, v in tensors.items() if not k.startswith("model.mtp_layers.")}
    prefix = f"model.layers.{n_layers}."
    renames = {"token_layernorm": "enorm", "hidden_layernorm": "hnorm", "final_layernorm": "shared_head.norm"}
    for name, value in tensors.items():
        if not name.startswith("model.mtp_layers.0."):
            continue
        rest = name.removeprefix("model.mtp_layers.0.")
        module = rest.removesuffix(".weight")
        if module == "input_proj":
            d = value.shape[0]
            out[prefix + "eh_proj.weight"] = np.concatenate([value[:, d:], value[:, :d]], axis=1)  # [emb, hidden]
        else:
            out[prefix + renames.get(module, module) + ".weight"] = value
    out[prefix + "shared_head.head.weight"] = tensors["lm_head.weight"]
    return out


def test_deepseek_mtp_format_drafts_what_mimo_does(target, tmp_path):
    n_layers = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    deepseek = write_checkpoint(target, tmp_path / "deepseek", edit=lambda t: _to_deepseek(t, n_layers), shards=2)
    assert open_checkpoint(deepseek).has(f"model.layers.{n_layers}.eh_proj.weight")
    results = []
    for folder in (target, deepseek):
        model = TorchModel(folder, "cpu", torch.float32)
        head = MtpDrafter.from_target(model, 64)
        assert head.layer.style == ("mimo" if folder == target else "deepseek")
        hidden = TorchContext(model, 64).decode(TOKENS).hidden
        out, logits = head.step(hidden[:-1], TOKENS[1:], 0)
        results.append((out.numpy(), logits.numpy()))
    np.testing.assert_allclose(results[0][0], results[1][0], atol=1e-4)
    np.testing.assert_allclose(results[0][1], results[1][1], atol=1e-3)


def test_mtp_errors_name_the_tensor(target, tmp_path):
    name = "model.mtp_layers.0.input_proj.weight"
    folder = write_checkpoint(target, tmp_path / "mtp-missing", edit=lambda t: {k: v for k, v in t.items() if k != name})
    with pytest.raises(SpecDeskError, match=f"tensor {name} is missing"):
        MtpDrafter.from_target(TorchModel(folder, "cpu", torch.float32), 64)

    def shrink(t):
        t["model.mtp_layers.0.hidden_layernorm.weight"] = t["model.mtp_layers.0.hidden_layernorm.weight"][:-2]
        return t

    folder = write_checkpoint(target, tmp_path / "mtp-shape", edit=shrink)
    with pytest.raises(SpecDeskError, match="tensor model.mtp_layers.0.hidden_layernorm.weight has shape"):
        MtpDrafter.from_target(TorchModel(folder, "cpu", torch.float32), 64)
    folder = write_checkpoint(target, tmp_path / "mtp-none",
                              edit=lambda t: {k: v for k, v in t.items() if ".mtp_layers." not in k})
    with pytest.raises(SpecDeskError, match="neither model.mtp_layers.0.* \\(MiMo\\) nor"):
        MtpDrafter.from_target(TorchModel(folder, "cpu", torch.float32), 64)


def test_dflash_drafter_errors_name_the_problem(demo_family, target, tmp_path):
    source = Path(demo_family["dflash_hf"])
    model = TorchModel(target, "cpu", torch.float32)
    assert DFlashDrafter.from_folder(source, model, 64).config.block_size >= 2

    def drop(t):
        return {k: v for k, v in t.items() if k != "layers.0.self_attn.k_norm.weight"}

    with pytest.raises(SpecDeskError, match="tensor layers.0.self_attn.k_norm.weight is missing"):
        DFlashDrafter.from_folder(write_checkpoint(source, tmp_path / "no-knorm", edit=drop), model, 64)

    def widen_fc(t):
        t["fc.weight"] = np.concatenate([t["fc.weight"], t["fc.weight"][:, :4]], axis=1)
        return t

    with pytest.raises(SpecDeskError, match="tensor fc.weight has shape"):
        DFlashDrafter.from_folder(write_checkpoint(source, tmp_path / "fc", edit=widen_fc), model, 64)
    with pytest.raises(SpecDeskError, match="needs block_size, mask_token_id and target_layer_ids"):
        DFlashDrafter.from_folder(write_checkpoint(source, tmp_path / "no-ids",
                                                   config_edit=lambda c: c["dflash_config"].pop("target_layer_ids")),
                                  model, 64)
    with pytest.raises(SpecDeskError, match="target_layer_ids \\[99\\] do not exist"):
        DFlashDrafter.from_folder(write_checkpoint(source, tmp_path / "deep-ids",
                                                   config_edit=lambda c: c["dflash_config"].update(target_layer_ids=[0, 99])),
                                  model, 64)
    with pytest.raises(SpecDeskError, match="not \\['DFlashDraftModel'\\]: this is not a DFlash drafter"):
        DFlashDrafter.from_folder(target, model, 64)


def test_eagle3_drafter_errors_name_the_problem(target, tmp_path):
    from specdesk.engines.torch.eagle3 import Eagle3Drafter

    from torch_helpers import make_eagle3_checkpoint

    model = TorchModel(target, "cpu", torch.float32)
    good = make_eagle3_checkpoint(target, tmp_path / "eagle3")
    head = Eagle3Drafter.from_folder(good, model, 64)
    assert head.taps == (0, 1, 1) and int(head.d2t_ids.max()) < model.config.vocab_size
    hidden_rows = head.rows_from(TorchContext(model, 64).decode(TOKENS, taps=head.taps), len(TOKENS) - 1)
    _, logits = head.step(hidden_rows, TOKENS[1:], 0)
    assert torch.isinf(logits).sum() == model.config.vocab_size - 512  # only draft-vocabulary tokens
    with pytest.raises(SpecDeskError, match="tensor d2t is missing \\(needed for a draft vocabulary of 512"):
        Eagle3Drafter.from_folder(write_checkpoint(good, tmp_path / "no-d2t",
                                                edit=lambda t: {k: v for k, v in t.items() if k != "d2t"}), model, 64)

    def bad_fc(t):
        t["fc.weight"] = t["fc.weight"][:, :-3]
        return t

    with pytest.raises(SpecDeskError, match="tensor fc.weight has shape"):
        Eagle3Drafter.from_folder(write_checkpoint(good, tmp_path / "fc", edit=bad_fc), model, 64)
    with pytest.raises(SpecDeskError, match="tensor midlayer.hidden_norm.weight is missing"):
        Eagle3Drafter.from_folder(write_checkpoint(good, tmp_path / "no-norm", edit=lambda t: {
            k: v for k, v in t.items() if k != "midlayer.hidden_norm.weight"}), model, 64)
    defaults = make_eagle3_checkpoint(target, tmp_path / "default-layers", aux_layers=[])
    with pytest.raises(SpecDeskError, match="auxiliary layers \\[2, -1\\] do not exist in a target of 2 layers"):
        Eagle3Drafter.from_folder(defaults, model, 64)
    with pytest.raises(SpecDeskError, match="not \\['LlamaForCausalLMEagle3'\\]"):
        Eagle3Drafter.from_folder(target, model, 64)
