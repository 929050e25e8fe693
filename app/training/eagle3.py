"""Training an EAGLE-3 head for a PyTorch target: the engine's own Eagle3Model, unrolled.

Row p of the head reads g_p = fc(cat H[taps] at p) and the embedding of x_{p+1} and drafts
x_{p+2}; each further step feeds the step's own output back as g with the next token, at the
next position, attending to the committed first-step rows up to p and to its own earlier
steps at row p: exactly the cache the engine's proposer (engines/torch/eagle3.py) builds.
The loss is KL from the target's recorded top-k distribution at every step (EAGLE-3's
training-time test), with later steps weighted down.

The head's lm_head is the target's, frozen, over the full vocabulary (no d2t), and its norm
starts as the target's final norm, so the exported folder is a plain EAGLE-3 checkpoint.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from specdesk.engines.torch.eagle3 import Eagle3Model
from specdesk.engines.torch.model import ModelConfig, apply_rope, rope_tables

from specdesk.app.demo.eagle3_config import head_config, hf_config  # noqa: F401  (torch-free: the demo's installer writes configs too)
from .methods import DEPTH, Batch, Plan, PlanInputs, figures, make_batch  # noqa: F401  (Batch, make_batch: here as before)

STEP_WEIGHT = 0.8  # loss weight of step s is STEP_WEIGHT ** (s - 1), as EAGLE-3 weighs its unrolled steps


def default_taps(num_layers: int) -> tuple[int, ...]:
    """Layers (2, L/2, L-3) clamped to the target and sorted, as the demo's llama.cpp exporter picks them."""
    return tuple(sorted([min(2, num_layers - 1), num_layers // 2, max(0, num_layers - 3)]))


def new_head(target_network, seed: int) -> Eagle3Model:
    """A head for the target: weights N(0, 0.02) (outputs into the residual scaled down), fc passing
    the deepest tap through, the target's final norm and its lm_head (frozen)."""
    config = target_network.config
    head = Eagle3Model(head_config(config), config.vocab_size, config.hidden_size)
    generator = torch.Generator().manual_seed(seed)
    d = config.hidden_size
    with torch.no_grad():
        for name, param in head.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                std = 0.02 / math.sqrt(2) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                param.copy_(torch.randn(param.shape, generator=generator) * std)
        head.fc.weight.zero_()
        head.fc.weight[:, -d:] = torch.eye(d)
        head.norm.weight.copy_(target_network.model.norm.weight.float())
        lm = target_network.model.embed_tokens.weight if config.tie_word_embeddings else target_network.lm_head.weight
        head.lm_head.weight.copy_(lm.float())
    head.lm_head.requires_grad_(False)
    return head


def chained_attention(attn, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: list, values: list
                      ) -> torch.Tensor:
    """One unrolled step's attention, (B, rows, in) -> (B, rows, d), as the proposer's cache holds it:
    row p of step s (at position p + s) sees the first step's rows 0..p and its own rows of steps
    1..s. `keys` and `values` gather each step's (they grow by one entry per call)."""
    B, rows, _ = x.shape
    heads, kv, hd = attn.n_head, attn.n_kv, attn.head_dim
    q = attn.q_proj(x).view(B, rows, heads, hd)
    k = attn.k_proj(x).view(B, rows, kv, hd)
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    q = apply_rope(q.transpose(1, 2), cos, sin)  # (B, heads, rows, hd)
    keys.append(apply_rope(k.transpose(1, 2), cos, sin))  # (B, kv, rows, hd)
    values.append(attn.v_proj(x).view(B, rows, kv, hd).transpose(1, 2))
    causal = torch.ones(rows, rows, dtype=torch.bool, device=x.device).tril()
    same_row = torch.eye(rows, dtype=torch.bool, device=x.device)
    mask = torch.cat([causal] + [same_row] * (len(keys) - 1), dim=1)  # committed rows up to p, then row p's own steps
    k_all, v_all = torch.cat(keys, dim=2), torch.cat(values, dim=2)
    if heads != kv:
        k_all, v_all = k_all.repeat_interleave(heads // kv, dim=1), v_all.repeat_interleave(heads // kv, dim=1)
    y = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)  # (B, heads, rows, hd)
    return attn.o_proj(y.transpose(1, 2).reshape(B, rows, -1))


def unroll(head: Eagle3Model, config: ModelConfig, embed: torch.nn.Embedding, batch: Batch,
           depth: int) -> list[torch.Tensor]:
    """Draft-vocabulary logits of each step s = 1..depth: (B, T-1, V), row p drafting x_{p+s+1}.

    Step s > 1 reads the tokens that were drafted before it as the target's own (teacher forcing:
    where an earlier draft was wrong the later ones are never used, so the acceptance they imply
    is exact)."""
    m = head.midlayer
    B, T = batch.tokens.shape
    rows = T - 1
    device = batch.tokens.device
    cos, sin = (t.to(device) for t in rope_tables(config, rows + depth))
    g = head.fc(batch.features[:, :rows])
    keys, values, logits = [], [], []
    for step in range(depth):
        token_ids = torch.zeros(B, rows, dtype=torch.long, device=device)
        token_ids[:, :max(0, T - 1 - step)] = batch.tokens[:, 1 + step:]  # row p reads x_{p+1+step}
        x = torch.cat([m.input_layernorm(embed(token_ids).float()), m.hidden_norm(g)], dim=-1)  # (B, rows, 2d)
        h = g + chained_attention(m.self_attn, x, cos[step:step + rows], sin[step:step + rows], keys, values)
        out = h + m.mlp(m.post_attention_layernorm(h))
        logits.append(head.lm_head(head.norm(out)).float())
        g = head.feedback(out)
    return logits


def _valid(batch: Batch, step: int, rows: int, answer_only: bool) -> torch.Tensor:
    """(B, rows) bool: row p's step (0-based) target, position p + step + 1, exists; with
    answer_only, it also lies in the generated answer."""
    p = torch.arange(rows, device=batch.tokens.device)[None, :]
    target_position = p + step + 1
    ok = target_position <= batch.lengths[:, None] - 1
    if answer_only:
        ok &= target_position >= batch.answer_starts[:, None] - 1  # predicts an answer token
    return ok


def kl_loss(logits: list[torch.Tensor], batch: Batch) -> tuple[torch.Tensor, dict]:
    """Weighted mean over steps of KL(target top-k || head) at the rows where the step has a target."""
    rows = batch.tokens.shape[1] - 1
    total, weights, figures = 0.0, 0.0, {}
    for step, step_logits in enumerate(logits):
        position = torch.arange(rows, device=batch.tokens.device) + step + 1
        position = position.clamp(max=batch.tokens.shape[1] - 1)
        p = batch.top_p[:, position]  # (B, rows, k)
        ids = batch.top_ids[:, position]
        logq = torch.log_softmax(step_logits, dim=-1).gather(-1, ids)
        per_row = (p * (torch.log(p.clamp_min(1e-12)) - logq)).sum(-1)
        valid = _valid(batch, step, rows, answer_only=False)
        if not valid.any():
            continue
        loss = per_row[valid].mean()
        total = total + STEP_WEIGHT ** step * loss
        weights += STEP_WEIGHT ** step
        figures[f"kl{step + 1}"] = float(loss.detach())
    return total / max(weights, 1e-9), figures


@torch.no_grad()
def acceptance(logits: list[torch.Tensor], batch: Batch) -> tuple[list[float], int]:
    """Per draft position s, the share of answer rows whose first s drafts all equal the target's
    greedy tokens (what greedy verification accepts); and how many rows were counted."""
    rows = batch.tokens.shape[1] - 1
    depth = len(logits)
    usable = _valid(batch, depth - 1, rows, answer_only=True) & _valid(batch, 0, rows, answer_only=True)
    alive = usable.clone()
    shares = []
    count = int(usable.sum())
    for step, step_logits in enumerate(logits):
        position = (torch.arange(rows, device=batch.tokens.device) + step + 1).clamp(max=batch.tokens.shape[1] - 1)
        greedy = batch.top_ids[:, position, 0]  # the target's choice there: the token it will verify against
        alive &= step_logits.argmax(-1) == greedy
        shares.append(float(alive.sum()) / max(1, count))
    return shares, count


def export_head(head: Eagle3Model, target: ModelConfig, taps: Sequence[int], folder: Path) -> Path:
    """The head as an EAGLE-3 folder (config.json, model.safetensors in float16) the PyTorch engine loads."""
    import json
    import os

    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    weights = {name: t.detach().to(torch.float16).contiguous().cpu() for name, t in head.state_dict().items()}
    tmp = folder / f"model.safetensors.tmp-{os.getpid()}"
    save_file(weights, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(hf_config(target, taps), indent=2) + "\n", encoding="utf-8")
    return folder


def load_head(folder: Path, target: ModelConfig, device: str | torch.device = "cpu") -> tuple[Eagle3Model, ModelConfig]:
    """An exported EAGLE-3 folder (full target vocabulary) as a float32 module and its config, for
    evaluating it on the trainer's held-out data beside the head being trained."""
    from specdesk.engines.torch.config import config_from_hf
    from specdesk.engines.torch.loader import load_module, open_checkpoint
    from specdesk.engines.types import SpecDeskError

    checkpoint = open_checkpoint(folder)
    raw = dict(checkpoint.config, architectures=["LlamaForCausalLM"])
    config = config_from_hf(raw, str(checkpoint.config_path))
    if int(raw.get("draft_vocab_size") or config.vocab_size) != target.vocab_size or config.hidden_size != target.hidden_size:
        raise SpecDeskError(f"{folder}: not an EAGLE-3 head of this target's width ({target.hidden_size}) and "
                            f"full vocabulary ({target.vocab_size})")
    with torch.device("meta"):
        head = Eagle3Model(config, target.vocab_size, target.hidden_size)
    head = head.to(dtype=torch.float32).to_empty(device=device)
    load_module(head, checkpoint, dtype=torch.float32, device=device)
    return head.eval(), config


# --- the method table's training facts (engines/methods.py: EAGLE-3's `Training`) ---------------
def plan_taps(network) -> tuple[int, ...]:
    return default_taps(network.config.num_hidden_layers)


def plan(inputs: PlanInputs) -> Plan:
    """A head trained on its unrolled steps against the target's recorded distributions."""
    network, config = inputs.network, inputs.network.config
    head = new_head(network, seed=0).to(inputs.device)
    config_of_head, embed = head_config(config), network.model.embed_tokens
    held_batch = inputs.batch(inputs.held)

    def step(rng):
        batch = inputs.sample(rng)
        return kl_loss(unroll(head, config_of_head, embed, batch, DEPTH), batch)

    def evaluate():
        return figures(*acceptance(unroll(head, config_of_head, embed, held_batch, DEPTH), held_batch))

    def evaluate_reference(folder: Path):
        reference, reference_config = load_head(folder, config, inputs.device)
        with torch.no_grad():
            return figures(*acceptance(unroll(reference, reference_config, embed, held_batch, DEPTH), held_batch))

    return Plan(inputs.method, inputs.taps, head, step, evaluate,
                lambda folder: export_head(head, config, inputs.taps, folder), evaluate_reference)


def export_gguf(folder: Path, target_gguf: Path, path: Path, from_gguf: bool) -> Path:
    """The head as an EAGLE-3 drafter GGUF for the target's GGUF."""
    from specdesk.app.demo.native_gguf_eagle3 import export_eagle3_folder

    return export_eagle3_folder(folder, target_gguf, path)
