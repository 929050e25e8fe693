"""The EAGLE-3 exporter of the demo family and the trainer: a head folder, or a seeded head, as an
`eagle3` GGUF drafter for the target's GGUF."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from specdesk.engines.types import SpecDeskError

from .export_hf import atomic_path
from .native_gguf_common import add_tensor, copy_vocab, finish, read_config, read_weights, seeded_rng

def export_eagle3_seeded(target_hf: Path, target_gguf: Path, out_path: Path, seed: int = 0) -> Path:
    """A seeded eagle3 GGUF for the target in `target_hf` (no trained EAGLE-3 head exists for
    the demo family): one decoder layer the target's width reading the inputs of layers
    (2, L//2, L-3) clamped to the target (vLLM's default), its fc passing the deepest of them,
    attention and MLP outputs scaled down, and the target's final norm, so that it drafts
    the target's logit-lens guess; embeddings and lm head are the target's, shared at run time."""
    target_hf = Path(target_hf)
    config = read_config(target_hf)
    weights = read_weights(target_hf)
    d, n_head = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or d // n_head
    n_layer, ffn = config["num_hidden_layers"], config["intermediate_size"]
    layer_ids = sorted([min(2, n_layer - 1), n_layer // 2, max(0, n_layer - 3)])
    inner = n_head * head_dim
    rng = seeded_rng(seed, "eagle3")

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
    config = read_config(folder)
    if config.get("draft_vocab_size", config["vocab_size"]) != config["vocab_size"]:
        raise SpecDeskError(f"{folder}: a draft vocabulary smaller than the target's (d2t) is not exported here")
    layer_ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if not layer_ids or len(layer_ids) != 3:
        raise SpecDeskError(f"{folder}: config.json names no three eagle_aux_hidden_state_layer_ids")
    weights = read_weights(folder)
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
        copy_vocab(writer, target_gguf)
        for tensor_name, data in tensors.items():
            add_tensor(writer, tensor_name, data)
        finish(writer)
    return out_path
