"""What the drafters of both engines share: how sure a draft row is, when to stop, and the
draft-model proposer.

Native drafters (MTP, DFlash, EAGLE-3) draft the top-1 token of each row, as llama.cpp's
common/speculative.cpp does: q is then one-hot, so verification stays exact at any
temperature, and `draft_p_min` stops a draft at the first row whose top token is less
likely than that (its probability read after a top-10 cut, as llama.cpp's draft sampler
reports it).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Sequence

import numpy as np

from ..types import Draft, SamplingParams
from .stats import ProposerCounters
from .verify import sample, sampling_probs

DRAFT_TOP_K = 10  # the top-k cut of llama.cpp's draft sampler


def top1_prob(logits: np.ndarray, top_k: int = DRAFT_TOP_K) -> float:
    """The top token's probability after a top-k cut."""
    top = np.partition(logits, -top_k)[-top_k:] if logits.shape[0] > top_k else logits
    top = top - top.max()
    return float(1.0 / np.exp(top).sum())


def below_p_min(logits: np.ndarray, p_min: float) -> bool:
    """Whether a draft stops at this row (never when p_min is 0)."""
    return p_min > 0 and top1_prob(logits) < p_min


def confident_rows(rows: np.ndarray, p_min: float) -> int:
    """How many leading rows (n, V) of draft logits to keep: up to the first below p_min."""
    return next((i for i, row in enumerate(rows) if below_p_min(row, p_min)), rows.shape[0])


class ModelDraftProposer(ABC):
    """The draft-model method on either engine: a smaller model drafts autoregressively with
    its own KV cache, reconciled with the committed context by common prefix at each step
    (accepted draft tokens are not re-evaluated, rejected ones are dropped by position).
    Greedy runs draft the argmax (q one-hot); sampled runs sample from q and report it.
    draft_p_min stops the draft before a token (after the first) less likely than it.
    An engine subclasses it with `_next_logits`."""

    def __init__(self, context, sampling: SamplingParams, rng: np.random.Generator, p_min: float = 0.0):
        self.context = context  # the draft model's context: sync_prefix, rollback, decode
        self.sampling = sampling
        self.rng = rng
        self.p_min = p_min
        self.counters = ProposerCounters()
        # The last draft's top-1 probability of each row after its first, read where p_min > 0
        # (auto's tail cut): auto compares it with what the target accepted (TailCalibration).
        self.row_confidence: list[float] | None = None

    @abstractmethod
    def _next_logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Decode tokens in the draft context; the last row's logits (V,) as float32 on the host."""

    def begin(self, prompt: Sequence[int]) -> None:
        self.context.sync_prefix(prompt)

    def propose(self, context: Sequence[int], k: int) -> Draft:
        started = time.perf_counter()
        kept = self.context.sync_prefix(context)
        if kept == len(context):  # at least one token must be evaluated to get logits
            self.context.rollback(kept - 1)
            kept -= 1
        logits = self._next_logits(context[kept:])
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        confidence: list[float] = []
        for i in range(k):
            q = None if self.sampling.greedy else sampling_probs(logits, self.sampling)
            if self.p_min > 0 and i > 0:
                sure = float(1.0 / np.exp(logits - logits.max()).sum()) if q is None else float(q.max())
                if sure < self.p_min:
                    break
                confidence.append(sure)
            if q is None:
                token = int(np.argmax(logits))
            else:
                token = sample(q, self.rng)
                probs.append(q)
            tokens.append(token)
            if i + 1 < k:
                logits = self._next_logits([token])
        self.row_confidence = confidence if self.p_min > 0 else None
        self.counters.record_proposal(len(tokens), time.perf_counter() - started)
        return Draft(tuple(tokens), np.stack(probs) if probs else None)

    def accept(self, n_accepted: int, committed: Sequence[int]) -> None:
        self.counters.record_accepted(n_accepted)

    def stats(self) -> dict:
        return self.counters.as_dict()
