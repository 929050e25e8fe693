"""Training a DFlash block drafter for a PyTorch target from recorded data.

The drafter is the engine's DFlashDraftModel (engines/torch/dflash.py) in z-lab's format, with
the demo recipe's loss (app/demo/dflash.py): blocks [x_a, mask x (B-1)] at anchors a attend
to the context rows before a (fc over the recorded outputs of the target layers it reads)
and to their own block, and row i learns the target's distribution of x_{a+i}; here that
distribution is the recorded top-k rather than the live target, so training needs no target
pass. Its layers start as the target's last layers, as the demo's do. DSpark (dspark.py) uses
the same block rows, anchors, loss and acceptance, with every row of the block drafting.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from specdesk.app.demo.dflash import DFlashSpec, copy_core_layers, dflash_hf_config, drafter_config
from specdesk.engines.torch.dflash import DFlashDraftModel
from specdesk.engines.torch.model import ModelConfig, rope_tables
from specdesk.engines.types import SpecDeskError

from .eagle3 import Batch
from .methods import DEPTH, Plan, PlanInputs, figures

BLOCK_SIZE = 8
POSITION_DECAY = 2.0  # loss weight exp(-i / decay) of block row i, as the demo recipe weighs them


def layer_ids(num_layers: int) -> tuple[int, ...]:
    """Target layers whose outputs the drafter reads: early, middle and late, never the last one
    (llama.cpp hands out layer inputs, so the output of the last layer is out of its reach)."""
    last_usable = max(0, num_layers - 2)
    return tuple(sorted({min(i, last_usable) for i in (1, num_layers // 2, num_layers - 2)}))


MAX_LAYERS = 8


def spec_for(target: ModelConfig, layers: Optional[int] = None) -> DFlashSpec:
    """The drafter trained for `target`: `layers` layers (default 1) of the target's shape over
    8-row blocks. A second layer lets the mask rows learn the anchor token from the first layer's
    attention before they read the context, which one layer must do at once."""
    layers = 1 if layers is None else layers
    if not 1 <= layers <= MAX_LAYERS:
        raise SpecDeskError(f"--draft-layers {layers} is out of range for a block drafter: use 1 to {MAX_LAYERS}")
    return DFlashSpec(num_layers=layers, num_heads=target.num_attention_heads, head_dim=target.head_dim,
                      intermediate_size=target.intermediate_size, block_size=BLOCK_SIZE,
                      target_layer_ids=layer_ids(target.num_hidden_layers), mask_token_id=0)


def taps(spec: DFlashSpec) -> tuple[int, ...]:
    """H[id + 1], the input of the layer after each one read: that layer's output."""
    return tuple(i + 1 for i in spec.target_layer_ids)


def new_drafter(target_network, spec: DFlashSpec, markov_rank: int = 0) -> DFlashDraftModel:
    """A drafter whose layers start as the target's last ones; with `markov_rank`, DSpark's
    anchor-first layout and a Markov head whose markov_w2 starts at zero (no bias yet)."""
    config = target_network.config
    drafter_shape = drafter_config(spec, config.hidden_size, config.rms_norm_eps, config.rms_norm_eps, config)
    if markov_rank:
        drafter_shape = replace(drafter_shape, markov_rank=markov_rank, sample_from_anchor=True)
    drafter = DFlashDraftModel(drafter_shape)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in drafter.named_parameters():
            param.copy_(torch.ones_like(param) if name.endswith("norm.weight")
                        else torch.zeros_like(param) if name.endswith("markov_w2.weight")
                        else torch.randn(param.shape, generator=generator) * 0.02)
    copy_core_layers(drafter, target_network, config)
    drafter.norm.weight.data.copy_(target_network.model.norm.weight.float())
    return drafter


