"""Draft-model proposer: a smaller GGUF model in its own context drafts k tokens."""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from ..spec.stats import ProposerCounters
from ..spec.verify import sample, sampling_probs
from ..types import Draft, SamplingParams
from .binding import GgufContext


class DraftProposer:
    """Drafts autoregressively with its own KV cache, reconciled with the committed
    context by common prefix at each step (so accepted draft tokens are not re-evaluated
    and rejected ones are rolled back by position)."""

    def __init__(self, context: GgufContext, sampling: SamplingParams, rng: np.random.Generator,
                 p_min: float = 0.0):
        self.context = context
        self.sampling = sampling
        self.rng = rng
        self.p_min = p_min
        self.counters = ProposerCounters()

    def begin(self, prompt: Sequence[int]) -> None:
        self.context.sync_prefix(prompt)

    def propose(self, context: Sequence[int], k: int) -> Draft:
        started = time.perf_counter()
        kept = self.context.sync_prefix(context)
        if kept == len(context):  # need at least one token evaluated to get logits
            self.context.rollback(kept - 1)
            kept -= 1
        logits = self.context.decode(list(context[kept:]), all_logits=False)[-1]
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        for i in range(k):
            if self.sampling.greedy:
                token = int(np.argmax(logits))
                if self.p_min > 0 and i > 0:
                    shifted = np.exp(logits - logits[token])
                    if 1.0 / shifted.sum() < self.p_min:
                        break
            else:
                q = sampling_probs(logits, self.sampling)
                if self.p_min > 0 and i > 0 and q.max() < self.p_min:
                    break
                token = sample(q, self.rng)
                probs.append(q)
            tokens.append(token)
            if i + 1 < k:
                logits = self.context.decode([token], all_logits=False)[-1]
        self.counters.record_proposal(len(tokens), time.perf_counter() - started)
        return Draft(tuple(tokens), np.stack(probs) if probs else None)

    def accept(self, n_accepted: int, committed: Sequence[int]) -> None:
        self.counters.record_accepted(n_accepted)

    def stats(self) -> dict:
        return self.counters.as_dict()
