"""Checkpoints written in real formats for the PyTorch engine's tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file


def make_eagle3_checkpoint(target_hf: str | Path, out: Path, seed: int = 0, draft_vocab: int = 512,
                           aux_layers: list[int] | None = None, head_scale: float = 0.02) -> Path:
    """A random-weight LlamaForCausalLMEagle3 folder for `target_hf` (yuhuili's tensor names).

    The draft vocabulary is a fixed random subset of the target's (d2t maps it back), and GQA
    is used (2 KV heads for 4 query heads). Losslessness holds for any drafter weights; a small
    lm_head scale keeps q broad, so sampled drafts are sometimes accepted and often rejected.
    """
    target = json.loads((Path(target_hf) / "config.json").read_text())
    rng = np.random.default_rng(seed)
    d, vocab, layers = target["hidden_size"], target["vocab_size"], target["num_hidden_layers"]
    heads, kv_heads, head_dim, ffn = 4, 2, d // 4, 2 * d
    draft_ids = np.sort(rng.choice(vocab, size=draft_vocab, replace=False))

    def w(*shape, scale=0.05):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    tensors = {
        "fc.weight": w(d, 3 * d),
        "midlayer.input_layernorm.weight": np.ones(d, np.float32),
        "midlayer.hidden_norm.weight": np.ones(d, np.float32),
        "midlayer.self_attn.q_proj.weight": w(heads * head_dim, 2 * d),
        "midlayer.self_attn.k_proj.weight": w(kv_heads * head_dim, 2 * d),
        "midlayer.self_attn.v_proj.weight": w(kv_heads * head_dim, 2 * d),
        "midlayer.self_attn.o_proj.weight": w(d, heads * head_dim),
        "midlayer.post_attention_layernorm.weight": np.ones(d, np.float32),
        "midlayer.mlp.gate_proj.weight": w(ffn, d),
        "midlayer.mlp.up_proj.weight": w(ffn, d),
        "midlayer.mlp.down_proj.weight": w(d, ffn),
        "norm.weight": np.ones(d, np.float32),
        "lm_head.weight": w(draft_vocab, d, scale=head_scale),
        "d2t": (draft_ids - np.arange(draft_vocab)).astype(np.int64),
        "t2d": np.isin(np.arange(vocab), draft_ids),
    }
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": d,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "intermediate_size": ffn,
        "num_hidden_layers": 1, "vocab_size": vocab, "draft_vocab_size": draft_vocab,
        "rms_norm_eps": target["rms_norm_eps"], "rope_theta": target["rope_theta"],
        "max_position_embeddings": target["max_position_embeddings"], "tie_word_embeddings": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux_layers if aux_layers is not None
                         else [0, layers // 2, layers - 1]},
    }
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(out / "model.safetensors"))
    return out
