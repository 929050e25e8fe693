"""GGUF export of an exported HF folder, written as llama.cpp's convert_hf_to_gguf.py would.

It reads the same files the converter reads (config.json, tokenizer.json,
tokenizer_config.json, model.safetensors) and writes the same keys and tensor types for a
LlamaForCausalLM with a GPT-2 style BPE vocabulary at --outtype f16, so the GGUF holds
exactly the HF export's fp16 values. The converter itself cannot take this tokenizer (its
pre-tokenizer hash is unknown to it), which is why this file exists; tokenizer.ggml.pre
"gpt-2" is right because the tokenizer uses GPT-2's regex with no prefix space.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

from .export_hf import atomic_path, read_hf_config


def permute_rope_rows(weights: np.ndarray, n_head: int) -> np.ndarray:
    """HF's rotate_half row order -> llama.cpp's interleaved pairs (LlamaModel.permute)."""
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


def _vocab(hf_dir: Path, vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) as the converter's get_vocab_base and SpecialVocab give them."""
    raw = json.loads((hf_dir / "tokenizer.json").read_text(encoding="utf-8"))
    by_id = {token_id: text for text, token_id in raw["model"]["vocab"].items()}
    specials = set()
    for added in raw.get("added_tokens", []):
        by_id[added["id"]] = added["content"]
        if added.get("special"):
            specials.add(added["id"])
    tokens, types = [], []
    for token_id in range(vocab_size):
        if token_id not in by_id:  # the trainer may stop short of vocab_size
            tokens.append(f"[PAD{token_id}]")
            types.append(gguf.TokenType.UNUSED)
        else:
            tokens.append(by_id[token_id])
            types.append(gguf.TokenType.CONTROL if token_id in specials else gguf.TokenType.NORMAL)
    # Byte-level tokens hold no literal spaces, so both merge formats join the same way.
    merges = [m if isinstance(m, str) else " ".join(m) for m in raw["model"]["merges"]]
    return tokens, types, merges


def export_gguf(hf_dir: Path, out_path: Path, name: str) -> Path:
    """Convert the HF folder to an F16 GGUF at out_path (written atomically)."""
    config = read_hf_config(hf_dir)
    tokenizer_config = json.loads((hf_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    hf_json = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    tokens, types, merges = _vocab(hf_dir, config.vocab_size)
    weights = load_file(str(hf_dir / "model.safetensors"))
    tensor_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    n_params = sum(int(t.size) for t in weights.values())

    with atomic_path(out_path) as tmp:
        writer = gguf.GGUFWriter(tmp, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
        writer.add_type(gguf.GGUFType.MODEL)
        writer.add_name(name)
        writer.add_size_label(gguf.size_label(n_params, 0, 0, 0))
        writer.add_block_count(config.num_hidden_layers)
        writer.add_context_length(config.max_position_embeddings)
        writer.add_embedding_length(config.hidden_size)
        writer.add_feed_forward_length(config.intermediate_size)
        writer.add_head_count(config.num_attention_heads)
        writer.add_head_count_kv(config.num_attention_heads)
        writer.add_rope_freq_base(config.rope_theta)
        writer.add_layer_norm_rms_eps(config.rms_norm_eps)
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        writer.add_vocab_size(config.vocab_size)
        writer.add_rope_dimension_count(config.head_dim)
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("gpt-2")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(merges)
        writer.add_bos_token_id(hf_json["bos_token_id"])
        writer.add_eos_token_id(hf_json["eos_token_id"])
        writer.add_add_bos_token(bool(tokenizer_config.get("add_bos_token", True)))
        writer.add_add_eos_token(bool(tokenizer_config.get("add_eos_token", False)))
        if tokenizer_config.get("chat_template"):
            writer.add_chat_template(tokenizer_config["chat_template"])

        for hf_name in sorted(weights):  # the converter walks safetensors keys in this order
            data = weights[hf_name]
            if hf_name.endswith(("q_proj.weight", "k_proj.weight")):
                data = permute_rope_rows(data, config.num_attention_heads)
            gguf_name = tensor_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
            if gguf_name is None:
                raise ValueError(f"export_gguf: no GGUF name for tensor {hf_name!r}")
            # 1-D tensors (the norms) stay F32, as llama.cpp's kernels expect; matrices are F16.
            dtype = np.float32 if data.ndim <= 1 else np.float16
            writer.add_tensor(gguf_name, np.ascontiguousarray(data.astype(dtype)))

        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return out_path