def _block_rows(drafter, target_network, spec: DFlashSpec, batch: Batch, anchors: np.ndarray,
                first_row: int = 1) -> torch.Tensor:
    """Normed drafting rows (Bt, n_blocks, B - first_row, d) of blocks at `anchors` (shared by
    the batch): rows 1.. for DFlash, every row (first_row 0) for anchor-first DSpark."""
    B, n_blocks = spec.block_size, len(anchors)
    Bt, T = batch.tokens.shape
    device = batch.tokens.device
    cos, sin = (t.to(device) for t in rope_tables(drafter_config(spec, 1, 1.0, 1.0, target_network.config).model,
                                                   T + B))
    with torch.no_grad():
        ids = torch.full((Bt, n_blocks, B), spec.mask_token_id, dtype=torch.long, device=device)
        ids[:, :, 0] = batch.tokens[:, torch.as_tensor(anchors, device=device)]
        block = target_network.model.embed_tokens(ids.view(Bt, -1)).float()  # (Bt, n_blocks*B, d)
    positions = torch.as_tensor((anchors[:, None] + np.arange(B)[None, :]).reshape(-1), device=device)  # (n_blocks*B,)
    block_of = torch.arange(n_blocks, device=device).repeat_interleave(B)
    starts = torch.as_tensor(anchors, device=device).repeat_interleave(B)
    sees_context = torch.arange(T, device=device)[None, :] < starts[:, None]
    sees_block = block_of[:, None] == block_of[None, :]
    mask = torch.cat([sees_context, sees_block], dim=1)  # (n_blocks*B, T + n_blocks*B)
    rope = (cos[positions], sin[positions], cos[:T], sin[:T])
    rows = drafter(block, batch.features, rope, 0, mask)  # (Bt, n_blocks*B, d)
    return rows.view(Bt, n_blocks, B, -1)[:, :, first_row:]


def _targets(batch: Batch, anchors: np.ndarray, n_rows: int):
    """Positions a+i (i = 0..n_rows-1) whose recorded distribution (of x_{a+i+1}) drafting row i
    learns, and where they exist."""
    positions = torch.as_tensor(anchors[:, None] + np.arange(n_rows)[None, :],
                                device=batch.tokens.device)  # (n_blocks, n_rows)
    exists = positions[None] <= batch.lengths[:, None, None] - 1  # (Bt, n_blocks, n_rows)
    return positions.clamp(max=batch.tokens.shape[1] - 1), exists


def sample_anchors(spec: DFlashSpec, batch: Batch, rng: np.random.Generator, blocks: int = 16) -> np.ndarray:
    T, B = int(batch.lengths.min()), spec.block_size
    choices = np.arange(1, max(2, T - B + 1))
    return np.sort(rng.choice(choices, size=min(blocks, len(choices)), replace=False))


def recorded_kl(logits: torch.Tensor, batch: Batch, anchors: np.ndarray) -> torch.Tensor:
    """KL(recorded top-k || drafter) of drafting rows' logits (Bt, n_blocks, rows, V), row i
    weighted exp(-i / decay), over the rows whose position exists."""
    logq = torch.log_softmax(logits, dim=-1)
    positions, exists = _targets(batch, anchors, logits.shape[2])
    p, ids = batch.top_p[:, positions], batch.top_ids[:, positions]  # (Bt, n_blocks, rows, k)
    per_row = (p * (torch.log(p.clamp_min(1e-12)) - logq.gather(-1, ids))).sum(-1)
    weights = torch.exp(-torch.arange(logits.shape[2], dtype=torch.float32, device=per_row.device) / POSITION_DECAY)
    weights = weights.expand_as(per_row)
    weights = weights * exists
    return (per_row * weights).sum() / weights.sum().clamp_min(1e-9)


def kl_loss(drafter, target_network, spec: DFlashSpec, batch: Batch, rng: np.random.Generator,
            blocks: int = 16) -> tuple[torch.Tensor, dict]:
    anchors = sample_anchors(spec, batch, rng, blocks)
    rows = _block_rows(drafter, target_network, spec, batch, anchors)
    return recorded_kl(target_network.logits(rows), batch, anchors), {}  # rows 1..B-1 learn a..a+B-2


