"""The demo family's model shapes and training settings, importable without torch.

Installing the shipped family (widen, HF and GGUF export) runs on numpy alone, so it
describes models with the engine's torch-free ModelConfig (engines/torch/config.py): the
shape the recipe trains is the very config the PyTorch engine builds its Transformer from.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdesk.engines.torch.config import ModelConfig

# What card.json records of a model: a plain Llama needs nothing else.
CARD_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
             "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_theta")


def llama_config(vocab_size: int, hidden_size: int, num_hidden_layers: int, num_attention_heads: int,
                 intermediate_size: int, head_dim: int = 64, max_position_embeddings: int = 512,
                 rms_norm_eps: float = 1e-5, rope_theta: float = 10000.0) -> ModelConfig:
    """A demo-family model: plain Llama, one key/value head per query head, untied head."""
    return ModelConfig(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                       num_attention_heads=num_attention_heads, num_key_value_heads=num_attention_heads,
                       head_dim=head_dim, intermediate_size=intermediate_size, rms_norm_eps=rms_norm_eps,
                       rope_theta=rope_theta, max_position_embeddings=max_position_embeddings)


def card_entry(config: ModelConfig) -> dict:
    """What card.json records of `config` (the shipped cards hold these keys)."""
    return {key: getattr(config, key) for key in CARD_KEYS}


def from_card(entry: dict) -> ModelConfig:
    """The config a card.json entry (card_entry's keys) describes."""
    return llama_config(**{key: entry[key] for key in CARD_KEYS})


def parameter_count(config: ModelConfig, with_embeddings: bool = True) -> int:
    d, h = config.hidden_size, config.num_attention_heads * config.head_dim
    per_layer = 4 * d * h + 3 * d * config.intermediate_size + 2 * d
    total = config.num_hidden_layers * per_layer + d
    if with_embeddings:
        total += 2 * config.vocab_size * d
    return total


def tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """LlamaForCausalLM's tensor names and shapes for `config`: what the engine's Transformer holds."""
    d, inner, ffn = config.hidden_size, config.num_attention_heads * config.head_dim, config.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, d)}
    for i in range(config.num_hidden_layers):
        layer = f"model.layers.{i}."
        shapes.update({
            layer + "input_layernorm.weight": (d,),
            layer + "self_attn.q_proj.weight": (inner, d),
            layer + "self_attn.k_proj.weight": (inner, d),
            layer + "self_attn.v_proj.weight": (inner, d),
            layer + "self_attn.o_proj.weight": (d, inner),
            layer + "post_attention_layernorm.weight": (d,),
            layer + "mlp.gate_proj.weight": (ffn, d),
            layer + "mlp.up_proj.weight": (ffn, d),
            layer + "mlp.down_proj.weight": (d, ffn),
        })
    shapes["model.norm.weight"] = (d,)
    shapes["lm_head.weight"] = (config.vocab_size, d)
    return shapes


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch_size: int
    seq_len: int
    peak_lr: float
    min_lr_ratio: float = 0.05
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 250
    seed: int = 1234
    bf16: bool = True


@dataclass(frozen=True)
class DrafterTraining:
    """A drafter trained against the frozen core (the MTP layer, the DFlash drafter)."""

    steps: int
    batch_size: int = 8
    seq_len: int = 256  # tokens per training sequence
    peak_lr: float = 2e-3
    warmup_steps: int = 30
    seed: int = 0

    def schedule(self) -> TrainConfig:
        """The loop's settings: no weight decay, one evaluation at the end."""
        return TrainConfig(steps=self.steps, batch_size=self.batch_size, seq_len=self.seq_len - 1,
                           peak_lr=self.peak_lr, warmup_steps=self.warmup_steps, weight_decay=0.0,
                           eval_every=self.steps, seed=self.seed)
