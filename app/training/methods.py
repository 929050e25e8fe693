"""What the trainer asks of a method, through its row (engines/methods.py, `Training`): the
target layers it reads, the module trained, a training step, the held-out acceptance, and the
export. Each method's own training file holds its `plan`; this module holds what they share."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from specdesk.engines.methods import resolve, training

from .record import Recorded

DEPTH = 3  # draft positions measured (and EAGLE-3 steps unrolled); the k of the speedup compare


@dataclass(frozen=True)
class Batch:
    tokens: torch.Tensor  # (B, T) long, padded with 0
    features: torch.Tensor  # (B, T, n*d) float32
    top_ids: torch.Tensor  # (B, T, k) long
    top_p: torch.Tensor  # (B, T, k) float32: the target's top-k probabilities, renormalised
    lengths: torch.Tensor  # (B,) real lengths
    answer_starts: torch.Tensor  # (B,)


def make_batch(sequences: Sequence[Recorded], max_len: int, device: str | torch.device = "cpu") -> Batch:
    """Right-padded batch on `device`; sequences longer than max_len are cut (positions stay absolute)."""
    T = min(max_len, max(len(s.tokens) for s in sequences))
    B, width, k = len(sequences), sequences[0].features.shape[1], sequences[0].top_ids.shape[1]
    tokens = torch.zeros(B, T, dtype=torch.long)
    features = torch.zeros(B, T, width)
    top_ids = torch.zeros(B, T, k, dtype=torch.long)
    top_logp = torch.full((B, T, k), -1e4)
    lengths, starts = torch.zeros(B, dtype=torch.long), torch.zeros(B, dtype=torch.long)
    for i, s in enumerate(sequences):
        n = min(T, len(s.tokens))
        tokens[i, :n] = torch.from_numpy(s.tokens[:n])
        features[i, :n] = torch.from_numpy(s.features[:n].astype(np.float32))
        top_ids[i, :n] = torch.from_numpy(s.top_ids[:n].astype(np.int64))
        top_logp[i, :n] = torch.from_numpy(s.top_logp[:n].astype(np.float32))
        lengths[i], starts[i] = n, s.answer_start
    return Batch(*(t.to(device) for t in (tokens, features, top_ids, torch.softmax(top_logp, dim=-1), lengths, starts)))


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


@dataclass(frozen=True)
class PlanInputs:
    """What a method's plan (its row's `Training.plan`) is made from."""

    method: str
    network: torch.nn.Module  # the target: its config, embeddings, final norm and head
    train: Sequence[Recorded]
    held: Sequence[Recorded]
    batch_size: int
    max_len: int
    target: Path
    taps: tuple[int, ...]  # the target layers recorded for it
    draft_layers: Optional[int] = None  # --draft-layers

    @property
    def device(self) -> torch.device:
        return self.network.model.embed_tokens.weight.device

    def batch(self, sequences: Sequence[Recorded]):
        """Recorded sequences as one batch on the training device."""
        return make_batch(list(sequences), self.max_len, self.device)

    def sample(self, rng: np.random.Generator):
        """A training batch: batch_size sequences drawn without replacement."""
        picks = rng.choice(len(self.train), size=min(self.batch_size, len(self.train)), replace=False)
        return self.batch([self.train[i] for i in picks])


def figures(shares: list[float], rows: int) -> tuple[float, dict]:
    """(mean accepted drafts, the held-out figures the trainer reports) from per-position acceptance."""
    return sum(shares), {"acceptance": [round(a, 4) for a in shares], "rows": rows}


def method_taps(method: str, network) -> tuple[int, ...]:
    """The target layers a recording keeps for this method (its row's `Training.taps`)."""
    return tuple(resolve(training(method).taps)(network))


def plan(method: str, network, train: Sequence[Recorded], held: Sequence[Recorded], batch_size: int,
         max_len: int, target: Path, draft_layers: Optional[int] = None) -> Plan:
    """The method's plan, as its row's `Training.plan` makes it."""
    inputs = PlanInputs(method, network, train, held, batch_size, max_len, Path(target),
                        method_taps(method, network), draft_layers)
    return resolve(training(method).plan)(inputs)