def greedy_drafts(drafter, target_network, spec: DFlashSpec, batch: Batch, anchors: np.ndarray,
                  depth: int) -> torch.Tensor:
    """The first `depth` drafts (n_blocks, depth) of the blocks at `anchors` in the batch's first sequence."""
    rows = _block_rows(drafter, target_network, spec, batch, anchors)[0, :, :depth]  # (n_blocks, depth, d)
    return target_network.logits(rows).argmax(-1)


@torch.no_grad()
def acceptance(drafter, target_network, spec: DFlashSpec, held: Sequence[Batch], depth: int,
               blocks: int = 16, drafts=greedy_drafts) -> tuple[list[float], int]:
    """Per drafting row i = 1..depth, the share of answer blocks whose first i drafts all equal
    the target's greedy tokens; one sequence per batch, blocks spread over its answer. `drafts`
    gives a block's drafts as the engines read them."""
    alive_sums, count = np.zeros(depth), 0
    for batch in held:
        length, start = int(batch.lengths[0]), int(batch.answer_starts[0])
        first, last = max(1, start - 1), length - depth - 1
        if last < first:
            continue
        anchors = np.unique(np.linspace(first, last, num=min(blocks, last - first + 1)).round().astype(np.int64))
        drafted = drafts(drafter, target_network, spec, batch, anchors, depth)  # (n_blocks, depth)
        positions, _ = _targets(batch, anchors, depth)
        greedy = batch.top_ids[0, positions, 0]  # (n_blocks, depth)
        alive = torch.cumprod((drafted == greedy).long(), dim=1)
        alive_sums += alive.sum(0).cpu().numpy()
        count += len(anchors)
    return [float(s) / max(1, count) for s in alive_sums], count


def export_drafter(drafter: DFlashDraftModel, spec: DFlashSpec, target: ModelConfig, folder: Path,
                   config: Optional[dict] = None) -> Path:
    """A z-lab DFlashDraftModel folder (config.json, model.safetensors in float16), or the
    drafter under another format's `config`."""
    import json
    import os

    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    weights = {name: t.detach().to(torch.float16).contiguous().cpu() for name, t in drafter.state_dict().items()}
    tmp = folder / f"model.safetensors.tmp-{os.getpid()}"
    save_file(weights, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, folder / "model.safetensors")
    config = config or dflash_hf_config(spec, target, target.hidden_size, target.rms_norm_eps)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return folder


# --- the method table's training facts (engines/methods.py: DFlash's and DSpark's `Training`) ------
def plan_taps(network) -> tuple[int, ...]:
    return taps(spec_for(network.config))


def check(config: ModelConfig, draft_layers: Optional[int]) -> None:
    """A layer count the target cannot give is refused before recording."""
    spec_for(config, draft_layers)


def block_plan(inputs: PlanInputs, block) -> Plan:
    """A block drafter's plan; `block` is the module of its head: this one for DFlash, dspark's
    for DSpark (the DFlash backbone with a Markov head)."""
    network, config = inputs.network, inputs.network.config
    spec = spec_for(config, inputs.draft_layers)
    drafter = block.new_drafter(network, spec).to(inputs.device)
    held_batches = [inputs.batch([s]) for s in inputs.held]

    def step(rng):
        return block.kl_loss(drafter, network, spec, inputs.sample(rng), rng)

    def evaluate():
        return figures(*block.acceptance(drafter, network, spec, held_batches, DEPTH))

    return Plan(inputs.method, inputs.taps, drafter, step, evaluate,
                lambda folder: block.export_drafter(drafter, spec, config, folder))


def plan(inputs: PlanInputs) -> Plan:
    return block_plan(inputs, sys.modules[__name__])


def export_gguf(folder: Path, target_gguf: Path, path: Path, from_gguf: bool) -> Path:
    """The drafter as a dflash GGUF for the target's GGUF (a DSpark drafter with its Markov head)."""
    from specdesk.app.demo.native_gguf_dflash import export_dflash_folder

    return export_dflash_folder(folder, target_gguf, path)
