"""The demo model's shape, importable without torch.

Installing the shipped family (widen, HF and GGUF export) runs on numpy alone, so the
config it reads from card.json and config.json cannot live beside the torch modules.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


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

    def parameter_count(self, with_embeddings: bool = True) -> int:
        d, h = self.hidden_size, self.num_attention_heads * self.head_dim
        per_layer = 4 * d * h + 3 * d * self.intermediate_size + 2 * d
        total = self.num_hidden_layers * per_layer + d
        if with_embeddings:
            total += 2 * self.vocab_size * d
        return total


def tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """LlamaForCausalLM's tensor names and shapes for `config`: what LlamaLM's state dict holds."""
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
