"""MTP proposer: next-token-prediction layers shipped inside the target's checkpoint.

Two real formats, both loaded by tensor name from the target's own safetensors:
- MiMo (XiaomiMiMo/MiMo-7B-*): config `num_nextn_predict_layers`, tensors
  `model.mtp_layers.{i}.{token_layernorm, hidden_layernorm, input_proj, final_layernorm}`
  plus a decoder block under the same prefix; h = input_proj(cat[hidden_ln(h_prev),
  token_ln(emb(tok))]) -> block -> final_layernorm -> the target's lm_head.
- DeepSeek-V3 style: config `num_nextn_predict_layers`, layers at index num_hidden_layers + i:
  `model.layers.{L+i}.{enorm, hnorm, eh_proj, shared_head.norm, shared_head.head}` plus the
  block; h = eh_proj(cat[enorm(emb(tok)), hnorm(h_prev)]) -> block -> shared_head.

Row p of the MTP layer reads (h_p, x_{p+1}) and predicts x_{p+2}; h_p is the target's hidden
state after its final norm. k draft tokens are chained by feeding the layer's own output
back as h_prev (see `MtpLayer.feedback`). The layer keeps a static KV cache of committed rows;
chained rows are written past them and dropped by position, like the target's.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn as nn

from ..speculation.drafting import below_p_min
from ..speculation.stats import ProposerCounters
from ..types import Draft, SamplingParams, SpecDeskError
from .cpu_linear import pack_linears
from .loader import Checkpoint, load_module
from .model import DecoderLayer, KVCache, ModelConfig, RMSNorm, causal_mask, config_from_hf, rope_tables

STYLES = ("mimo", "deepseek")


def mtp_style(checkpoint: Checkpoint) -> tuple[Optional[str], int]:
    """(style, number of layers) from config and tensor names; (None, 0) when there are none."""
    count = int(checkpoint.config.get("num_nextn_predict_layers") or 0)
    if count <= 0:
        return None, 0
    if checkpoint.names_with_prefix("model.mtp_layers.0."):
        return "mimo", count
    first = int(checkpoint.config.get("num_hidden_layers", 0))
    if checkpoint.names_with_prefix(f"model.layers.{first}.eh_proj"):
        return "deepseek", count
    return None, count


def mtp_problem(checkpoint: Checkpoint) -> Optional[str]:
    """Why MTP cannot run on this checkpoint, or None when it can."""
    style, count = mtp_style(checkpoint)
    if count <= 0:
        return f"{checkpoint.config_path}: the model has no MTP layers (num_nextn_predict_layers is 0 or absent)"
    if style is None:
        return (f"{checkpoint.folder}: config.json declares {count} MTP layer(s) but the checkpoint has neither "
                "model.mtp_layers.0.* (MiMo) nor model.layers.N.eh_proj (DeepSeek) tensors")
    return None


def native_problem(checkpoint: Checkpoint, folder=None) -> Optional[str]:
    """The method table's check (engines/methods.py): why this target cannot run MTP, or None."""
    return mtp_problem(checkpoint)


def load_native(engine, path=None) -> "MtpDrafter":
    """The method table's loader: the target's own MTP layers."""
    return MtpDrafter.from_target(engine.target, engine.n_ctx)


class SharedHead(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)


