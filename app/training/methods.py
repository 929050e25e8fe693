"""What each trainable method needs from the command: the target layers it reads, the module
trained, a training step, the held-out acceptance, and the export."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from . import dflash, draft, dspark, eagle3, mtp
from .record import Recorded

DEPTH = 3  # draft positions measured (and EAGLE-3 steps unrolled); the k of the speedup compare


@dataclass
class Plan:
    method: str
    taps: tuple[int, ...]
    module: torch.nn.Module
    step: Callable[[np.random.Generator], tuple[torch.Tensor, dict]]  # one training batch -> (loss, figures)
    evaluate: Callable[[], tuple[float, dict]]  # held-out -> (mean accepted drafts, figures)
    export: Callable[[Path], Path]
    # held-out figures of another drafter of this method for the same target (a folder), or None
    evaluate_reference: Optional[Callable[[Path], tuple[float, dict]]] = None


def method_taps(method: str, network) -> tuple[int, ...]:
    config = network.config
    if method == "eagle3":
        return eagle3.default_taps(config.num_hidden_layers)
    if method == "mtp":
        return mtp.taps(config)
    if method == "draft":  # a draft model reads tokens only: the target's top-k is all it learns from
        return ()
    return dflash.taps(dflash.spec_for(config))


def plan(method: str, network, train: Sequence[Recorded], held: Sequence[Recorded], batch_size: int,
         max_len: int, target: Path, draft_layers: Optional[int] = None) -> Plan:
    config = network.config
    taps = method_taps(method, network)
    device = network.model.embed_tokens.weight.device

    def sample(rng: np.random.Generator) -> eagle3.Batch:
        picks = rng.choice(len(train), size=min(batch_size, len(train)), replace=False)
        return eagle3.make_batch([train[i] for i in picks], max_len, device)

    def figures(shares: list[float], rows: int) -> tuple[float, dict]:
        return sum(shares), {"acceptance": [round(a, 4) for a in shares], "rows": rows}

    if method == "eagle3":
        head = eagle3.new_head(network, seed=0).to(device)
        head_config, embed = eagle3.head_config(config), network.model.embed_tokens
        held_batch = eagle3.make_batch(list(held), max_len, device)

        def step(rng):
            batch = sample(rng)
            return eagle3.kl_loss(eagle3.unroll(head, head_config, embed, batch, DEPTH), batch)

        def evaluate():
            return figures(*eagle3.acceptance(eagle3.unroll(head, head_config, embed, held_batch, DEPTH), held_batch))

        def evaluate_reference(folder: Path):
            reference, reference_config = eagle3.load_head(folder, config, device)
            with torch.no_grad():
                return figures(*eagle3.acceptance(eagle3.unroll(reference, reference_config, embed, held_batch, DEPTH),
                                                  held_batch))

        return Plan(method, taps, head, step, evaluate, lambda folder: eagle3.export_head(head, config, taps, folder),
                    evaluate_reference)

    if method == "mtp":
        layer = mtp.new_layer(network).to(device)
        held_batch = eagle3.make_batch(list(held), max_len, device)

        def mtp_step(rng):
            batch = sample(rng)
            return eagle3.kl_loss(mtp.unroll(layer, network, batch, DEPTH), batch)

        def mtp_evaluate():
            return figures(*eagle3.acceptance(mtp.unroll(layer, network, held_batch, DEPTH), held_batch))

        return Plan(method, taps, layer, mtp_step, mtp_evaluate,
                    lambda folder: mtp.export_target_with_mtp(layer, target, folder))

    if method == "draft":
        layers = draft.layer_ids(config.num_hidden_layers, draft_layers)
        model = draft.new_draft(network, layers, target)
        held_batches = [eagle3.make_batch(list(held[i:i + batch_size]), max_len, device)
                        for i in range(0, len(held), batch_size)]

        def draft_step(rng):
            batch = sample(rng)
            return eagle3.kl_loss([draft.next_logits(model, batch)], batch)

        def draft_evaluate():
            return figures(*draft.held_out_figures(model, held_batches, DEPTH))

        return Plan(method, taps, model, draft_step, draft_evaluate,
                    lambda folder: draft.export_draft(model, target, layers, folder))

    spec = dflash.spec_for(config, draft_layers)
    block = dspark if method == "dspark" else dflash  # DSpark: the DFlash backbone with a Markov head
    drafter = block.new_drafter(network, spec).to(device)
    held_batches = [eagle3.make_batch([s], max_len, device) for s in held]

    def dflash_step(rng):
        return block.kl_loss(drafter, network, spec, sample(rng), rng)

    def dflash_evaluate():
        return figures(*block.acceptance(drafter, network, spec, held_batches, DEPTH))

    return Plan(method, taps, drafter, dflash_step, dflash_evaluate,
                lambda folder: block.export_drafter(drafter, spec, config, folder))
