"""GGUF export of an exported HF folder, written as llama.cpp's convert_hf_to_gguf.py would.

It reads the same files the converter reads (config.json, tokenizer.json,
tokenizer_config.json, model.safetensors) and writes the same keys and tensor types for a
LlamaForCausalLM with a GPT-2 style BPE vocabulary at --outtype f16, so the GGUF holds
exactly the HF export's fp16 values. The converter itself cannot take this tokenizer (its
pre-tokenizer hash is unknown to it), which is why this file exists; tokenizer.ggml.pre
"gpt-2" is right because the tokenizer uses GPT-2's regex with no prefix space.

A draft model trained for a target (app/training/draft.py) is written the same way, as the
target's architecture (llama, qwen2 or qwen3, grouped-query attention included) with the
target GGUF's vocabulary: `vocab_from` copies its tokenizer fields verbatim, and its RoPE
scaling, so that llama.cpp pairs the two.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import gguf
import numpy as np
from safetensors.numpy import load_file

from specdesk.engines.torch.config import config_from_hf
from specdesk.engines.types import SpecDeskError

from .export_hf import atomic_path, read_hf_config

# What llama.cpp reads of RoPE for every architecture (llama_model::load_hparams) besides the
# base frequency, with its type: carried into a written file (under its architecture's prefix),
# they scale its RoPE as the source's
ROPE_SCALING_KEYS = {
    "rope.scaling.type": gguf.GGUFValueType.STRING, "rope.scaling.factor": gguf.GGUFValueType.FLOAT32,
    "rope.scale_linear": gguf.GGUFValueType.FLOAT32, "rope.scaling.attn_factor": gguf.GGUFValueType.FLOAT32,
    "rope.scaling.alpha": gguf.GGUFValueType.FLOAT32,
    "rope.scaling.original_context_length": gguf.GGUFValueType.UINT32,
    "rope.scaling.finetuned": gguf.GGUFValueType.BOOL,
}


def copy_vocab(writer: gguf.GGUFWriter, target_gguf: Path, mask_token_id: Optional[int] = None) -> None:
    """The target GGUF's tokenizer fields, verbatim: drafter and target share one vocabulary."""
    reader = gguf.GGUFReader(str(target_gguf))
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        main_type = field.types[0]
        sub_type = field.types[-1] if main_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), main_type, sub_type=sub_type)
    if mask_token_id is not None:
        writer.add_mask_token_id(mask_token_id)


# The PyTorch engine's architectures a GGUF is written for, and whether llama.cpp's graph for it
# reads Q/K rows with each head's rotary pairs interleaved (llama's converter permutes them)
GGUF_ARCHITECTURES = {"LlamaForCausalLM": (gguf.MODEL_ARCH.LLAMA, True),
                      "MistralForCausalLM": (gguf.MODEL_ARCH.LLAMA, True),
                      "Qwen2ForCausalLM": (gguf.MODEL_ARCH.QWEN2, False),
                      "Qwen3ForCausalLM": (gguf.MODEL_ARCH.QWEN3, False)}


def permute_rope_rows(weights: np.ndarray, n_head: int) -> np.ndarray:
    """HF's rotate_half row order -> llama.cpp's interleaved pairs (LlamaModel.permute)."""
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


def unpermute_rope_rows(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's interleaved pairs -> HF's rotate_half row order: the inverse of permute_rope_rows."""
    return (weights.reshape(n_head, weights.shape[0] // n_head // 2, 2, *weights.shape[1:])
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


def _config(hf_dir: Path, vocab_from: Optional[Path]):
    """(config, architecture, interleaved Q/K rows): the demo's plain Llama, or with `vocab_from`
    any architecture of GGUF_ARCHITECTURES as the PyTorch engine reads it."""
    if vocab_from is None:
        return read_hf_config(hf_dir), gguf.MODEL_ARCH.LLAMA, True
    path = hf_dir / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SpecDeskError(f"{path}: cannot read the model config ({e})") from e
    config = config_from_hf(raw, str(path))
    if config.architecture not in GGUF_ARCHITECTURES:
        raise SpecDeskError(f"{path}: architecture {config.architecture} is not one written as a GGUF here "
                            f"(supported: {', '.join(GGUF_ARCHITECTURES)})")
    return (config, *GGUF_ARCHITECTURES[config.architecture])


def _add_vocab(writer: gguf.GGUFWriter, hf_dir: Path, vocab_size: int) -> None:
    """The demo tokenizer's fields, as the converter writes them from tokenizer.json."""
    tokenizer_config = json.loads((hf_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    hf_json = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    tokens, types, merges = _vocab(hf_dir, vocab_size)
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


def _add_target_rope(writer: gguf.GGUFWriter, arch: str, vocab_from: Path) -> None:
    """The target GGUF's RoPE scaling: its keys (under this file's architecture) and Llama 3's
    rope_freqs tensor, so the draft model rotates positions as its target does."""
    from specdesk.engines.llama.binding import validated_header

    header = validated_header(vocab_from)
    for key, value_type in ROPE_SCALING_KEYS.items():
        value = header.arch_value(key)
        if value is not None:
            writer.add_key_value(f"{arch}.{key}", value, value_type)
    if "rope_freqs.weight" in header.tensor_infos:
        from specdesk.engines.llama.tensors import dequantized

        writer.add_tensor("rope_freqs.weight", dequantized(vocab_from, "rope_freqs.weight").astype(np.float32))


def export_gguf(hf_dir: Path, out_path: Path, name: str, vocab_from: Optional[Path] = None) -> Path:
    """Convert the HF folder to an F16 GGUF at out_path (written atomically). Without `vocab_from`
    the folder is the demo's (a plain Llama and its tokenizer.json); with it, a model of the
    target GGUF `vocab_from`'s vocabulary, whose tokenizer fields and RoPE scaling are copied."""
    config, model_arch, interleaved = _config(hf_dir, vocab_from)
    weights = load_file(str(hf_dir / "model.safetensors"))
    tensor_map = gguf.get_tensor_name_map(model_arch, config.num_hidden_layers)
    n_params = sum(int(t.size) for t in weights.values())
    arch = gguf.MODEL_ARCH_NAMES[model_arch]
    heads = {"q_proj.weight": config.num_attention_heads, "k_proj.weight": config.num_key_value_heads}

    with atomic_path(out_path) as tmp:
        writer = gguf.GGUFWriter(tmp, arch)
        writer.add_type(gguf.GGUFType.MODEL)
        writer.add_name(name)
        writer.add_size_label(gguf.size_label(n_params, 0, 0, 0))
        writer.add_block_count(config.num_hidden_layers)
        writer.add_context_length(config.max_position_embeddings)
        writer.add_embedding_length(config.hidden_size)
        writer.add_feed_forward_length(config.intermediate_size)
        writer.add_head_count(config.num_attention_heads)
        writer.add_head_count_kv(config.num_key_value_heads)
        writer.add_rope_freq_base(config.rope_theta)
        writer.add_layer_norm_rms_eps(config.rms_norm_eps)
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        writer.add_vocab_size(config.vocab_size)
        writer.add_rope_dimension_count(config.head_dim)
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        if vocab_from is None:
            _add_vocab(writer, hf_dir, config.vocab_size)
        else:
            copy_vocab(writer, vocab_from)
            _add_target_rope(writer, arch, vocab_from)

        for hf_name in sorted(weights):  # the converter walks safetensors keys in this order
            data = weights[hf_name]
            if interleaved and hf_name.endswith(tuple(heads)):
                data = permute_rope_rows(data, heads[hf_name.rsplit(".", 2)[-2] + ".weight"])
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
