"""The MTP exporter of the demo family and the trainer: a target with its MTP layer as one GGUF.

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

Without trained weights (no MTP tensors in the checkpoint, no DFlash folder) both are
initialised from a fixed seed: losslessness holds for any drafter weights, so tests can run
before a trained drafter exists; the benchmark should use trained ones.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping, Optional

import gguf
import numpy as np

from specdesk.engines.types import SpecDeskError

from .export_gguf import ROPE_SCALING_KEYS
from .export_hf import atomic_path
from .native_gguf_common import add_tensor, copy_vocab, finish, read_config, read_weights, seeded_rng

MTP_ARCH = "glm4moe"

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
    noise = seeded_rng(seed, "mtp", "eh_proj").standard_normal((d, 2 * d)).astype(np.float32) * (0.02 / np.sqrt(d))
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
    copy_vocab(writer, target_gguf)
    return writer


def _write_nextn(writer: gguf.GGUFWriter, n_layer: int, mtp: Mapping[str, np.ndarray], ffn_exp: int) -> None:
    """The NextN block at index n_layer (find_mtp_layer's dict)."""
    _write_block(writer, n_layer, mtp, dense=False, ffn_exp=ffn_exp)
    add_tensor(writer, f"blk.{n_layer}.nextn.eh_proj.weight", mtp["eh_proj"])
    add_tensor(writer, f"blk.{n_layer}.nextn.enorm.weight", mtp["enorm"])
    add_tensor(writer, f"blk.{n_layer}.nextn.hnorm.weight", mtp["hnorm"])
    if "head_norm" in mtp:
        add_tensor(writer, f"blk.{n_layer}.nextn.shared_head_norm.weight", mtp["head_norm"])
    if "head" in mtp:
        add_tensor(writer, f"blk.{n_layer}.nextn.shared_head_head.weight", mtp["head"])


def export_mtp_target(target_hf: Path, target_gguf: Path, out_path: Path, seed: int = 0) -> Path:
    """The HF target (with its MTP layer, or a seeded one) as a glm4moe GGUF with one NextN layer."""
    target_hf, target_gguf = Path(target_hf), Path(target_gguf)
    config = read_config(target_hf)
    weights = read_weights(target_hf)
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
        add_tensor(writer, "token_embd.weight", weights["model.embed_tokens.weight"])
        add_tensor(writer, "output_norm.weight", weights["model.norm.weight"])
        add_tensor(writer, "output.weight", weights.get("lm_head.weight", weights["model.embed_tokens.weight"]))
        for i in range(n_layer):
            _write_block(writer, i, _block(weights, f"model.layers.{i}."), dense=True)
        _write_nextn(writer, n_layer, mtp, _expert_ffn(shape))
        finish(writer)
    return Path(out_path)


def _write_block(writer: gguf.GGUFWriter, i: int, block: Mapping[str, np.ndarray], dense: bool,
                 ffn_exp: int = 0) -> None:
    """One decoder block; Q/K rows stay in HF order (glm4moe uses NeoX RoPE)."""
    b = f"blk.{i}."
    add_tensor(writer, b + "attn_norm.weight", block["input_layernorm.weight"])
    add_tensor(writer, b + "attn_q.weight", block["self_attn.q_proj.weight"])
    add_tensor(writer, b + "attn_k.weight", block["self_attn.k_proj.weight"])
    add_tensor(writer, b + "attn_v.weight", block["self_attn.v_proj.weight"])
    for hf, native in (("self_attn.q_proj.bias", "attn_q.bias"), ("self_attn.k_proj.bias", "attn_k.bias"),
                       ("self_attn.v_proj.bias", "attn_v.bias"), ("self_attn.q_norm.weight", "attn_q_norm.weight"),
                       ("self_attn.k_norm.weight", "attn_k_norm.weight")):
        if hf in block:
            add_tensor(writer, b + native, block[hf])
    add_tensor(writer, b + "attn_output.weight", block["self_attn.o_proj.weight"])
    add_tensor(writer, b + "post_attention_norm.weight", block["post_attention_layernorm.weight"])
    gate, up, down = (np.asarray(block[f"mlp.{n}_proj.weight"], np.float32) for n in ("gate", "up", "down"))
    if dense:
        add_tensor(writer, b + "ffn_gate.weight", gate)
        add_tensor(writer, b + "ffn_up.weight", up)
        add_tensor(writer, b + "ffn_down.weight", down)
        return
    # SwiGLU is a sum over intermediate units, so splitting them between the routed and the
    # shared expert (zero-padding an odd count) keeps the MLP exact.
    pad = 2 * ffn_exp - gate.shape[0]
    if pad:
        gate = np.concatenate([gate, np.zeros((pad, gate.shape[1]), np.float32)])
        up = np.concatenate([up, np.zeros((pad, up.shape[1]), np.float32)])
        down = np.concatenate([down, np.zeros((down.shape[0], pad), np.float32)], axis=1)
    d = gate.shape[1]
    add_tensor(writer, b + "ffn_gate_inp.weight", np.zeros((1, d), np.float32))
    add_tensor(writer, b + "exp_probs_b.bias", np.zeros(1, np.float32))
    add_tensor(writer, b + "ffn_gate_exps.weight", gate[None, :ffn_exp])
    add_tensor(writer, b + "ffn_up_exps.weight", up[None, :ffn_exp])
    add_tensor(writer, b + "ffn_down_exps.weight", down[None, :, :ffn_exp])
    add_tensor(writer, b + "ffn_gate_shexp.weight", gate[ffn_exp:])
    add_tensor(writer, b + "ffn_up_shexp.weight", up[ffn_exp:])
    add_tensor(writer, b + "ffn_down_shexp.weight", down[:, ffn_exp:])


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
    mtp = find_mtp_layer(read_weights(mtp_folder), n_layer)
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
        finish(writer)
    del data
    return Path(out_path)