class MtpLayer(DecoderLayer):
    """One MTP layer: the fusion tensors of its style plus a decoder block (the same names)."""

    def __init__(self, config: ModelConfig, style: str):
        super().__init__(config)
        if style not in STYLES:
            raise ValueError(f"unknown MTP style {style!r}")
        self.style = style
        d = config.hidden_size
        if style == "mimo":
            self.token_layernorm = RMSNorm(d, config.rms_norm_eps)
            self.hidden_layernorm = RMSNorm(d, config.rms_norm_eps)
            self.input_proj = nn.Linear(2 * d, d, bias=False)
            self.final_layernorm = RMSNorm(d, config.rms_norm_eps)
        else:
            self.enorm = RMSNorm(d, config.rms_norm_eps)
            self.hnorm = RMSNorm(d, config.rms_norm_eps)
            self.eh_proj = nn.Linear(2 * d, d, bias=False)
            self.shared_head = SharedHead(config)

    def fuse(self, hidden: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        if self.style == "mimo":  # hidden first
            return self.input_proj(torch.cat([self.hidden_layernorm(hidden), self.token_layernorm(embedded)], dim=-1))
        return self.eh_proj(torch.cat([self.enorm(embedded), self.hnorm(hidden)], dim=-1))

    def run(self, hidden: torch.Tensor, embedded: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            start: int, mask: torch.Tensor) -> torch.Tensor:
        """(B, T, d) hidden and token embeddings -> the layer's output before its final norm."""
        return self(self.fuse(hidden, embedded), cos, sin, start, mask)

    def feedback(self, out: torch.Tensor) -> torch.Tensor:
        """The h_prev for the next chained step.

        DeepSeek feeds the block's output back before its head norm (DeepSeek-V3, section
        2.2). A MiMo layer reads the target's final-normed hidden state, and its own
        final_layernorm output is what the shared lm_head reads, i.e. the same space: feeding
        that back keeps later steps in the distribution the layer was trained on.
        """
        return self.final_layernorm(out) if self.style == "mimo" else out

    def head_logits(self, out: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        if self.style == "mimo":
            return lm_head(self.final_layernorm(out)).float()
        return self.shared_head.head(self.shared_head.norm(out)).float()


class MtpDrafter:
    """The target's MTP layer 0 with its KV cache; chains use it for every step."""

    taps: tuple[int, ...] = ()  # reads the target's final-normed hidden state, no inner layers

    def __init__(self, layer: MtpLayer, target, n_ctx: int):
        self.layer = layer
        self.target = target
        network = target.network
        self.embed = network.model.embed_tokens
        self.lm_head = (lambda h: network.logits(h))
        weight = network.model.embed_tokens.weight
        layer.self_attn.cache = KVCache(target.config.num_key_value_heads, n_ctx, target.config.head_dim,
                                        weight.dtype, weight.device)
        cos, sin = rope_tables(target.config, n_ctx)
        self.rope_cos, self.rope_sin = cos.to(weight.device), sin.to(weight.device)
        self.n_ctx = n_ctx

    @classmethod
    def from_target(cls, target, n_ctx: int) -> "MtpDrafter":
        checkpoint = target.checkpoint
        problem = mtp_problem(checkpoint)
        if problem:
            raise SpecDeskError(problem)
        style, _ = mtp_style(checkpoint)
        config = config_from_hf(checkpoint.config, str(checkpoint.config_path))
        prefix = "model.mtp_layers.0." if style == "mimo" else f"model.layers.{config.num_hidden_layers}."
        with torch.device("meta"):
            layer = MtpLayer(config, style)
        layer = layer.to(dtype=target.dtype).to_empty(device=target.device)
        load_module(layer, checkpoint, prefix=prefix, dtype=target.dtype, device=target.device)
        pack_linears(layer)  # the accepted rows of a step read the weights once (cpu_linear.py)
        return cls(layer.eval(), target, n_ctx)

    def rows_from(self, output, rows: int) -> torch.Tensor:
        """The h_prev rows of a target pass: its final-normed hidden states."""
        return output.hidden[:rows]

    @torch.inference_mode()
    def step(self, hidden: torch.Tensor, tokens: Sequence[int], start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows (hidden (T, d), next tokens (T,)) at positions start.. -> (outputs (T, d), logits of the last row)."""
        T = hidden.shape[0]
        if start + T > self.n_ctx:
            raise SpecDeskError(f"MTP positions up to {start + T} exceed the context of {self.n_ctx}")
        ids = torch.as_tensor(list(tokens), dtype=torch.long, device=hidden.device)
        out = self.layer.run(hidden[None], self.embed(ids)[None], self.rope_cos[start:start + T],
                             self.rope_sin[start:start + T], start, causal_mask(start, T, hidden.device))[0]
        return out, self.layer.head_logits(out[-1:], self.lm_head)[0]


class MtpProposer:
    """Drafts up to k top-1 tokens from the target's MTP layer, chained on its own hidden
    state, stopping below draft_p_min (engines/speculation/drafting.py: the rule of both engines).

    Any head with `taps`, `rows_from`, `step`, `layer.feedback` and `n_ctx` drafts the
    same way (EAGLE-3's is one)."""

    def __init__(self, head: MtpDrafter, sampling: SamplingParams, rng: np.random.Generator, p_min: float = 0.0):
        # Drafts are top-1 tokens at any temperature (engines/speculation/drafting.py): sampling and rng go unused.
        self.head = head
        self.p_min = p_min
        self.taps = head.taps
        self.counters = ProposerCounters()
        self._pending: Optional[tuple[torch.Tensor, list[int], int]] = None  # committed rows not yet run

    def begin(self, prompt: Sequence[int]) -> None:
        self._pending = None

    def observe(self, output, tokens: Sequence[int], start: int) -> None:
        """The target's committed rows of one pass: hidden states and the tokens after them."""
        hidden = self.head.rows_from(output, len(tokens) - 1)
        following = tokens[1:]
        if self._pending is not None:  # not drafted in between (k was 0): keep all rows
            old_hidden, old_tokens, old_start = self._pending
            hidden = torch.cat([old_hidden, hidden])
            following = [*old_tokens, *following]
            start = old_start
        self._pending = (hidden, list(following[:hidden.shape[0]]), start)

    def propose(self, context: Sequence[int], k: int) -> Draft:
        started = time.perf_counter()
        if self._pending is None:
            return Draft(())
        hidden, tokens, start = self._pending
        self._pending = None
        out, logits = self.head.step(hidden, tokens, start)
        position = start + hidden.shape[0]
        drafted: list[int] = []
        previous = self.head.layer.feedback(out[-1:])
        for i in range(k):
            if below_p_min(logits.float().cpu().numpy(), self.p_min):
                break
            token = int(torch.argmax(logits))
            drafted.append(token)
            if i + 1 < k and position < self.head.n_ctx:
                out, logits = self.head.step(previous, [token], position)
                previous = self.head.layer.feedback(out)
                position += 1
            elif i + 1 < k:
                break
        self.counters.record_proposal(len(drafted), time.perf_counter() - started)
        return Draft(tuple(drafted))  # top-1 tokens: q is one-hot

    def accept(self, n_accepted: int, committed: Sequence[int]) -> None:
        self.counters.record_accepted(n_accepted)

    def stats(self) -> dict:
        return self.counters.as_dict()
