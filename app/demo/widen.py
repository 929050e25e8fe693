"""Function-preserving widening (Net2Net style) of the trained core into the demo target.

The target must compute exactly what the core computes, only with more arithmetic per token,
so that speculative decoding against it has something to save. The residual stream keeps
the core's values in its first d_core dimensions and zeros in the rest:

- embeddings, and the rows of o_proj/down_proj for new dimensions, are zero, so the new
  dimensions stay zero through every layer;
- new heads and new FFN units read the stream through random projections (so they are
  real, non-degenerate units a fine-tune could grow) but write nothing: their o_proj and
  down_proj columns are zero;
- RMSNorm averages over d_wide instead of d_core: with x_wide = [x, 0],
  rms(x_wide)^2 = (d_core/d_wide) * (mean(x^2) + eps_core) when eps_wide = eps_core * d_core/d_wide,
  so scaling the norm weights by sqrt(d_core/d_wide) gives back the core's normalised values.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping

import numpy as np

from .config import ModelConfig

NEW_WEIGHT_STD = 0.02


def widen(
    core: ModelConfig,
    state: Mapping[str, np.ndarray],
    hidden_size: int,
    num_attention_heads: int,
    intermediate_size: int,
    seed: int = 0,
) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """Return (wide_config, wide_state_dict), float32 numpy, computing the same function as `core`."""
    if hidden_size < core.hidden_size or num_attention_heads < core.num_attention_heads \
            or intermediate_size < core.intermediate_size:
        raise ValueError(f"widening must not shrink: core {core}, wide ({hidden_size}, "
                         f"{num_attention_heads} heads, {intermediate_size})")
    wide = replace(core, hidden_size=hidden_size, num_attention_heads=num_attention_heads,
                   num_key_value_heads=num_attention_heads, intermediate_size=intermediate_size,
                   rms_norm_eps=core.rms_norm_eps * core.hidden_size / hidden_size)
    rng = np.random.default_rng(seed)
    norm_scale = np.float32(math.sqrt(core.hidden_size / hidden_size))
    inner_wide = num_attention_heads * core.head_dim

    def grown(old: np.ndarray, shape: tuple[int, ...], fill_new: str) -> np.ndarray:
        """`old` in the leading corner; the rest random ("random") or zero ("zero")."""
        if fill_new == "random":
            out = rng.standard_normal(shape, dtype=np.float32) * np.float32(NEW_WEIGHT_STD)
        else:
            out = np.zeros(shape, dtype=np.float32)
        out[tuple(slice(0, n) for n in old.shape)] = old
        return out

    out: dict[str, np.ndarray] = {}
    for name, value in state.items():
        tensor = np.asarray(value, dtype=np.float32)
        if name.endswith("norm.weight"):  # every RMSNorm: input/post_attention layernorms and model.norm
            out[name] = np.full((hidden_size,), norm_scale, dtype=np.float32)
            out[name][:core.hidden_size] = tensor * norm_scale
        elif name == "model.embed_tokens.weight":
            out[name] = grown(tensor, (core.vocab_size, hidden_size), "zero")
        elif name == "lm_head.weight":  # new columns read zeros
            out[name] = grown(tensor, (core.vocab_size, hidden_size), "random")
        elif name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
            out[name] = grown(tensor, (inner_wide, hidden_size), "random")
        elif name.endswith("o_proj.weight"):  # (d, heads*head_dim): new heads write nothing, new dims stay zero
            out[name] = grown(tensor, (hidden_size, inner_wide), "zero")
        elif name.endswith(("gate_proj.weight", "up_proj.weight")):
            out[name] = grown(tensor, (intermediate_size, hidden_size), "random")
        elif name.endswith("down_proj.weight"):
            out[name] = grown(tensor, (hidden_size, intermediate_size), "zero")
        else:
            raise ValueError(f"widen: unexpected tensor {name!r} in the core state dict")
    return wide, out
