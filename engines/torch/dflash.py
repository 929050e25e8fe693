"""DFlash and DSpark proposers: block drafters reading the target's hidden states.

Checkpoint (e.g. z-lab/Qwen3-8B-DFlash-b16): config `architectures: ["DFlashDraftModel"]`,
Qwen3 shapes, `block_size` (top level or under `dflash_config`), `dflash_config.
{mask_token_id, target_layer_ids}`; tensors `layers.N.self_attn.{q,k,v,o}_proj, q_norm,
k_norm`, `input_layernorm`, `post_attention_layernorm`, `mlp.*`, `fc` [H, n*H_tgt],
`hidden_norm`, `norm`. No embeddings or lm_head: the target's are used.

Context rows are hidden_norm(fc(cat_i H[id_i + 1])), the outputs of the target layers listed.
Every draft layer takes queries from the block [last token, mask x (B-1)] and keys/values
from cat[context rows, block rows] (k_norm, RoPE at their positions), without a causal
mask. Block rows 1..B-1, through `norm` and the target's lm_head, are the draft. The context
keys and values are cached per layer; only the committed rows of each pass join them.

DSpark (DeepSeek's DeepSpec, e.g. deepseek-ai/dspark_qwen3_4b_block7) is the same backbone
with a Markov head. Its config (`architectures: ["Qwen3DSparkModel"]`) keeps `block_size`,
`mask_token_id`, `target_layer_ids`, `markov_rank`, `markov_head_type` at the top level; its
tensors add `markov_head.markov_w1` (an embedding [V, r]) and `markov_head.markov_w2` [V, r]
(its `embed_tokens`, `lm_head` are copies of the target's, and an optional `confidence_head`
only truncates drafts: both go unused here). The block is anchor-first: [last token, mask x
(B-1)], and all B rows draft, row i the (i+1)-th token after the last one. Row i's logits gain
markov_w2 @ markov_w1[prev_i], prev_0 the last token and prev_i the draft of row i-1, so the
rows are read one after another (the greedy chain llama.cpp's graph runs too).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn as nn

from ..speculation.drafting import confident_rows
from ..speculation.stats import ProposerCounters
from ..types import Draft, SamplingParams, SpecDeskError
from .cpu_linear import pack_linears
from .loader import Checkpoint, drafter_problem, load_module, open_checkpoint
from .model import Attention, FeedForward, KVCache, ModelConfig, RMSNorm, apply_rope, attend, rope_tables

ARCHITECTURE = "DFlashDraftModel"
DSPARK_ARCHITECTURES = ("Qwen3DSparkModel", "DSparkDraftModel")  # a Qwen3 backbone, as DFlash's
MARKOV_HEAD_TYPES = ("vanilla",)


@dataclass(frozen=True)
class DFlashConfig:
    model: ModelConfig  # the drafter's own layers (hidden_size equals the target's)
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int
    qk_norm_eps: float  # q_norm / k_norm; the same as rms_norm_eps in checkpoints
    markov_rank: int = 0  # DSpark: the Markov head's rank (0: none)
    sample_from_anchor: bool = False  # DSpark: every block row drafts, row 0 included

    @property
    def first_draft_row(self) -> int:
        return 0 if self.sample_from_anchor else 1


def is_dspark_config(raw: dict) -> bool:
    names = raw.get("architectures") or []
    return "markov_rank" in raw or any("DSpark" in str(name) for name in names)


def read_dflash_config(checkpoint: Checkpoint) -> DFlashConfig:
    raw, source = checkpoint.config, checkpoint.config_path
    names = raw.get("architectures") or []
    dspark = is_dspark_config(raw)
    if dspark and not any(name in DSPARK_ARCHITECTURES for name in names):
        raise SpecDeskError(f"{source}: a DSpark drafter of architecture {names}; only "
                            f"{' and '.join(DSPARK_ARCHITECTURES)} (Qwen3 layers) are supported")
    if not dspark and ARCHITECTURE not in names:
        raise SpecDeskError(f"{source}: architectures is {raw.get('architectures')}, not [{ARCHITECTURE!r}]: "
                            "this is not a DFlash drafter")
    markov_rank = int(raw.get("markov_rank") or 0) if dspark else 0
    markov_type = raw.get("markov_head_type", "vanilla")
    if dspark and markov_rank < 1:  # llama.cpp tells DSpark from DFlash by its Markov head, and could not run it
        raise SpecDeskError(f"{source}: a DSpark drafter with markov_rank {raw.get('markov_rank')!r}: one without "
                            "a Markov head (confidence head only) is not supported")
    if markov_rank > 0 and markov_type not in MARKOV_HEAD_TYPES:
        raise SpecDeskError(f"{source}: markov_head_type {markov_type!r} is not supported; only a "
                            f"{' or '.join(repr(t) for t in MARKOV_HEAD_TYPES)} Markov head is")
    extra = raw.get("dflash_config") or {}
    try:
        heads = int(raw["num_attention_heads"])
        model = ModelConfig(
            vocab_size=int(raw.get("vocab_size", 0)), hidden_size=int(raw["hidden_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]), num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
            intermediate_size=int(raw["intermediate_size"]), rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(raw.get("rope_theta", 10000.0)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
            attention_bias=bool(raw.get("attention_bias", False)), qk_norm=True,
            rope_scaling=raw.get("rope_scaling") or None, architecture=ARCHITECTURE)
        block_size = int(raw.get("block_size") or extra["block_size"])
        mask_token_id = int(extra.get("mask_token_id", raw.get("mask_token_id")))
        layer_ids = tuple(int(i) for i in (extra["target_layer_ids"] if "target_layer_ids" in extra
                                           else raw["target_layer_ids"]))
    except (KeyError, TypeError, ValueError) as e:
        raise SpecDeskError(f"{source}: not a valid DFlash config ({type(e).__name__}: {e}); it needs block_size, "
                            "mask_token_id and target_layer_ids (under dflash_config, or at the top level)") from e
    if block_size < 2:
        raise SpecDeskError(f"{source}: block_size {block_size} is too small: a block needs at least one mask")
    return DFlashConfig(model, block_size, mask_token_id, layer_ids, int(raw.get("num_target_layers", 0)),
                        qk_norm_eps=model.rms_norm_eps, markov_rank=markov_rank,
                        sample_from_anchor=dspark and bool(raw.get("sample_from_anchor", True)))


def dflash_problem(folder: str | Path, target: Checkpoint) -> Optional[str]:
    """Why this drafter cannot serve this target, or None when it can."""
    try:
        config = read_dflash_config(open_checkpoint(folder))
    except SpecDeskError as e:
        return str(e)
    return _mismatch(config, target.config, Path(folder))


def native_problem(target: Checkpoint, folder: Optional[str | Path]) -> Optional[str]:
    """The method table's check (engines/methods.py): why this target cannot run DFlash now."""
    return drafter_problem("a DFlash drafter folder (z-lab DFlashDraftModel)", folder, target, dflash_problem)


