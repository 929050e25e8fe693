"""Training a DSpark drafter for a PyTorch target from recorded data.

DSpark (DeepSeek's DeepSpec) is the DFlash backbone of app/training/dflash.py with an
anchor-first block and a Markov head: the block [x_a, mask x (B-1)] drafts with every row,
row i the token x_{a+i+1}, and row i's logits gain markov_w2 @ markov_w1[prev_i]. The engines
chain prev through the block (the anchor, then each row's greedy draft); training forces it
with the target's own greedy tokens (the recorded top-1), which is what the chain holds
wherever the drafts so far were right, the only rows that count. Every row learns the
recorded top-k by KL, weighted as DFlash's rows are.

The folder is DeepSpec's format (`Qwen3DSparkModel`: block_size, mask_token_id,
target_layer_ids, markov_rank, markov_head_type at the top level, `markov_head.markov_w1/w2`
tensors) without the embeddings and head, which are the target's.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from specdesk.app.demo.dflash import DFlashSpec
from specdesk.app.demo.dspark import dspark_hf_config
from specdesk.engines.torch.dflash import DFlashDraftModel
from specdesk.engines.torch.model import ModelConfig

from . import dflash
from .eagle3 import Batch
from .methods import Plan, PlanInputs

MAX_MARKOV_RANK = 256  # DeepSpec's for Qwen3 targets; a narrower target gets its hidden size


def markov_rank(target: ModelConfig) -> int:
    return min(MAX_MARKOV_RANK, target.hidden_size)


def new_drafter(target_network, spec: DFlashSpec) -> DFlashDraftModel:
    return dflash.new_drafter(target_network, spec, markov_rank(target_network.config))


def teacher_previous(batch: Batch, anchors: np.ndarray, n_rows: int) -> torch.Tensor:
    """The token before each drafting row (Bt, n_blocks, n_rows): the anchor for row 0, then
    the target's greedy token at the position row i-1 learns."""
    anchor_ids = batch.tokens[:, torch.as_tensor(anchors, device=batch.tokens.device)]  # (Bt, n_blocks)
    positions, _ = dflash._targets(batch, anchors, n_rows - 1)  # (n_blocks, n_rows-1)
    greedy = batch.top_ids[:, positions, 0]  # (Bt, n_blocks, n_rows-1)
    return torch.cat([anchor_ids[..., None], greedy], dim=-1)


def block_logits(drafter: DFlashDraftModel, target_network, spec: DFlashSpec, batch: Batch,
                 anchors: np.ndarray) -> torch.Tensor:
    """Every row's logits (Bt, n_blocks, B, V), the Markov bias teacher-forced."""
    rows = dflash._block_rows(drafter, target_network, spec, batch, anchors, first_row=0)
    return target_network.logits(rows) + drafter.markov_head(teacher_previous(batch, anchors, spec.block_size))


def kl_loss(drafter: DFlashDraftModel, target_network, spec: DFlashSpec, batch: Batch, rng: np.random.Generator,
            blocks: int = 16) -> tuple[torch.Tensor, dict]:
    anchors = dflash.sample_anchors(spec, batch, rng, blocks)
    return dflash.recorded_kl(block_logits(drafter, target_network, spec, batch, anchors), batch, anchors), {}


def chain_drafts(drafter: DFlashDraftModel, target_network, spec: DFlashSpec, batch: Batch, anchors: np.ndarray,
                 depth: int) -> torch.Tensor:
    """The first `depth` drafts (n_blocks, depth) of the blocks at `anchors` in the batch's
    first sequence, read through the greedy chain as the engines read them."""
    rows = dflash._block_rows(drafter, target_network, spec, batch, anchors, first_row=0)[0, :, :depth]
    anchor_ids = batch.tokens[0, torch.as_tensor(anchors, device=batch.tokens.device)]  # (n_blocks,)
    return drafter.markov_head.chain(target_network.logits(rows), anchor_ids)[0]


def acceptance(drafter: DFlashDraftModel, target_network, spec: DFlashSpec, held: Sequence[Batch],
               depth: int) -> tuple[list[float], int]:
    return dflash.acceptance(drafter, target_network, spec, held, depth, drafts=chain_drafts)


def hf_config(spec: DFlashSpec, target: ModelConfig, rank: int) -> dict:
    """config.json in DeepSpec's format: z-lab's Qwen3 keys, the DFlash keys at the top level."""
    return dspark_hf_config(spec, target, target.hidden_size, target.rms_norm_eps, rank)


def export_drafter(drafter: DFlashDraftModel, spec: DFlashSpec, target: ModelConfig, folder: Path) -> Path:
    """A DeepSpec Qwen3DSparkModel folder (config.json, model.safetensors in float16)."""
    rank = drafter.markov_head.markov_w1.weight.shape[1]
    return dflash.export_drafter(drafter, spec, target, folder, config=hf_config(spec, target, rank))


def plan(inputs: PlanInputs) -> Plan:
    """The method table's training plan (engines/methods.py: DSpark's `Training`): DFlash's, with
    this module's Markov head."""
    return dflash.block_plan(inputs, sys.modules[__name__])
