"""The PyTorch engine's model config, importable without torch.

What `Transformer` (model.py) is built from, read from a transformers config.json. It lives
apart from the torch modules so that code running on numpy alone (installing the shipped
demo family) describes its models with the same type the engine runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..hf_config import check_config
from ..types import SpecDeskError

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                 "MiMoForCausalLM")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: q/k/v carry biases
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k
    rope_scaling: Optional[dict] = None
    architecture: str = "LlamaForCausalLM"


def config_from_hf(raw: dict, source: str) -> ModelConfig:
    """Read a transformers config.json dict; refuse what this implementation cannot run, and
    any key whose value is the wrong type or outside hf_config.py's limits (one line naming
    `source` and the keys)."""
    check_config(raw, source)
    architecture = (raw.get("architectures") or ["LlamaForCausalLM"])[0]
    if architecture not in ARCHITECTURES:
        raise SpecDeskError(f"{source}: architecture {architecture} is not supported by the PyTorch engine "
                            f"(supported: {', '.join(ARCHITECTURES)})")
    try:
        heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        model_type = raw.get("model_type", "llama")
        rope_scaling = raw.get("rope_scaling")
        if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type")) not in ("llama3", "default", None):
            raise SpecDeskError(f"{source}: rope_scaling type {rope_scaling.get('rope_type')!r} is not supported "
                                "(supported: llama3, none)")
        if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type")) == "llama3":
            for key in ("factor", "original_max_position_embeddings"):
                value = rope_scaling.get(key)
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                    raise SpecDeskError(f"{source}: rope_scaling.{key} is {value!r}; llama3 scaling needs a positive number")
        return ModelConfig(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            intermediate_size=int(raw["intermediate_size"]),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(raw.get("rope_theta", 10000.0)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", model_type in ("qwen2", "mimo"))),
            qk_norm=model_type == "qwen3",
            rope_scaling=rope_scaling or None,
            architecture=architecture,
        )
    except KeyError as e:
        raise SpecDeskError(f"{source}: config.json has no {e.args[0]!r}") from e
