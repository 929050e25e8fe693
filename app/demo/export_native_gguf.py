"""GGUF files for llama.cpp's native drafters: an MTP-carrying target and a DFlash drafter.

MTP. llama.cpp's `llama` architecture has no NextN layers, so the demo target is written a
second time as `glm4moe`, an architecture whose loader and MTP graph take them (vendor
src/models/glm4-moe.cpp, conversion/glm.py). With every trunk layer dense
(leading_dense_block_count = num_hidden_layers), no Q/K norm, full rotary dimension and
NeoX RoPE on HF-ordered Q/K rows, a glm4moe trunk computes exactly the LlamaForCausalLM the
demo target is: the same weights, the same function. The NextN block needs a mixture of
experts; one routed expert plus one shared expert whose halves of the intermediate units
sum to the block's dense MLP is that MLP exactly (the one routed weight normalises to 1).
The NextN block computes h = eh_proj([enorm(emb(x_{p+1})), hnorm(h_p)]) -> decoder block ->
shared_head_norm -> lm head, where h_p is the target's final-normed hidden state. A target
given as a GGUF alone (llama, qwen2, qwen3) is written the same way from its own tensors, their
bytes and types kept (export_mtp_target_from_gguf): Qwen's biases and q/k norms are glm4moe
tensors too, and a llama file's Q/K rows go back to the rotate-half order NeoX RoPE reads.

DFlash. A z-lab DFlashDraftModel folder becomes a `dflash` GGUF as conversion/qwen.py's
DFlashModel writes it: Qwen3 layers (NeoX RoPE, Q/K norm), fc, enc.output_norm (the
hidden_norm), output_norm, `dflash.target_layers` = target_layer_ids + 1 (llama.cpp reads
the *input* of those layers, z-lab the output of the layer before), the target's vocabulary
and mask token; the token embeddings and lm head are the target's, shared at run time. A
DeepSpec DSpark folder (Qwen3DSparkModel: the same backbone, its keys at the top level) is
written the same way as conversion/qwen.py's DSparkModel writes it, plus `markov_w1` and
`markov_w2` and `dflash.sample_from_anchor`; llama.cpp runs it as draft-dspark.

Without trained weights (no MTP tensors in the checkpoint, no DFlash folder) both are
initialised from a fixed seed: losslessness holds for any drafter weights, so tests can run
before a trained drafter exists; the benchmark should use trained ones.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Mapping, Optional

import gguf
import numpy as np
from safetensors.numpy import load_file

from specdesk.app.storage.paths import building
from specdesk.engines.types import SpecDeskError

from .export_gguf import ROPE_SCALING_KEYS, copy_vocab as _copy_vocab
from .export_hf import atomic_path

NATIVE_EXPORT_VERSION = 1
MTP_ARCH = "glm4moe"
DFLASH_ARCH = "dflash"
DEFAULT_BLOCK_SIZE = 8


# --- shared pieces -----------------------------------------------------------------------
def _read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise SpecDeskError(f"{folder}: no config.json, so this is not a Hugging Face model folder")
    return json.loads(path.read_text(encoding="utf-8"))


def _weights(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of the folder: model.safetensors and any further shards (an MTP layer may
    live in its own shard, named by model.safetensors.index.json)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    weights: dict[str, np.ndarray] = {}
    for shard in shards:
        if not (folder / shard).is_file():
            raise SpecDeskError(f"{folder}: no {shard}")
        weights.update(load_file(str(folder / shard)))
    return weights


def _add(writer: gguf.GGUFWriter, name: str, data: np.ndarray) -> None:
    # 1-D tensors (norms, biases) stay F32 as llama.cpp's kernels expect; matrices are F16.
    dtype = np.float32 if data.ndim <= 1 or name.endswith("ffn_gate_inp.weight") else np.float16
    writer.add_tensor(name, np.ascontiguousarray(np.asarray(data, dtype=np.float32).astype(dtype)))


def _finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _rng(seed: int, *parts: str) -> np.random.Generator:
    digest = hashlib.sha256(("/".join(parts) + f"/{seed}").encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


# --- MTP ---------------------------------------------------------------------------------
BLOCK_SUFFIXES = (
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)
# Qwen2's q/k/v biases and Qwen3's q/k norms: glm4moe's blocks take both (attn_q.bias ...,
# attn_q_norm), so a block that has them keeps them
OPTIONAL_BLOCK_SUFFIXES = (
    "self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias", "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
)


def _block(weights: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    block = {suffix: weights[prefix + suffix] for suffix in BLOCK_SUFFIXES}
    block.update({suffix: weights[prefix + suffix] for suffix in OPTIONAL_BLOCK_SUFFIXES if prefix + suffix in weights})
    return block


def find_mtp_layer(weights: Mapping[str, np.ndarray], n_layer: int) -> Optional[dict[str, np.ndarray]]:
    """The first MTP layer in an HF state dict, in DeepSeek-V3 names (eh_proj/enorm/hnorm/shared_head
    at model.layers.{n_layer}) or MiMo names (model.mtp_layers.0: input_proj/token_layernorm/
    hidden_layernorm/final_layernorm), as {eh_proj, enorm, hnorm, head_norm?, head?, block...}; None
    when the checkpoint has none."""
    deepseek = f"model.layers.{n_layer}."
    mimo = "model.mtp_layers.0."
    if deepseek + "eh_proj.weight" in weights:
        p = deepseek
        out = {"eh_proj": weights[p + "eh_proj.weight"], "enorm": weights[p + "enorm.weight"],
               "hnorm": weights[p + "hnorm.weight"]}
        if p + "shared_head.norm.weight" in weights:
            out["head_norm"] = weights[p + "shared_head.norm.weight"]
        if p + "shared_head.head.weight" in weights:
            out["head"] = weights[p + "shared_head.head.weight"]
    elif mimo + "input_proj.weight" in weights:
        p = mimo
        proj = weights[p + "input_proj.weight"]  # MiMo concatenates [hidden, token]; llama.cpp [token, hidden]
        half = proj.shape[1] // 2
        out = {"eh_proj": np.concatenate([proj[:, half:], proj[:, :half]], axis=1),
               "enorm": weights[p + "token_layernorm.weight"], "hnorm": weights[p + "hidden_layernorm.weight"]}
        if p + "final_layernorm.weight" in weights:
            out["head_norm"] = weights[p + "final_layernorm.weight"]
    else:
        return None
    for suffix in BLOCK_SUFFIXES:
        if p + suffix not in weights:
            raise SpecDeskError(f"the MTP layer at {p}* has no {suffix}: it is not a full decoder block")
    out.update(_block(weights, p))
    return out


def initial_mtp_layer(weights: Mapping[str, np.ndarray], config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """A deterministic MTP layer for plumbing tests: the target's last decoder block, fed
    eh_proj([e, h]) = e + h plus a small fixed perturbation."""
    d = config["hidden_size"]
    last = f"model.layers.{config['num_hidden_layers'] - 1}."
    eye = np.eye(d, dtype=np.float32)
    noise = _rng(seed, "mtp", "eh_proj").standard_normal((d, 2 * d)).astype(np.float32) * (0.02 / np.sqrt(d))
    out = {"eh_proj": np.concatenate([eye, eye], axis=1) + noise,
           "enorm": np.ones(d, np.float32), "hnorm": np.ones(d, np.float32)}
    for suffix in BLOCK_SUFFIXES:
        out[suffix] = np.asarray(weights[last + suffix], dtype=np.float32)
    return out


def _expert_ffn(shape: Mapping) -> int:
    """The NextN block's routed and shared experts each take half its MLP's units (the first
    half rounded up; _write_block zero-pads the shared one)."""
    return (int(shape["intermediate_size"]) + 1) // 2


def _mtp_target_writer(path: Path, shape: Mapping, name: str, target_gguf: Path,
                       file_type: int = gguf.LlamaFileType.MOSTLY_F16) -> gguf.GGUFWriter:
    """A glm4moe writer holding every key of a target of `shape` (config.json's names) with one
    NextN layer: its trunk all dense (leading_dense_block_count = num_hidden_layers), the NextN
    block's one routed and one shared expert, and the target GGUF's vocabulary. Both exports
    write their header here, so an MTP target is described one way whatever its source."""
    n_layer = int(shape["num_hidden_layers"])
    head_dim = int(shape["head_dim"])
    writer = gguf.GGUFWriter(path, MTP_ARCH)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name)
    writer.add_block_count(n_layer + 1)
    writer.add_nextn_predict_layers(1)
    writer.add_context_length(int(shape["max_position_embeddings"]))
    writer.add_embedding_length(int(shape["hidden_size"]))
    writer.add_feed_forward_length(int(shape["intermediate_size"]))
    writer.add_head_count(int(shape["num_attention_heads"]))
    writer.add_head_count_kv(int(shape["num_key_value_heads"]))
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(shape["rope_theta"])
    writer.add_layer_norm_rms_eps(shape["rms_norm_eps"])
    writer.add_leading_dense_block_count(n_layer)
    writer.add_expert_count(1)
    writer.add_expert_used_count(1)
    writer.add_expert_shared_count(1)
    writer.add_expert_feed_forward_length(_expert_ffn(shape))
    writer.add_expert_weights_scale(1.0)
    writer.add_expert_weights_norm(True)
    writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    writer.add_file_type(file_type)
    writer.add_vocab_size(int(shape["vocab_size"]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _copy_vocab(writer, target_gguf)
    return writer


def _write_nextn(writer: gguf.GGUFWriter, n_layer: int, mtp: Mapping[str, np.ndarray], ffn_exp: int) -> None:
    """The NextN block at index n_layer (find_mtp_layer's dict)."""
    _write_block(writer, n_layer, mtp, dense=False, ffn_exp=ffn_exp)
    _add(writer, f"blk.{n_layer}.nextn.eh_proj.weight", mtp["eh_proj"])
    _add(writer, f"blk.{n_layer}.nextn.enorm.weight", mtp["enorm"])
    _add(writer, f"blk.{n_layer}.nextn.hnorm.weight", mtp["hnorm"])
    if "head_norm" in mtp:
        _add(writer, f"blk.{n_layer}.nextn.shared_head_norm.weight", mtp["head_norm"])
    if "head" in mtp:
        _add(writer, f"blk.{n_layer}.nextn.shared_head_head.weight", mtp["head"])


def export_mtp_target(target_hf: Path, target_gguf: Path, out_path: Path, seed: int = 0) -> Path:
    """The HF target (with its MTP layer, or a seeded one) as a glm4moe GGUF with one NextN layer."""
    target_hf, target_gguf = Path(target_hf), Path(target_gguf)
    config = _read_config(target_hf)
    weights = _weights(target_hf)
    n_layer, d = config["num_hidden_layers"], config["hidden_size"]
    n_head = config["num_attention_heads"]
    shape = {"num_hidden_layers": n_layer, "hidden_size": d, "intermediate_size": config["intermediate_size"],
             "num_attention_heads": n_head, "num_key_value_heads": config.get("num_key_value_heads", n_head),
             "head_dim": config.get("head_dim") or d // n_head,
             "max_position_embeddings": config.get("max_position_embeddings", 2048),
             "rope_theta": config.get("rope_theta", 10000.0), "rms_norm_eps": config.get("rms_norm_eps", 1e-5),
             "vocab_size": config["vocab_size"]}
    mtp = find_mtp_layer(weights, n_layer)
    trained = mtp is not None
    if mtp is None:
        mtp = initial_mtp_layer(weights, config, seed)

    with atomic_path(Path(out_path)) as tmp:
        writer = _mtp_target_writer(tmp, shape, "specdesk-demo-target-mtp" if trained else "specdesk-demo-target-mtp-init",
                                    target_gguf)
        _add(writer, "token_embd.weight", weights["model.embed_tokens.weight"])
        _add(writer, "output_norm.weight", weights["model.norm.weight"])
        _add(writer, "output.weight", weights.get("lm_head.weight", weights["model.embed_tokens.weight"]))
        for i in range(n_layer):
            _write_block(writer, i, _block(weights, f"model.layers.{i}."), dense=True)
        _write_nextn(writer, n_layer, mtp, _expert_ffn(shape))
        _finish(writer)
    return Path(out_path)


def _write_block(writer: gguf.GGUFWriter, i: int, block: Mapping[str, np.ndarray], dense: bool,
                 ffn_exp: int = 0) -> None:
    """One decoder block; Q/K rows stay in HF order (glm4moe uses NeoX RoPE)."""
    b = f"blk.{i}."
    _add(writer, b + "attn_norm.weight", block["input_layernorm.weight"])
    _add(writer, b + "attn_q.weight", block["self_attn.q_proj.weight"])
    _add(writer, b + "attn_k.weight", block["self_attn.k_proj.weight"])
    _add(writer, b + "attn_v.weight", block["self_attn.v_proj.weight"])
    for hf, native in (("self_attn.q_proj.bias", "attn_q.bias"), ("self_attn.k_proj.bias", "attn_k.bias"),
                       ("self_attn.v_proj.bias", "attn_v.bias"), ("self_attn.q_norm.weight", "attn_q_norm.weight"),
                       ("self_attn.k_norm.weight", "attn_k_norm.weight")):
        if hf in block:
            _add(writer, b + native, block[hf])
    _add(writer, b + "attn_output.weight", block["self_attn.o_proj.weight"])
    _add(writer, b + "post_attention_norm.weight", block["post_attention_layernorm.weight"])
    gate, up, down = (np.asarray(block[f"mlp.{n}_proj.weight"], np.float32) for n in ("gate", "up", "down"))
    if dense:
        _add(writer, b + "ffn_gate.weight", gate)
        _add(writer, b + "ffn_up.weight", up)
        _add(writer, b + "ffn_down.weight", down)
        return
    # SwiGLU is a sum over intermediate units, so splitting them between the routed and the
    # shared expert (zero-padding an odd count) keeps the MLP exact.
    pad = 2 * ffn_exp - gate.shape[0]
    if pad:
        gate = np.concatenate([gate, np.zeros((pad, gate.shape[1]), np.float32)])
        up = np.concatenate([up, np.zeros((pad, up.shape[1]), np.float32)])
        down = np.concatenate([down, np.zeros((down.shape[0], pad), np.float32)], axis=1)
    d = gate.shape[1]
    _add(writer, b + "ffn_gate_inp.weight", np.zeros((1, d), np.float32))
    _add(writer, b + "exp_probs_b.bias", np.zeros(1, np.float32))
    _add(writer, b + "ffn_gate_exps.weight", gate[None, :ffn_exp])
    _add(writer, b + "ffn_up_exps.weight", up[None, :ffn_exp])
    _add(writer, b + "ffn_down_exps.weight", down[None, :, :ffn_exp])
    _add(writer, b + "ffn_gate_shexp.weight", gate[ffn_exp:])
    _add(writer, b + "ffn_up_shexp.weight", up[ffn_exp:])
    _add(writer, b + "ffn_down_shexp.weight", down[:, ffn_exp:])


# --- MTP for a GGUF target: its own tensors, bit for bit -----------------------------------
# The architectures whose blocks a glm4moe trunk computes, and the order of their Q/K rows in
# the file: llama's converter interleaves each head's rotary pairs for llama.cpp's normal RoPE
# (LlamaModel.permute), Qwen's keep Hugging Face's rotate-half order, which is NeoX RoPE's, the
# one glm4moe uses. gguf_target.ARCHITECTURES trains for the same three.
GGUF_SOURCES = {"llama": "interleaved", "qwen2": "neox", "qwen3": "neox"}
# A block's tensors that a glm4moe block holds, by their names there; whatever else a source
# file holds would change what the copy computes if left out (rope_freqs: Llama 3's rope
# scaling; attn_output, ffn or output biases; experts; a fused attn_qkv), so it is refused.
GGUF_BLOCK_TENSORS = {
    "attn_norm.weight": "attn_norm.weight", "attn_q.weight": "attn_q.weight", "attn_k.weight": "attn_k.weight",
    "attn_v.weight": "attn_v.weight", "attn_q.bias": "attn_q.bias", "attn_k.bias": "attn_k.bias",
    "attn_v.bias": "attn_v.bias", "attn_q_norm.weight": "attn_q_norm.weight",
    "attn_k_norm.weight": "attn_k_norm.weight", "attn_output.weight": "attn_output.weight",
    "ffn_norm.weight": "post_attention_norm.weight", "ffn_gate.weight": "ffn_gate.weight",
    "ffn_up.weight": "ffn_up.weight", "ffn_down.weight": "ffn_down.weight",
}
GGUF_REQUIRED_BLOCK_TENSORS = ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                               "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
                               "ffn_down.weight")
GGUF_TOP_TENSORS = ("token_embd.weight", "output_norm.weight", "output.weight")  # output: absent when tied


def _uniform(header, key: str, default=None):
    """`{arch}.{key}`; a per-layer array only when every layer has the same value (else None)."""
    value = header.arch_value(key, default)
    if isinstance(value, (list, tuple)):
        return value[0] if value and all(v == value[0] for v in value) else None
    return value


def mtp_copy_problems(header) -> list[str]:
    """What keeps a GGUF target (engines/llama/header.GgufHeader) from a lossless glm4moe copy
    with a NextN layer: another architecture, a tensor the copy would have to drop, per-layer
    shapes that differ, a type gguf does not know. Empty when the copy computes what the file does."""
    arch = header.architecture
    if arch not in GGUF_SOURCES:
        return [f"architecture {arch!r} is not one a glm4moe copy can carry (supported: {', '.join(GGUF_SOURCES)})"]
    problems = []
    n_layer = header.arch_value("block_count")
    if not isinstance(n_layer, int) or n_layer <= 0:
        return [f"{arch}.block_count is {n_layer!r}"]
    for key in ("attention.head_count", "attention.head_count_kv", "feed_forward_length"):
        if header.arch_value(key) is not None and _uniform(header, key) is None:
            problems.append(f"{arch}.{key} differs between layers, which a glm4moe copy cannot say")
    if header.arch_value("expert_count"):
        problems.append(f"{arch}.expert_count is {header.arch_value('expert_count')}: a mixture of experts "
                        "is not carried")
    key_length, value_length = header.arch_value("attention.key_length"), header.arch_value("attention.value_length")
    if key_length is not None and value_length is not None and key_length != value_length:
        problems.append(f"key length {key_length} and value length {value_length} differ")
    names = header.tensor_infos
    for name in ("token_embd.weight", "output_norm.weight"):
        if name not in names:
            problems.append(f"it has no {name}")
    for i in range(n_layer):
        missing = [t for t in GGUF_REQUIRED_BLOCK_TENSORS if f"blk.{i}.{t}" not in names]
        if missing:
            problems.append(f"block {i} has no {', '.join(missing)}")
            break
    for name, info in names.items():
        block = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
        known = name in GGUF_TOP_TENSORS or (block is not None and int(block[1]) < n_layer
                                             and block[2] in GGUF_BLOCK_TENSORS)
        if not known:
            problems.append(f"tensor {name} has no place in a glm4moe copy (leaving it out would change "
                            "what the model computes)")
        else:
            try:
                gguf.GGMLQuantizationType(info.ggml_type)
            except ValueError:
                problems.append(f"tensor {name} is of type {info.type_name}, which the gguf package does not know")
    return problems


def check_mtp_copy_source(target_gguf: Path):
    """The validated header of a GGUF target a glm4moe copy can be made of, else a SpecDeskError
    naming the file and every problem."""
    from specdesk.engines.llama.binding import validated_header

    header = validated_header(target_gguf)
    problems = mtp_copy_problems(header)
    if problems:
        raise SpecDeskError(f"{target_gguf}: cannot write it again with an MTP layer: {'; '.join(problems)}")
    return header


def _neox_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """The rows of a llama GGUF's Q or K (each head's rotary pairs interleaved) in Hugging Face's
    rotate-half order, the inverse of export_gguf.permute_rope_rows. Whole rows move, so a
    quantized tensor keeps its bytes."""
    return rows.reshape(n_head, rows.shape[0] // n_head // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def _add_raw(writer: gguf.GGUFWriter, name: str, data: np.ndarray, info, n_head: int = 0) -> None:
    """A source tensor's bytes under `name`, its type kept; with n_head, its rows (Q or K, or their
    biases) reordered from interleaved rotary pairs to rotate-half."""
    qtype = gguf.GGMLQuantizationType(info.ggml_type)
    shape = tuple(reversed(info.shape))  # numpy order: the row length last
    outer = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    raw = data[info.offset:info.end].reshape(shape[:-1] + (info.n_bytes // outer,))
    if n_head:
        block_size = gguf.GGML_QUANT_SIZES[qtype][0]
        if len(shape) == 1 and block_size != 1:
            raise SpecDeskError(f"{name} is a {info.type_name} vector, whose elements cannot be reordered")
        rows = raw.reshape(shape[0], -1) if len(shape) == 1 else raw
        raw = _neox_rows(rows, n_head).reshape(raw.shape)
    writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)


def _copy_arch_keys(writer: gguf.GGUFWriter, header, keys: Mapping[str, gguf.GGUFValueType]) -> None:
    for key, value_type in keys.items():
        value = header.arch_value(key)
        if value is not None:
            writer.add_key_value(f"{MTP_ARCH}.{key}", value, value_type)


def export_mtp_target_from_gguf(mtp_folder: Path, target_gguf: Path, out_path: Path) -> Path:
    """A GGUF target (llama, qwen2 or qwen3) written again as glm4moe with the MTP layer of
    `mtp_folder` (a Hugging Face folder holding it in MiMo or DeepSeek names) as its NextN
    layer. The target's tensors are its own bytes in their own types, renamed into the glm4moe
    layout export_mtp_target writes (ffn_norm -> post_attention_norm; a llama file's Q/K rows
    back in rotate-half order for NeoX RoPE), so the copy computes what the file computes; the
    layer is F16. Whatever the copy could not carry is refused by name before anything is written."""
    mtp_folder, target_gguf = Path(mtp_folder), Path(target_gguf)
    header = check_mtp_copy_source(target_gguf)
    arch = header.architecture
    n_layer, d = int(header.arch_value("block_count")), int(header.arch_value("embedding_length"))
    n_head = int(_uniform(header, "attention.head_count"))
    n_head_kv = int(_uniform(header, "attention.head_count_kv", n_head))
    infos = header.tensor_infos
    shape = {"num_hidden_layers": n_layer, "hidden_size": d,
             "intermediate_size": int(_uniform(header, "feed_forward_length")),
             "num_attention_heads": n_head, "num_key_value_heads": n_head_kv,
             "head_dim": int(header.arch_value("attention.key_length", d // n_head)),
             "max_position_embeddings": int(header.arch_value("context_length")),
             "rope_theta": float(header.arch_value("rope.freq_base", 10000.0)),
             "rms_norm_eps": float(header.arch_value("attention.layer_norm_rms_epsilon")),
             "vocab_size": int(infos["token_embd.weight"].shape[1])}
    mtp = find_mtp_layer(_weights(mtp_folder), n_layer)
    if mtp is None:
        raise SpecDeskError(f"{mtp_folder}: no MTP layer (model.mtp_layers.0.* or model.layers.{n_layer}.eh_proj)")
    if mtp["eh_proj"].shape != (d, 2 * d) or mtp["mlp.gate_proj.weight"].shape[0] != shape["intermediate_size"]:
        raise SpecDeskError(f"{mtp_folder}: its MTP layer does not fit {target_gguf} (eh_proj "
                            f"{tuple(mtp['eh_proj'].shape)}, the target is {d} wide with "
                            f"{shape['intermediate_size']} MLP units)")
    interleaved = GGUF_SOURCES[arch] == "interleaved"
    name = str(header.fields.get("general.name") or target_gguf.stem) + "-mtp"
    file_type = int(header.fields.get("general.file_type", gguf.LlamaFileType.MOSTLY_F16))
    data = np.memmap(target_gguf, dtype=np.uint8, mode="r")
    with atomic_path(Path(out_path)) as tmp:
        writer = _mtp_target_writer(tmp, shape, name, target_gguf, file_type)
        _copy_arch_keys(writer, header, ROPE_SCALING_KEYS)
        for tensor, info in infos.items():
            block = re.fullmatch(r"blk\.(\d+)\.(.+)", tensor)
            if block is None:
                _add_raw(writer, tensor, data, info)
                continue
            part = block[2]
            heads = {"attn_q": n_head, "attn_k": n_head_kv}.get(part.split(".")[0], 0) if interleaved else 0
            _add_raw(writer, f"blk.{block[1]}.{GGUF_BLOCK_TENSORS[part]}", data, info, heads)
        _write_nextn(writer, n_layer, mtp, _expert_ffn(shape))
        _finish(writer)
    del data
    return Path(out_path)


# --- DFlash ------------------------------------------------------------------------------
def _common_token(target_hf: Path) -> int:
    """The most frequent token of the sample code prompts under the target's tokenizer."""
    from collections import Counter

    from tokenizers import Tokenizer

    from ..storage.paths import assets_dir

    tokenizer = Tokenizer.from_file(str(target_hf / "tokenizer.json"))
    counts: Counter = Counter()
    for line in (assets_dir() / "prompts" / "code.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            counts.update(tokenizer.encode(json.loads(line)["prompt"], add_special_tokens=False).ids)
    return counts.most_common(1)[0][0]


def initial_dflash_folder(target_hf: Path, seed: int = 0, block_size: int = DEFAULT_BLOCK_SIZE,
                          n_layers: int = 1) -> tuple[dict, dict[str, np.ndarray]]:
    """(config, weights) of a seeded z-lab-format drafter for the target in `target_hf`: one
    Qwen3 layer the target's width, reading the outputs of the target's first and
    second-to-last layers.

    Untrained, it still drafts something the target often says: it carries its own copy of
    the target's embeddings and head, with the mask token's embedding set (least squares) so
    that the head maps it to the sample prompts' most frequent token, and the layer's
    attention and MLP outputs scaled down so that the mask rows stay near that embedding."""
    target_hf = Path(target_hf)
    target_config = _read_config(target_hf)
    target = _weights(target_hf)
    d = target_config["hidden_size"]
    n_head = target_config["num_attention_heads"]
    head_dim = target_config.get("head_dim") or d // n_head
    n_target = target_config["num_hidden_layers"]
    vocab = target_config["vocab_size"]
    layer_ids = sorted({0, max(0, n_target - 2)})
    ffn = target_config["intermediate_size"]
    mask_id = vocab - 1
    config = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": d,
        "num_hidden_layers": n_layers, "num_attention_heads": n_head, "num_key_value_heads": n_head,
        "head_dim": head_dim, "intermediate_size": ffn, "rms_norm_eps": target_config.get("rms_norm_eps", 1e-5),
        "rope_theta": target_config.get("rope_theta", 10000.0), "vocab_size": vocab,
        "max_position_embeddings": target_config.get("max_position_embeddings", 2048),
        "num_target_layers": n_target, "block_size": block_size,
        "dflash_config": {"mask_token_id": mask_id, "target_layer_ids": layer_ids},
    }
    rng = _rng(seed, "dflash")
    inner = n_head * head_dim

    def mat(rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * (scale / np.sqrt(cols))).astype(np.float32)

    head = np.asarray(target.get("lm_head.weight", target["model.embed_tokens.weight"]), np.float32)
    embed = np.asarray(target["model.embed_tokens.weight"], np.float32).copy()
    common = _common_token(target_hf)
    goal = np.full(vocab, -1.0, np.float32)
    goal[common] = 8.0
    mask_vector = np.linalg.lstsq(head, goal, rcond=None)[0].astype(np.float32)
    mask_vector /= np.sqrt(np.mean(mask_vector ** 2))
    if int(np.argmax(head @ mask_vector)) != common:  # pragma: no cover - depends on the weights
        raise SpecDeskError("could not place the seeded DFlash drafter's mask embedding")
    embed[mask_id] = mask_vector

    weights = {"fc.weight": mat(d, len(layer_ids) * d), "hidden_norm.weight": np.ones(d, np.float32),
               "norm.weight": np.ones(d, np.float32), "embed_tokens.weight": embed, "lm_head.weight": head}
    for i in range(n_layers):
        p = f"layers.{i}."
        weights.update({
            p + "input_layernorm.weight": np.ones(d, np.float32),
            p + "post_attention_layernorm.weight": np.ones(d, np.float32),
            p + "self_attn.q_proj.weight": mat(inner, d), p + "self_attn.k_proj.weight": mat(inner, d),
            p + "self_attn.v_proj.weight": mat(inner, d), p + "self_attn.o_proj.weight": mat(d, inner, 0.1),
            p + "self_attn.q_norm.weight": np.ones(head_dim, np.float32),
            p + "self_attn.k_norm.weight": np.ones(head_dim, np.float32),
            p + "mlp.gate_proj.weight": mat(ffn, d), p + "mlp.up_proj.weight": mat(ffn, d),
            p + "mlp.down_proj.weight": mat(d, ffn, 0.1),
        })
    return config, weights


def export_dflash(config: dict, weights: Mapping[str, np.ndarray], target_gguf: Path, out_path: Path,
                  name: str = "specdesk-demo-dflash") -> Path:
    """A z-lab DFlashDraftModel or DeepSpec DSpark (config.json + state dict) as a dflash GGUF
    for `target_gguf`."""
    dflash = config.get("dflash_config", {})
    layer_ids = dflash.get("target_layer_ids", config.get("target_layer_ids"))
    mask_id = dflash.get("mask_token_id", config.get("mask_token_id"))
    if not layer_ids or mask_id is None:
        raise SpecDeskError("the DFlash config has no dflash_config.target_layer_ids or mask_token_id")
    block_size = int(dflash.get("block_size", config.get("block_size", 16)))
    d, n_head = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or d // n_head
    weights = {re.sub(r"^model\.", "", k): v for k, v in weights.items()}
    n_layers = config["num_hidden_layers"]
    markov = "markov_head.markov_w1.weight" in weights
    if "markov_rank" in config and not markov:
        raise SpecDeskError("the DSpark checkpoint has no tensor markov_head.markov_w1.weight: llama.cpp runs a "
                            "DSpark drafter only with its Markov head")
    if markov and config.get("markov_head_type", "vanilla") != "vanilla":
        raise SpecDeskError(f"markov_head_type {config['markov_head_type']!r} cannot be written: llama.cpp runs "
                            "only a 'vanilla' Markov head")

    with atomic_path(Path(out_path)) as tmp:
        writer = gguf.GGUFWriter(tmp, DFLASH_ARCH)
        writer.add_type(gguf.GGUFType.MODEL)
        writer.add_name(name)
        writer.add_block_count(n_layers)
        writer.add_context_length(config.get("max_position_embeddings", 2048))
        writer.add_embedding_length(d)
        writer.add_feed_forward_length(config["intermediate_size"])
        writer.add_head_count(n_head)
        writer.add_head_count_kv(config.get("num_key_value_heads", n_head))
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_rope_dimension_count(head_dim)
        writer.add_rope_freq_base(config.get("rope_theta", 10000.0))
        writer.add_layer_norm_rms_eps(config.get("rms_norm_eps", 1e-6))
        writer.add_uint32(f"{DFLASH_ARCH}.block_size", block_size)
        writer.add_array(f"{DFLASH_ARCH}.target_layers", [int(i) + 1 for i in layer_ids])
        writer.add_bool(f"{DFLASH_ARCH}.attention.causal", bool(dflash.get("causal", config.get("is_causal", False))))
        if markov:  # DSpark: anchor-first blocks unless the config says otherwise; no confidence head is written
            writer.add_bool(f"{DFLASH_ARCH}.sample_from_anchor", bool(config.get("sample_from_anchor", True)))
            writer.add_bool(f"{DFLASH_ARCH}.has_confidence_head", False)
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        writer.add_vocab_size(config["vocab_size"])
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        _copy_vocab(writer, Path(target_gguf), mask_token_id=int(mask_id))

        _add(writer, "fc.weight", weights["fc.weight"])
        _add(writer, "enc.output_norm.weight", weights["hidden_norm.weight"])
        _add(writer, "output_norm.weight", weights["norm.weight"])
        if "embed_tokens.weight" in weights:  # a drafter with its own embeddings carries its own head too
            _add(writer, "token_embd.weight", weights["embed_tokens.weight"])
            _add(writer, "output.weight", weights["lm_head.weight"])
        if markov:  # [V, r] each: llama.cpp's {r, n_vocab} and {r, n_vocab_draft}
            _add(writer, "markov_w1.weight", weights["markov_head.markov_w1.weight"])
            _add(writer, "markov_w2.weight", weights["markov_head.markov_w2.weight"])
        names = {
            "input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
            "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
            "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_norm.weight": "attn_q_norm.weight",
            "self_attn.k_norm.weight": "attn_k_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
            "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
            "mlp.down_proj.weight": "ffn_down.weight",
        }
        for i in range(n_layers):
            for hf, native in names.items():
                key = f"layers.{i}.{hf}"
                if key not in weights:
                    raise SpecDeskError(f"the DFlash checkpoint has no tensor {key}")
                _add(writer, f"blk.{i}.{native}", weights[key])
        _finish(writer)
    return Path(out_path)


def export_dflash_folder(folder: Path, target_gguf: Path, out_path: Path) -> Path:
    folder = Path(folder)
    return export_dflash(_read_config(folder), _weights(folder), target_gguf, out_path,
                         name=f"{folder.name}-dflash")


# --- the demo family's native files ------------------------------------------------------
def _digest(paths: list[Path], extra: str) -> str:
    h = hashlib.sha256(f"{NATIVE_EXPORT_VERSION}:{extra}".encode())
    for path in paths:
        files = sorted(p for p in Path(path).rglob("*") if p.is_file()) if Path(path).is_dir() else [Path(path)]
        for f in files:
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{int(st.st_mtime)}".encode())
    return h.hexdigest()[:16]


def build_native(family: Mapping[str, str], out_dir: Optional[Path] = None, seed: int = 0) -> dict[str, str]:
    """mtp_gguf, dflash_gguf and eagle3_gguf for a demo family (roles from build_family), and
    dspark_gguf where it has a DSpark drafter, cached under out_dir/<fingerprint of the inputs>.
    The DFlash drafter and the EAGLE-3 head are the family's `dflash_hf` and `eagle3_hf` folders
    when it has them, else seeded ones."""
    target_hf, target_gguf = Path(family["target_hf"]), Path(family["target_gguf"])
    dflash_hf = Path(family["dflash_hf"]) if family.get("dflash_hf") else None
    eagle3_hf = Path(family["eagle3_hf"]) if family.get("eagle3_hf") else None
    dspark_hf = Path(family["dspark_hf"]) if family.get("dspark_hf") else None
    inputs = [target_hf, target_gguf] + [p for p in (dflash_hf, eagle3_hf, dspark_hf) if p is not None]
    key = _digest(inputs, f"seed={seed}")
    out_dir = (Path(out_dir) if out_dir is not None else target_gguf.parent / "native") / key
    mtp_path = out_dir / "specdesk-demo-target-mtp-F16.gguf"
    dflash_path = out_dir / "specdesk-demo-dflash-F16.gguf"
    dspark_path = out_dir / "specdesk-demo-dspark-F16.gguf"
    with building(out_dir):
        if not mtp_path.is_file():
            export_mtp_target(target_hf, target_gguf, mtp_path, seed)
        unusable = dflash_problem(dflash_hf, target_hf) if dflash_hf is not None else "the family has no DFlash drafter"
        if not dflash_path.is_file():
            if not unusable:
                export_dflash_folder(dflash_hf, target_gguf, dflash_path)
            else:
                config, weights = initial_dflash_folder(target_hf, seed)
                export_dflash(config, weights, target_gguf, dflash_path, name="specdesk-demo-dflash-init")
        eagle3_path = out_dir / "specdesk-demo-eagle3-F16.gguf"
        if not eagle3_path.is_file():
            if eagle3_hf is not None:
                export_eagle3_folder(eagle3_hf, target_gguf, eagle3_path)
            else:
                export_eagle3_seeded(target_hf, target_gguf, eagle3_path, seed)
        has_dspark = dspark_hf is not None and not dflash_problem(dspark_hf, target_hf)
        if has_dspark and not dspark_path.is_file():
            export_dflash(_read_config(dspark_hf), _weights(dspark_hf), target_gguf, dspark_path,
                          name="specdesk-demo-dspark")
    native = {"mtp_gguf": str(mtp_path.resolve()), "dflash_gguf": str(dflash_path.resolve()),
              "eagle3_gguf": str(eagle3_path.resolve()),
              "mtp_source": "trained" if _has_mtp(target_hf) else "seeded (the checkpoint has no MTP layer)",
              "dflash_source": "trained" if not unusable else f"seeded ({unusable})",
              "eagle3_source": "trained" if eagle3_hf is not None else "seeded (the family has no trained EAGLE-3 head)"}
    if has_dspark:
        native["dspark_gguf"] = str(dspark_path.resolve())
    return native


def _has_mtp(target_hf: Path) -> bool:
    config = _read_config(target_hf)
    return find_mtp_layer(_weights(target_hf), config["num_hidden_layers"]) is not None


def dflash_problem(dflash_hf: Path, target_hf: Path) -> str:
    """Why llama.cpp cannot run this z-lab drafter on this target, or '' when it can.

    llama.cpp hands out the *inputs* of the target's layers, so the output of the last layer
    (target_layer_ids = num_hidden_layers - 1) is out of its reach."""
    config, target = _read_config(dflash_hf), _read_config(target_hf)
    ids = config.get("dflash_config", {}).get("target_layer_ids", config.get("target_layer_ids", []))
    n_layer = target["num_hidden_layers"]
    if any(int(i) + 1 >= n_layer for i in ids):
        return (f"the trained drafter reads layer outputs {list(ids)} of a {n_layer}-layer target; llama.cpp "
                f"can hand out layers 0..{n_layer - 2} only")
    return ""


if __name__ == "__main__":
    import argparse
    import sys

    parser = argparse.ArgumentParser(description="Export the demo family's MTP target and DFlash drafter as GGUF")
    parser.add_argument("--small", action="store_true", help="use the small test family")
    parser.add_argument("--out", type=Path, help="output folder")
    args = parser.parse_args()
    from .install import build_family

    try:
        print(json.dumps(build_native(build_family(small=args.small), args.out), indent=2))
    except SpecDeskError as e:
        sys.exit(f"error: {e}")


# --- EAGLE-3 -----------------------------------------------------------------------------
def export_eagle3_seeded(target_hf: Path, target_gguf: Path, out_path: Path, seed: int = 0) -> Path:
    """A seeded eagle3 GGUF for the target in `target_hf` (no trained EAGLE-3 head exists for
    the demo family): one decoder layer the target's width reading the inputs of layers
    (2, L//2, L-3) clamped to the target (vLLM's default), its fc passing the deepest of them,
    attention and MLP outputs scaled down, and the target's final norm, so that it drafts
    the target's logit-lens guess; embeddings and lm head are the target's, shared at run time."""
    target_hf = Path(target_hf)
    config = _read_config(target_hf)
    weights = _weights(target_hf)
    d, n_head = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or d // n_head
    n_layer, ffn = config["num_hidden_layers"], config["intermediate_size"]
    layer_ids = sorted([min(2, n_layer - 1), n_layer // 2, max(0, n_layer - 3)])
    inner = n_head * head_dim
    rng = _rng(seed, "eagle3")

    def mat(rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * (scale / np.sqrt(cols))).astype(np.float32)

    fc = np.zeros((d, 3 * d), np.float32)
    fc[:, 2 * d:] = np.eye(d, dtype=np.float32)
    b = "blk.0."
    tensors = {
        "fc.weight": fc,
        "output_norm.weight": weights["model.norm.weight"],
        b + "attn_norm.weight": np.ones(d, np.float32),
        b + "attn_norm_2.weight": np.ones(d, np.float32),
        b + "attn_q.weight": mat(inner, 2 * d),
        b + "attn_k.weight": mat(inner, 2 * d),
        b + "attn_v.weight": mat(inner, 2 * d),
        b + "attn_output.weight": mat(d, inner, 0.05),
        b + "ffn_norm.weight": np.ones(d, np.float32),
        b + "ffn_gate.weight": mat(ffn, d),
        b + "ffn_up.weight": mat(ffn, d),
        b + "ffn_down.weight": mat(d, ffn, 0.05),
    }
    shape = {"hidden_size": d, "num_attention_heads": n_head, "num_key_value_heads": n_head, "head_dim": head_dim,
             "intermediate_size": ffn, "max_position_embeddings": config.get("max_position_embeddings", 2048),
             "rope_theta": config.get("rope_theta", 10000.0), "rms_norm_eps": config.get("rms_norm_eps", 1e-5),
             "vocab_size": config["vocab_size"]}
    return _write_eagle3(shape, layer_ids, tensors, Path(target_gguf), Path(out_path), "specdesk-demo-eagle3-init")


# HF EAGLE-3 tensor names (engines/torch/eagle3.py) -> the eagle3 GGUF's (conversion/llama.py's mapping)
EAGLE3_TENSORS = {
    "fc.weight": "fc.weight",
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "midlayer.input_layernorm.weight": "blk.0.attn_norm.weight",
    "midlayer.hidden_norm.weight": "blk.0.attn_norm_2.weight",
    "midlayer.self_attn.q_proj.weight": "blk.0.attn_q.weight",
    "midlayer.self_attn.k_proj.weight": "blk.0.attn_k.weight",
    "midlayer.self_attn.v_proj.weight": "blk.0.attn_v.weight",
    "midlayer.self_attn.o_proj.weight": "blk.0.attn_output.weight",
    "midlayer.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
    "midlayer.mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
    "midlayer.mlp.up_proj.weight": "blk.0.ffn_up.weight",
    "midlayer.mlp.down_proj.weight": "blk.0.ffn_down.weight",
}


def export_eagle3_folder(folder: Path, target_gguf: Path, out_path: Path) -> Path:
    """An EAGLE-3 folder with the full target vocabulary (no d2t) and its own lm_head, as an
    eagle3 GGUF for `target_gguf`; q/k rows go to llama.cpp's interleaved RoPE order."""
    from .export_gguf import permute_rope_rows

    folder = Path(folder)
    config = _read_config(folder)
    if config.get("draft_vocab_size", config["vocab_size"]) != config["vocab_size"]:
        raise SpecDeskError(f"{folder}: a draft vocabulary smaller than the target's (d2t) is not exported here")
    layer_ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if not layer_ids or len(layer_ids) != 3:
        raise SpecDeskError(f"{folder}: config.json names no three eagle_aux_hidden_state_layer_ids")
    weights = _weights(folder)
    unknown = sorted(set(weights) - set(EAGLE3_TENSORS))
    if unknown:
        raise SpecDeskError(f"{folder}: tensors {unknown[:3]} have no place in an eagle3 GGUF")
    n_head = config["num_attention_heads"]
    n_kv = config.get("num_key_value_heads") or n_head
    tensors = {}
    for name, data in weights.items():
        data = np.asarray(data, dtype=np.float32)
        if name.endswith("q_proj.weight"):
            data = permute_rope_rows(data, n_head)
        elif name.endswith("k_proj.weight"):
            data = permute_rope_rows(data, n_kv)
        tensors[EAGLE3_TENSORS[name]] = data
    shape = {key: config[key] for key in ("hidden_size", "num_attention_heads", "intermediate_size",
                                          "max_position_embeddings", "rope_theta", "rms_norm_eps", "vocab_size")}
    shape.update(num_key_value_heads=n_kv, head_dim=config.get("head_dim") or config["hidden_size"] // n_head)
    return _write_eagle3(shape, [int(i) for i in layer_ids], tensors, Path(target_gguf), Path(out_path),
                         f"{folder.name}-eagle3")


def _write_eagle3(shape: dict, layer_ids: list[int], tensors: dict[str, np.ndarray], target_gguf: Path,
                  out_path: Path, name: str) -> Path:
    d = shape["hidden_size"]
    with atomic_path(out_path) as tmp:
        writer = gguf.GGUFWriter(tmp, "eagle3")
        writer.add_type(gguf.GGUFType.MODEL)
        writer.add_name(name)
        writer.add_block_count(1)
        writer.add_context_length(shape["max_position_embeddings"])
        writer.add_embedding_length(d)
        writer.add_feed_forward_length(shape["intermediate_size"])
        writer.add_head_count(shape["num_attention_heads"])
        writer.add_head_count_kv(shape["num_key_value_heads"])
        writer.add_key_length(shape["head_dim"])
        writer.add_value_length(shape["head_dim"])
        writer.add_rope_dimension_count(shape["head_dim"])
        writer.add_rope_freq_base(shape["rope_theta"])
        writer.add_layer_norm_rms_eps(shape["rms_norm_eps"])
        writer.add_array("eagle3.target_layers", layer_ids)
        writer.add_uint32("eagle3.target_hidden_size", d)
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        writer.add_vocab_size(shape["vocab_size"])
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        _copy_vocab(writer, target_gguf)
        for tensor_name, data in tensors.items():
            _add(writer, tensor_name, data)
        _finish(writer)
    return out_path
