"""What an exported EAGLE-3 head's config says, without torch: the trainer's export and the demo
installer's widened head (app/demo/eagle3.py, which installs on numpy alone) both write it."""

from __future__ import annotations

from typing import Sequence

from specdesk.engines.torch.config import ModelConfig

ARCHITECTURE = "LlamaForCausalLMEagle3"  # as engines/torch/eagle3.py reads it


def head_config(target: ModelConfig) -> ModelConfig:
    """One Llama layer of the target's width and attention shape (no q/k norms, no biases)."""
    return ModelConfig(vocab_size=target.vocab_size, hidden_size=target.hidden_size, num_hidden_layers=1,
                       num_attention_heads=target.num_attention_heads, num_key_value_heads=target.num_key_value_heads,
                       head_dim=target.head_dim, intermediate_size=target.intermediate_size,
                       rms_norm_eps=target.rms_norm_eps, rope_theta=target.rope_theta,
                       max_position_embeddings=target.max_position_embeddings, rope_scaling=target.rope_scaling,
                       architecture="LlamaForCausalLM")


def hf_config(target: ModelConfig, taps: Sequence[int]) -> dict:
    """config.json of the exported head, as published EAGLE-3 checkpoints spell it."""
    config = head_config(target)
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "num_hidden_layers": 1,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": config.rope_scaling,
        "max_position_embeddings": config.max_position_embeddings,
        "vocab_size": config.vocab_size,
        "draft_vocab_size": config.vocab_size,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(taps)},
    }
