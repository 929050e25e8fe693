"""EAGLE-3 proposer: a one-layer drafter reading three of the target's hidden states.

Checkpoint (e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B): `architectures:
["LlamaForCausalLMEagle3"]`, Llama shapes, `draft_vocab_size`; tensors `fc` [H, 3H],
`midlayer.{input_layernorm, hidden_norm, self_attn.{q,k,v}_proj [.., 2H], o_proj,
post_attention_layernorm, mlp.*}`, `norm`, `lm_head` [draft_vocab, H], `d2t` (target id =
draft id + d2t[draft id]); the token embeddings are the target's.

Row p reads g_p = fc(cat[H[a], H[b], H[c]]) (target taps, default layers 2, L/2, L-3 or
`eagle_config.eagle_aux_hidden_state_layer_ids`) and the embedding of x_{p+1}:
qkv(cat[input_layernorm(emb), hidden_norm(g)]), residual g; the layer's output before
`norm` is g for the next chained step. The chaining and caches are the MTP proposer's.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

import torch
import torch.nn as nn

from ..types import SpecDeskError
from .cpu_linear import pack_linears
from .loader import Checkpoint, drafter_problem, load_module, open_checkpoint
from .model import Attention, FeedForward, KVCache, ModelConfig, RMSNorm, config_from_hf, rope_tables
from .mtp import MtpProposer

ARCHITECTURE = "LlamaForCausalLMEagle3"


def aux_layer_ids(raw: dict, target_layers: int) -> tuple[int, ...]:
    ids = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return tuple(int(i) for i in ids) if ids else (2, target_layers // 2, target_layers - 3)


class MidLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        d = config.hidden_size
        self.input_layernorm = RMSNorm(d, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(d, config.rms_norm_eps)
        self.self_attn = Attention(replace(config, hidden_size=2 * d))  # q/k/v read [embedding, hidden]
        self.self_attn.o_proj = nn.Linear(config.num_attention_heads * config.head_dim, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d, config.rms_norm_eps)
        self.mlp = FeedForward(config)


class Eagle3Model(nn.Module):
    """The checkpoint's modules under their tensor names (d2t is read separately: integers)."""

    def __init__(self, config: ModelConfig, draft_vocab: int, target_hidden: int):
        super().__init__()
        self.fc = nn.Linear(3 * target_hidden, config.hidden_size, bias=False)
        self.midlayer = MidLayer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, draft_vocab, bias=False)
        self.style = "eagle3"

    def feedback(self, out: torch.Tensor) -> torch.Tensor:
        return out  # the pre-norm sum is the next step's g

    def run(self, g: torch.Tensor, embedded: torch.Tensor, cos, sin, start: int, mask) -> torch.Tensor:
        m = self.midlayer
        x = torch.cat([m.input_layernorm(embedded), m.hidden_norm(g)], dim=-1)  # (B, T, 2H)
        h = g + m.self_attn(x, cos, sin, start, mask)
        return h + m.mlp(m.post_attention_layernorm(h))


def native_problem(target: Checkpoint, folder: Optional[str | Path]) -> Optional[str]:
    """The method table's check (engines/methods.py): why this target cannot run EAGLE-3 now."""
    return drafter_problem("an EAGLE-3 drafter folder (LlamaForCausalLMEagle3)", folder, target, eagle3_problem)


def load_native(engine, path) -> "Eagle3Drafter":
    """The method table's loader: an EAGLE-3 drafter folder over this target."""
    return Eagle3Drafter.from_folder(path, engine.target, engine.n_ctx)


def eagle3_problem(folder: str | Path, target: Checkpoint) -> Optional[str]:
    try:
        checkpoint = open_checkpoint(folder)
    except SpecDeskError as e:
        return str(e)
    raw = checkpoint.config
    if ARCHITECTURE not in (raw.get("architectures") or []):
        return f"{checkpoint.config_path}: architectures is {raw.get('architectures')}, not [{ARCHITECTURE!r}]"
    layers = int(target.config.get("num_hidden_layers", 0))
    bad = [i for i in aux_layer_ids(raw, layers) if not 0 <= i < layers]
    if bad:
        return f"{checkpoint.config_path}: auxiliary layers {bad} do not exist in a target of {layers} layers"
    if int(raw.get("hidden_size", 0)) != int(target.config.get("hidden_size", -1)):
        return (f"{checkpoint.config_path}: hidden_size {raw.get('hidden_size')} differs from the target's "
                f"{target.config.get('hidden_size')}")
    return None


