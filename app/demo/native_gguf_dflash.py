"""The DFlash exporter of the demo family and the trainer: a drafter folder as a `dflash` GGUF.

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

import json
import re
from pathlib import Path
from typing import Mapping

import gguf
import numpy as np

from specdesk.engines.types import SpecDeskError

from .export_hf import atomic_path
from .native_gguf_common import add_tensor, copy_vocab, finish, read_config, read_weights, seeded_rng

DFLASH_ARCH = "dflash"
DEFAULT_BLOCK_SIZE = 8

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
    target_config = read_config(target_hf)
    target = read_weights(target_hf)
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
    rng = seeded_rng(seed, "dflash")
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
        copy_vocab(writer, Path(target_gguf), mask_token_id=int(mask_id))

        add_tensor(writer, "fc.weight", weights["fc.weight"])
        add_tensor(writer, "enc.output_norm.weight", weights["hidden_norm.weight"])
        add_tensor(writer, "output_norm.weight", weights["norm.weight"])
        if "embed_tokens.weight" in weights:  # a drafter with its own embeddings carries its own head too
            add_tensor(writer, "token_embd.weight", weights["embed_tokens.weight"])
            add_tensor(writer, "output.weight", weights["lm_head.weight"])
        if markov:  # [V, r] each: llama.cpp's {r, n_vocab} and {r, n_vocab_draft}
            add_tensor(writer, "markov_w1.weight", weights["markov_head.markov_w1.weight"])
            add_tensor(writer, "markov_w2.weight", weights["markov_head.markov_w2.weight"])
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
                add_tensor(writer, f"blk.{i}.{native}", weights[key])
        finish(writer)
    return Path(out_path)


def export_dflash_folder(folder: Path, target_gguf: Path, out_path: Path) -> Path:
    folder = Path(folder)
    return export_dflash(read_config(folder), read_weights(folder), target_gguf, out_path,
                         name=f"{folder.name}-dflash")
