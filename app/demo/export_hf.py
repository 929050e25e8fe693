"""Hugging Face export of a demo model: the folder layout transformers and the hub use.

The folder is what `LlamaForCausalLM.from_pretrained` and `AutoTokenizer` load, and what
llama.cpp's convert_hf_to_gguf.py converts; export_gguf.py reads it back the same way.
Exporting needs numpy only; torch is imported by `load_hf` alone, when it is called.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Mapping

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, processors

from specdesk.engines.types import SpecDeskError

from specdesk.engines.torch.config import ModelConfig, config_from_hf

from .config import tensor_shapes
from .tokenizer import BOS_TOKEN, EOS_TOKEN

if TYPE_CHECKING:
    from specdesk.engines.torch.model import Transformer


def require_torch(purpose: str) -> None:
    """Raise a SpecDeskError saying how to install torch (the optional `torch` extra) if it is missing."""
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise SpecDeskError(f"{purpose} needs PyTorch: pip install 'specdesk[torch]'") from e


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary sibling of `path`; it becomes `path` only if the block finishes.

    A crash or error mid-write leaves at most a *.tmp-PID file, never a file under the
    final name that looks complete.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: Path, data: dict) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _added_token(content: str) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}


def hf_tokenizer_json(source: Path) -> tuple[str, int, int]:
    """tokenizer.json text whose post-processor prepends BOS, as Llama 3's does.

    transformers' PreTrainedTokenizerFast ignores add_bos_token, so the tokenizer itself must
    add BOS for HF users to get what llama.cpp (tokenizer.ggml.add_bos_token) does.
    Returns (json text, bos id, eos id).
    """
    tokenizer = Tokenizer.from_file(str(source))
    bos, eos = tokenizer.token_to_id(BOS_TOKEN), tokenizer.token_to_id(EOS_TOKEN)
    if bos is None or eos is None:
        raise SpecDeskError(f"{source}: the tokenizer has no {BOS_TOKEN} / {EOS_TOKEN} tokens; "
                            "rebuild the demo family")
    tokenizer.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B:1",
                                      special_tokens=[(BOS_TOKEN, bos)]),
    ])
    return tokenizer.to_str(pretty=True), bos, eos


def hf_config(config: ModelConfig, bos: int, eos: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "hidden_size": config.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings,
        "mlp_bias": False,
        "num_attention_heads": config.num_attention_heads,
        "num_hidden_layers": config.num_hidden_layers,
        "num_key_value_heads": config.num_key_value_heads,
        "pretraining_tp": 1,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_scaling": None,
        "rope_theta": config.rope_theta,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "use_cache": True,
        "vocab_size": config.vocab_size,
    }


def export_hf(
    config: ModelConfig,
    state: Mapping[str, np.ndarray],
    tokenizer_path: Path,
    chat_template: str,
    out_dir: Path,
) -> list[Path]:
    """Write an fp16 LlamaForCausalLM folder into out_dir; returns the files written."""
    tokenizer_text, bos, eos = hf_tokenizer_json(tokenizer_path)
    expected = tensor_shapes(config)
    if state.keys() != expected.keys():
        raise ValueError(f"export_hf: tensor names differ from LlamaForCausalLM's: "
                         f"{sorted(state.keys() ^ expected.keys())[:4]}")
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            raise ValueError(f"export_hf: {name} has shape {tuple(state[name].shape)}, config wants {shape}")
    weights = {name: np.ascontiguousarray(np.asarray(tensor, dtype=np.float32).astype(np.float16))
               for name, tensor in state.items()}

    files = {
        "config.json": hf_config(config, bos, eos),
        "generation_config.json": {"bos_token_id": bos, "eos_token_id": eos},
        "special_tokens_map.json": {"bos_token": _added_token(BOS_TOKEN), "eos_token": _added_token(EOS_TOKEN)},
        "tokenizer_config.json": {
            "add_bos_token": True,
            "add_eos_token": False,
            "added_tokens_decoder": {str(bos): {**_added_token(BOS_TOKEN), "special": True},
                                     str(eos): {**_added_token(EOS_TOKEN), "special": True}},
            "bos_token": BOS_TOKEN,
            "eos_token": EOS_TOKEN,
            "chat_template": chat_template,
            "clean_up_tokenization_spaces": False,
            "model_input_names": ["input_ids", "attention_mask"],
            "model_max_length": config.max_position_embeddings,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
    }
    written = []
    for name, data in files.items():
        write_json_atomic(out_dir / name, data)
        written.append(out_dir / name)
    write_text_atomic(out_dir / "tokenizer.json", tokenizer_text)
    with atomic_path(out_dir / "model.safetensors") as tmp:
        save_file(weights, str(tmp), metadata={"format": "pt"})
    return written + [out_dir / "tokenizer.json", out_dir / "model.safetensors"]


def read_hf_config(folder: Path) -> ModelConfig:
    """The config of an exported folder, read as the PyTorch engine reads it; only the plain
    Llama the exporters write is accepted."""
    path = folder / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise SpecDeskError(f"{path}: cannot read the model config ({e})") from e
    if raw.get("model_type") != "llama":
        raise SpecDeskError(f"{path}: model_type is {raw.get('model_type')!r}; only 'llama' is supported here")
    config = config_from_hf(raw, str(path))
    if config.num_key_value_heads != config.num_attention_heads:
        raise SpecDeskError(f"{path}: grouped-query attention (num_key_value_heads "
                            f"{config.num_key_value_heads} != {config.num_attention_heads}) is not supported here")
    return config


def load_hf(folder: Path) -> tuple[ModelConfig, Transformer]:
    """Load an exported folder back as the engine's float32 Transformer (without a KV cache:
    its training pass, `hidden_states`, runs whole sequences); needs torch."""
    require_torch("loading an exported demo model into torch")
    from safetensors.torch import load_file

    from specdesk.engines.torch.model import Transformer

    folder = Path(folder)
    config = read_hf_config(folder)
    model = Transformer(config)
    weights_path = folder / "model.safetensors"
    try:
        weights = load_file(str(weights_path))
    except Exception as e:  # safetensors raises its own error types for truncated headers
        raise SpecDeskError(f"{weights_path}: cannot read the weights ({e})") from e
    expected = model.state_dict()
    missing, unexpected = expected.keys() - weights.keys(), weights.keys() - expected.keys()
    if missing or unexpected:
        raise SpecDeskError(f"{weights_path}: tensor names differ from LlamaForCausalLM "
                            f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
    for name, tensor in expected.items():
        if weights[name].shape != tensor.shape:
            raise SpecDeskError(f"{weights_path}: {name} has shape {tuple(weights[name].shape)}, "
                                f"config.json implies {tuple(tensor.shape)}")
    model.load_state_dict({name: t.float() for name, t in weights.items()})
    return config, model.eval()