class Eagle3Drafter:
    """A loaded EAGLE-3 drafter bound to a target; drafts through MtpProposer's chain."""

    def __init__(self, model: Eagle3Model, config: ModelConfig, d2t: torch.Tensor, target, taps: tuple[int, ...],
                 n_ctx: int):
        self.layer = model
        self.d2t_ids = torch.arange(d2t.shape[0], device=d2t.device) + d2t  # (draft_vocab,) target ids
        self.embed = target.network.model.embed_tokens
        self.target = target
        self.taps = taps
        weight = target.network.model.embed_tokens.weight
        attn = model.midlayer.self_attn
        attn.cache = KVCache(attn.n_kv, n_ctx, attn.head_dim, weight.dtype, weight.device)
        cos, sin = rope_tables(config, n_ctx)
        self.rope_cos, self.rope_sin = cos.to(weight.device), sin.to(weight.device)
        self.n_ctx = n_ctx
        self.vocab = target.config.vocab_size

    @classmethod
    def from_folder(cls, folder: str | Path, target, n_ctx: int) -> "Eagle3Drafter":
        from safetensors import safe_open

        problem = eagle3_problem(folder, target.checkpoint)
        if problem:
            raise SpecDeskError(problem)
        checkpoint = open_checkpoint(folder)
        raw = dict(checkpoint.config, architectures=["LlamaForCausalLM"])
        config = config_from_hf(raw, str(checkpoint.config_path))
        draft_vocab = int(raw.get("draft_vocab_size") or config.vocab_size)
        with torch.device("meta"):
            model = Eagle3Model(config, draft_vocab, target.config.hidden_size)
        model = model.to(dtype=target.dtype).to_empty(device=target.device)
        load_module(model, checkpoint, dtype=target.dtype, device=target.device)
        pack_linears(model)  # the accepted rows of a step read the weights once (cpu_linear.py)
        if not checkpoint.has("d2t"):
            if draft_vocab != target.config.vocab_size:
                raise SpecDeskError(f"{checkpoint.folder}: tensor d2t is missing (needed for a draft vocabulary of "
                                    f"{draft_vocab} tokens)")
            d2t = torch.zeros(draft_vocab, dtype=torch.long)
        else:
            with safe_open(str(checkpoint.folder / checkpoint.weight_map["d2t"]), framework="pt") as f:
                d2t = f.get_tensor("d2t").long()
            if tuple(d2t.shape) != (draft_vocab,):
                raise SpecDeskError(f"{checkpoint.folder}: tensor d2t has shape {tuple(d2t.shape)}, "
                                    f"config.json implies ({draft_vocab},)")
        ids = torch.arange(draft_vocab) + d2t
        if int(ids.min()) < 0 or int(ids.max()) >= target.config.vocab_size:
            raise SpecDeskError(f"{checkpoint.folder}: d2t maps draft tokens outside the target's vocabulary of "
                                f"{target.config.vocab_size}")
        return cls(model.eval(), config, d2t.to(target.device), target,
                   aux_layer_ids(checkpoint.config, target.config.num_hidden_layers), n_ctx)

    def rows_from(self, output, rows: int) -> torch.Tensor:
        features = torch.cat([output.taps[t][:rows] for t in self.taps], dim=-1)  # (rows, 3H)
        with torch.inference_mode():
            return self.layer.fc(features)

    @torch.inference_mode()
    def step(self, g: torch.Tensor, tokens, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows (g (T, H), next tokens) at positions start.. -> (outputs (T, H), target-vocab logits of the last row)."""
        from .model import causal_mask

        T = g.shape[0]
        if start + T > self.n_ctx:
            raise SpecDeskError(f"EAGLE-3 positions up to {start + T} exceed the context of {self.n_ctx}")
        ids = torch.as_tensor(list(tokens), dtype=torch.long, device=g.device)
        out = self.layer.run(g[None], self.embed(ids)[None], self.rope_cos[start:start + T],
                             self.rope_sin[start:start + T], start, causal_mask(start, T, g.device))[0]
        draft_logits = self.layer.lm_head(self.layer.norm(out[-1:]))[0].float()  # (draft_vocab,)
        logits = torch.full((self.vocab,), float("-inf"), device=g.device)
        logits[self.d2t_ids] = draft_logits  # tokens outside the draft vocabulary are never proposed
        return out, logits


class Eagle3Proposer(MtpProposer):
    """MTP's chained drafting over an EAGLE-3 head (the first row of each pass is fc(taps))."""
