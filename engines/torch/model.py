"""A compact Llama-family decoder (Llama, Mistral, Qwen2/2.5, Qwen3) with a static KV cache.

gpt-fast in spirit: attribute names are the Hugging Face tensor names, so loading is a loop
over the module's state dict with a shape check per tensor. The KV cache is allocated once
and written by position; rolling back a rejected draft means writing over it later.
Hidden-state taps (H[i]: the residual stream entering layer i, H[L] the last layer's output)
are what the MTP and DFlash drafters read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..memory import ram_available
from ..types import SpecDeskError
from .cpu_linear import linear, pack_linears, reorder
from .config import ModelConfig, config_from_hf  # noqa: F401  (re-exported: the engine's modules import them from here)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(x.dtype)


def inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, config.head_dim, 2, dtype=torch.float64) / config.head_dim))
    scaling = config.rope_scaling
    if scaling and scaling.get("rope_type", scaling.get("type")) == "llama3":
        factor = scaling["factor"]
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        old_context = scaling["original_max_position_embeddings"]
        wavelength = 2 * math.pi / inv_freq
        smooth = (old_context / wavelength - low) / (high - low)
        scaled = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        inv_freq = torch.where(wavelength > old_context / low, inv_freq / factor,
                               torch.where(wavelength < old_context / high, inv_freq, scaled))
    return inv_freq


def rope_tables(config: ModelConfig, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.outer(torch.arange(length, dtype=torch.float64), inverse_frequencies(config))  # (T, D/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, head_dim): Hugging Face half-rotation layout
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class KVCache(nn.Module):
    """Keys and values of one layer for max_len positions, allocated once."""

    def __init__(self, n_kv_heads: int, max_len: int, head_dim: int, dtype: torch.dtype, device):
        super().__init__()
        shape = (1, n_kv_heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store rows at start.. and return everything up to their end: (1, n_kv, end, head_dim)."""
        end = start + k.shape[2]
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        return self.k[:, :, :end], self.v[:, :, :end]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """Scaled dot-product attention; grouped-query keys/values are repeated per query head
    (torch's enable_gqa needs torch 2.5, the extra allows 2.2)."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def causal_mask(start: int, rows: int, device) -> torch.Tensor:
    """(rows, start + rows) boolean: row i (at position start + i) sees keys 0..start + i."""
    keys = torch.arange(start + rows, device=device)
    return keys[None, :] <= (start + torch.arange(rows, device=device))[:, None]


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, o_bias: bool = False, qk_eps: Optional[float] = None):
        """`o_bias`: o_proj has a bias (DFlash drafters); `qk_eps`: q/k norms with this epsilon
        whatever config.qk_norm says."""
        super().__init__()
        self.n_head, self.n_kv, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.n_head * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_head * self.head_dim, config.hidden_size, bias=o_bias)
        if config.qk_norm or qk_eps is not None:
            eps = config.rms_norm_eps if qk_eps is None else qk_eps
            self.q_norm = RMSNorm(self.head_dim, eps)
            self.k_norm = RMSNorm(self.head_dim, eps)
        self.cache: Optional[KVCache] = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int,
                mask: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim)
        k = self.k_proj(x).view(B, T, self.n_kv, self.head_dim)
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)  # (B, n_kv, T, head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q.transpose(1, 2), cos, sin)  # (B, n_head, T, head_dim)
        k = apply_rope(k.transpose(1, 2), cos, sin)  # (B, n_kv, T, head_dim)
        if self.cache is not None:
            k, v = self.cache.write(start, k, v)  # (1, n_kv, start + T, head_dim)
        y = attend(q, k, v, mask)  # (B, n_head, T, head_dim)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = FeedForward(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int,
                mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, start, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


@dataclass(frozen=True)
class ForwardOutput:
    logits: torch.Tensor  # (T, vocab) float32
    hidden: torch.Tensor  # (T, d) after the final norm: what the lm_head reads
    taps: dict[int, torch.Tensor]  # i -> (T, d) H[i], the residual stream entering layer i


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.max_len = 0
        self.tied_head_packed: Optional[torch.Tensor] = None  # see pack_for_cpu

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if not self.config.tie_word_embeddings:
            return self.lm_head(hidden).float()
        return linear(hidden, self.model.embed_tokens.weight, None, self.tied_head_packed).float()

    def pack_for_cpu(self) -> bool:
        """The reordered weight copies for batched rows on a CPU (cpu_linear.py), tied head included."""
        if not pack_linears(self):
            return False
        head = self.model.embed_tokens.weight
        if self.config.tie_word_embeddings and head.numel() * head.element_size() <= ram_available() // 4:
            self.tied_head_packed = reorder(head)
        return True

    def setup_cache(self, max_len: int) -> None:
        """Allocate keys and values for max_len positions once; rope tables to match."""
        weight = self.model.embed_tokens.weight
        for layer in self.model.layers:
            layer.self_attn.cache = KVCache(self.config.num_key_value_heads, max_len, self.config.head_dim,
                                            weight.dtype, weight.device)
        cos, sin = rope_tables(self.config, max_len)
        self.rope_cos, self.rope_sin = cos.to(weight.device), sin.to(weight.device)
        self.max_len = max_len

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, start: int, taps: Sequence[int] = (),
                logits_from: int = 0) -> ForwardOutput:
        """Run tokens (T,) at positions start..start+T-1 against the cache.

        Logits are computed for rows logits_from.. only (prompt processing needs one row).
        """
        T = tokens.shape[0]
        if start + T > self.max_len:
            raise SpecDeskError(f"positions up to {start + T} exceed the KV cache of {self.max_len}")
        cos = self.rope_cos[start:start + T]  # (T, head_dim)
        sin = self.rope_sin[start:start + T]
        mask = causal_mask(start, T, tokens.device)
        hidden, captured = self._layers(self.model.embed_tokens(tokens)[None], cos, sin, start, mask, taps)
        return ForwardOutput(self.logits(hidden[0, logits_from:]), hidden[0], {i: h[0] for i, h in captured.items()})

    def hidden_states(self, tokens: torch.Tensor, taps: Sequence[int] = ()) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """A training pass: tokens (B, T) at positions 0..T-1, no KV cache, gradients kept.

        The demo recipe trains through this, so the network it trains is the one the engine
        serves. Returns the hidden states after the final norm (B, T, d) and the taps H[i] (B, T, d).
        """
        if self.max_len:
            raise SpecDeskError("a training pass would overwrite the KV cache: use a model without setup_cache")
        T = tokens.shape[1]
        cos, sin = (table.to(tokens.device) for table in rope_tables(self.config, T))
        return self._layers(self.model.embed_tokens(tokens), cos, sin, 0, causal_mask(0, T, tokens.device), taps)

    def _layers(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int, mask: torch.Tensor,
                taps: Sequence[int]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """x (B, T, d) through every layer and the final norm; H[i] for each i in taps."""
        wanted = set(taps)
        captured: dict[int, torch.Tensor] = {}
        for index, layer in enumerate(self.model.layers):
            if index in wanted:
                captured[index] = x
            x = layer(x, cos, sin, start, mask)
        if self.config.num_hidden_layers in wanted:
            captured[self.config.num_hidden_layers] = x
        return self.model.norm(x), captured
