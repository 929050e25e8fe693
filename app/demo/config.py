"""The demo model's shape and the recipe's training settings, importable without torch.

Installing the shipped family (widen, HF and GGUF export) runs on numpy alone, so the
config it reads from card.json and config.json cannot live beside the torch modules. The
network itself is the engine's (engines/torch/model.py): `engine_config` says which.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specdesk.engines.torch.model import ModelConfig as EngineConfig


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    head_dim: int = 64
    max_position_embeddings: int = 512
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    def to_dict(self) -> dict:
        return asdict(self)

    def engine_config(self) -> EngineConfig:
        """The PyTorch engine's config for this shape (plain Llama, one key/value head per
        query head): the recipe trains `Transformer(config.engine_config())`, the very
        module that serves the exported folder. Needs torch."""
        from specdesk.engines.torch.model import ModelConfig as EngineConfig

        return EngineConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                            num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
                            num_key_value_heads=self.num_attention_heads, head_dim=self.head_dim,
                            intermediate_size=self.intermediate_size, rms_norm_eps=self.rms_norm_eps,
                            rope_theta=self.rope_theta, max_position_embeddings=self.max_position_embeddings)

    def parameter_count(self, with_embeddings: bool = True) -> int:
        d, h = self.hidden_size, self.num_attention_heads * self.head_dim
        per_layer = 4 * d * h + 3 * d * self.intermediate_size + 2 * d
        total = self.num_hidden_layers * per_layer + d
        if with_embeddings:
            total += 2 * self.vocab_size * d
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