def load_native(engine, path) -> "DFlashDrafter":
    """The method table's loader: a DFlash (or DSpark) drafter folder over this target."""
    return DFlashDrafter.from_folder(path, engine.target, engine.n_ctx)


def _mismatch(config: DFlashConfig, target: dict, folder: Path) -> Optional[str]:
    hidden, layers = int(target.get("hidden_size", 0)), int(target.get("num_hidden_layers", 0))
    if config.model.hidden_size != hidden:
        return f"{folder}: the drafter's hidden_size is {config.model.hidden_size}, the target's {hidden}"
    bad = [i for i in config.target_layer_ids if not 0 <= i < layers]
    if bad:
        return f"{folder}: target_layer_ids {bad} do not exist in a target of {layers} layers"
    vocab = int(target.get("vocab_size", 0))
    if not 0 <= config.mask_token_id < vocab:
        return f"{folder}: mask_token_id {config.mask_token_id} is outside the target's vocabulary of {vocab}"
    if config.markov_rank > 0 and config.model.vocab_size != vocab:
        return f"{folder}: the Markov head's vocab_size is {config.model.vocab_size}, the target's {vocab}"
    return None


class DFlashAttention(Attention):
    """The target's attention layout (o_proj with a bias, q/k norms always), attending to the
    context rows' keys and values in its cache plus the block's own."""

    def __init__(self, config: ModelConfig, qk_eps: float):
        super().__init__(config, o_bias=config.attention_bias, qk_eps=qk_eps)

    def _keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        B, T, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(B, T, self.n_kv, self.head_dim)).transpose(1, 2)  # (B, n_kv, T, hd)
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        return apply_rope(k, cos, sin), v

    def forward(self, block: torch.Tensor, context: torch.Tensor, rope: tuple, context_start: int = 0,
                mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """block (B, Q, d) queries; context (B, C, d) new context rows (C may be 0).

        rope = (block cos, block sin, context cos, context sin). With a cache, the new context
        rows are stored at context_start.. and every cached row before them is attended too.
        """
        B, Q, _ = block.shape
        block_cos, block_sin, context_cos, context_sin = rope
        q = self.q_norm(self.q_proj(block).view(B, Q, self.n_head, self.head_dim)).transpose(1, 2)
        q = apply_rope(q, block_cos, block_sin)  # (B, n_head, Q, hd)
        k_block, v_block = self._keys_values(block, block_cos, block_sin)
        k_ctx, v_ctx = self._keys_values(context, context_cos, context_sin)
        if self.cache is not None:
            k_ctx, v_ctx = self.cache.write(context_start, k_ctx, v_ctx)
        k = torch.cat([k_ctx, k_block], dim=2)  # (B, n_kv, C_all + Q, hd)
        v = torch.cat([v_ctx, v_block], dim=2)
        y = attend(q, k, v, mask)  # (B, n_head, Q, head_dim)
        return self.o_proj(y.transpose(1, 2).reshape(B, Q, -1))


class DFlashLayer(nn.Module):
    def __init__(self, config: ModelConfig, qk_eps: float):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DFlashAttention(config, qk_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = FeedForward(config)

    def forward(self, x: torch.Tensor, context: torch.Tensor, rope: tuple, context_start: int = 0,
                mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), context, rope, context_start, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class MarkovHead(nn.Module):
    """DSpark's vanilla Markov head: a rank-r bias on a row's logits from the token before it."""

    def __init__(self, vocab_size: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)

    def forward(self, previous: torch.Tensor) -> torch.Tensor:
        """Token ids (...) -> logit biases (..., V)."""
        return self.markov_w2(self.markov_w1(previous)).float()

    def chain(self, logits: torch.Tensor, anchor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy drafts through a block: row i gets the bias of the token before it (the anchor
        for row 0, row i-1's draft after). logits (..., n, V), anchor (...) ->
        (tokens (..., n), biased logits (..., n, V))."""
        previous, tokens, biased = anchor, [], []
        for i in range(logits.shape[-2]):
            row = logits[..., i, :] + self(previous)  # (..., V)
            previous = torch.argmax(row, dim=-1)
            tokens.append(previous)
            biased.append(row)
        return torch.stack(tokens, dim=-1), torch.stack(biased, dim=-2)


class DFlashDraftModel(nn.Module):
    """The checkpoint's modules under their tensor names."""

    def __init__(self, config: DFlashConfig):
        super().__init__()
        m = config.model
        self.layers = nn.ModuleList(DFlashLayer(m, config.qk_norm_eps) for _ in range(m.num_hidden_layers))
        self.fc = nn.Linear(len(config.target_layer_ids) * m.hidden_size, m.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(m.hidden_size, m.rms_norm_eps)
        self.norm = RMSNorm(m.hidden_size, m.rms_norm_eps)
        self.markov_head = MarkovHead(m.vocab_size, config.markov_rank) if config.markov_rank > 0 else None

    def forward(self, block: torch.Tensor, features: torch.Tensor, rope: tuple, context_start: int = 0,
                mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """block embeddings (B, Q, d), target features (B, C, n*d) -> normed block rows (B, Q, d)."""
        context = self.hidden_norm(self.fc(features))
        x = block
        for layer in self.layers:
            x = layer(x, context, rope, context_start, mask)
        return self.norm(x)


class DFlashDrafter:
    """A loaded drafter bound to a target: context caches, the target's embeddings and lm_head."""

    def __init__(self, network: DFlashDraftModel, config: DFlashConfig, target, n_ctx: int, folder: Path):
        self.network, self.config, self.target, self.folder = network, config, target, folder
        weight = target.network.model.embed_tokens.weight
        m = config.model
        for layer in network.layers:
            layer.self_attn.cache = KVCache(m.num_key_value_heads, n_ctx + config.block_size, m.head_dim,
                                            weight.dtype, weight.device)
        cos, sin = rope_tables(m, n_ctx + config.block_size)
        self.rope_cos, self.rope_sin = cos.to(weight.device), sin.to(weight.device)
        self.n_ctx = n_ctx
        self.taps = tuple(i + 1 for i in config.target_layer_ids)  # H[id + 1]: the output of layer id

    @classmethod
    def from_folder(cls, folder: str | Path, target, n_ctx: int) -> "DFlashDrafter":
        checkpoint = open_checkpoint(folder)
        config = read_dflash_config(checkpoint)
        problem = _mismatch(config, target.checkpoint.config, Path(folder))
        if problem:
            raise SpecDeskError(problem)
        with torch.device("meta"):
            network = DFlashDraftModel(config)
        network = network.to(dtype=target.dtype).to_empty(device=target.device)
        load_module(network, checkpoint, dtype=target.dtype, device=target.device)
        pack_linears(network)  # a block's rows read the weights once (cpu_linear.py)
        return cls(network.eval(), config, target, n_ctx, Path(folder))

    @torch.inference_mode()
    def draft_logits(self, features: torch.Tensor, context_start: int, last_token: int,
                     rows: Optional[int] = None) -> torch.Tensor:
        """New context rows (C, n*d) at context_start.., then the block after them -> the drafting
        rows' logits, before any Markov bias: (B-1, V) for DFlash, (B, V) for anchor-first DSpark;
        only the first `rows` of them when given (the head is most of a drafting row's cost)."""
        B = self.config.block_size
        C = features.shape[0]
        block_start = context_start + C
        ids = torch.full((B,), self.config.mask_token_id, dtype=torch.long, device=features.device)
        ids[0] = last_token
        block = self.target.network.model.embed_tokens(ids)[None]  # (1, B, d)
        rope = (self.rope_cos[block_start:block_start + B], self.rope_sin[block_start:block_start + B],
                self.rope_cos[context_start:block_start], self.rope_sin[context_start:block_start])
        hidden = self.network(block, features[None], rope, context_start)[0]  # (B, d)
        drafting = hidden[self.config.first_draft_row:]  # (B - first row, d)
        return self.target.network.logits(drafting if rows is None else drafting[:rows])

    @torch.inference_mode()
    def draft(self, logits: torch.Tensor, last_token: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Drafting rows' logits (n, V) -> (greedy tokens (n,), the logits they were read from):
        through the Markov chain where the drafter has one."""
        head = self.network.markov_head
        if head is None:
            return torch.argmax(logits, dim=-1), logits
        return head.chain(logits, torch.tensor(last_token, device=logits.device))


class DFlashProposer:
    def __init__(self, drafter: DFlashDrafter, sampling: SamplingParams, rng: np.random.Generator,
                 p_min: float = 0.0):
        # Drafts are top-1 tokens at any temperature (engines/speculation/drafting.py): sampling and rng go unused.
        self.drafter = drafter
        self.p_min = p_min
        self.taps = drafter.taps
        self.counters = ProposerCounters()
        self._pending: Optional[tuple[torch.Tensor, int]] = None  # (features (C, n*d), first position)

    def begin(self, prompt: Sequence[int]) -> None:
        self._pending = None

    def observe(self, output, tokens: Sequence[int], start: int) -> None:
        features = torch.cat([output.taps[t][:len(tokens) - 1] for t in self.taps], dim=-1)  # (rows, n*d)
        if self._pending is not None:
            features = torch.cat([self._pending[0], features])
            start = self._pending[1]
        self._pending = (features, start)

    def propose(self, context: Sequence[int], k: int) -> Draft:
        started = time.perf_counter()
        if self._pending is None:
            return Draft(())
        features, start = self._pending
        self._pending = None
        if start + features.shape[0] != len(context) - 1:
            raise RuntimeError(f"DFlash context rows end at {start + features.shape[0]}, "
                               f"the block starts at {len(context) - 1}")
        logits = self.drafter.draft_logits(features, start, int(context[-1]), rows=k)  # (at most k, V)
        drafted, logits = self.drafter.draft(logits, int(context[-1]))
        n = len(drafted)
        if self.p_min > 0:
            n = confident_rows(logits.float().cpu().numpy(), self.p_min)
        tokens = tuple(int(t) for t in drafted[:n].tolist())
        self.counters.record_proposal(len(tokens), time.perf_counter() - started)
        return Draft(tokens)  # top-1 tokens: q is one-hot

    def accept(self, n_accepted: int, committed: Sequence[int]) -> None:
        self.counters.record_accepted(n_accepted)

    def stats(self) -> dict:
        return self.counters.as_dict()
