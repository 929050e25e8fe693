"""Draft-model proposer: a second, smaller Hugging Face model on the same device drafts k tokens."""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import torch

from ..spec.stats import ProposerCounters
from ..spec.verify import sample, sampling_probs
from ..types import Draft, SamplingParams
from .context import TorchContext, TorchModel

MAX_VOCAB_SIZE_DIFFERENCE = 128
TOKEN_TEXT_CHECK_START = 5  # as llama.cpp: the first ids are often control tokens


def incompatibilities(target: TorchModel, draft: TorchModel, max_reasons: int = 5) -> list[str]:
    """Every reason the draft cannot serve the target (vocab type, size, BOS/EOS, token text)."""
    reasons: list[str] = []
    t, d = target.vocab, draft.vocab
    if t.vocab_type != d.vocab_type:
        reasons.append(f"vocab type {t.vocab_type} vs {d.vocab_type}")
    if abs(t.n_tokens - d.n_tokens) > MAX_VOCAB_SIZE_DIFFERENCE:
        reasons.append(f"vocab size {t.n_tokens} vs {d.n_tokens}")
    if t.add_bos != d.add_bos or (t.add_bos and t.bos != d.bos):
        reasons.append(f"BOS id {t.bos} (added: {t.add_bos}) vs {d.bos} (added: {d.add_bos})")
    if t.eos != d.eos:
        reasons.append(f"EOS id {t.eos} vs {d.eos}")
    if not reasons:
        for token in range(TOKEN_TEXT_CHECK_START, min(t.n_tokens, d.n_tokens)):
            a, b = target.token_text(token), draft.token_text(token)
            if a != b:
                reasons.append(f"token {token}: {a!r} vs {b!r}")
                if len(reasons) >= max_reasons:
                    break
    return reasons


class DraftProposer:
    """Drafts autoregressively with its own static KV cache, reconciled with the committed
    context by common prefix at each step: accepted draft tokens are not re-evaluated,
    rejected ones are dropped by position."""

    def __init__(self, context: TorchContext, sampling: SamplingParams, rng: np.random.Generator,
                 p_min: float = 0.0):
        self.context = context
        self.sampling = sampling
        self.rng = rng
        self.p_min = p_min
        self.counters = ProposerCounters()

    def begin(self, prompt: Sequence[int]) -> None:
        self.context.sync_prefix(prompt)

    def _next_logits(self, tokens: Sequence[int]) -> torch.Tensor:
        return self.context.decode(tokens, all_logits=False).logits[-1]  # (V,)

    def propose(self, context: Sequence[int], k: int) -> Draft:
        started = time.perf_counter()
        kept = self.context.sync_prefix(context)
        if kept == len(context):  # at least one token must be evaluated to get logits
            self.context.rollback(kept - 1)
            kept -= 1
        logits = self._next_logits(context[kept:])
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        for i in range(k):
            if self.sampling.greedy:
                token = int(torch.argmax(logits))
                if self.p_min > 0 and i > 0 and float(torch.softmax(logits.float(), -1)[token]) < self.p_min:
                    break
            else:
                q = sampling_probs(logits.float().cpu().numpy(), self.sampling)
                if self.p_min > 0 and i > 0 and q.max() < self.p_min:
                    break
                token = sample(q, self.rng)
                probs.append(q)
            tokens.append(token)
            if i + 1 < k:
                logits = self._next_logits([token])
        self.counters.record_proposal(len(tokens), time.perf_counter() - started)
        return Draft(tuple(tokens), np.stack(probs) if probs else None)

    def accept(self, n_accepted: int, committed: Sequence[int]) -> None:
        self.counters.record_accepted(n_accepted)

    def stats(self) -> dict:
        return self.counters.as_dict()
