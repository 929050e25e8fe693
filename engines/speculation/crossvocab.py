"""Cross-vocabulary drafting: a draft model with a tokenizer of its own drafts for any target.

Each step the committed text is kept as the draft's tokens (retokenize.DraftText: the last
tokens are encoded again with the new text from a boundary both encodings agree on, and the
draft's cache keeps the common prefix, which rolls it back to the accepted text). Then:

- greedy: the draft drafts k tokens; their text is encoded with the target's tokenizer after
  the last few committed target tokens (retokenize.continuation: a token spanning the
  junction is seen, so a draft token that splits a target token is not lost) and the target
  verifies those ids as usual. Verification decides every committed token, so the output is
  the target's own whatever the draft proposes.
- sampling: drafting keeps to the tokens both vocabularies have as single tokens (the
  intersection, TLI: Timor et al. 2025, "Lossless Speculative Decoding Algorithms for
  Heterogeneous Vocabularies"): q is the draft's distribution renormalised over them and
  mapped to target ids, one draft token to one target token, so the acceptance ratio
  min(1, p/q) uses the real q and rejection sampling stays lossless.

The draft reads the prompt as plain text (control tokens stand for no text), or the
conversation as its own chat template renders it when the run gives that (`draft_prompt`). Stop tokens are the
target's: a draft token that stands for no text (its own end of turn) ends the draft.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

import numpy as np

from ..types import Draft, SamplingParams
from .drafting import ModelDraftProposer
from .retokenize import DraftText, continuation, intersection
from .verify import sample, sampling_probs


class CrossVocabDrafting(ModelDraftProposer):
    """The cross-vocabulary method on either engine; an engine subclass gives `_next_logits`
    (the draft-model method's, over the draft's own context)."""

    same_vocabulary = False  # the proposer factory loads the draft without the vocabulary check
    engine_class = "CrossVocabProposer"  # each engine's subclass, as the method table names it

    def __init__(self, context, sampling: SamplingParams, rng: np.random.Generator, p_min: float = 0.0):
        super().__init__(context, sampling, rng, p_min)
        self.draft = context.model
        self.target = None  # the target model (its tokenizer, its vocabulary's size): for_target
        self.draft_prompt = ""
        self.shared = None  # the shared tokens, for sampled drafts
        self.text: Optional[DraftText] = None
        self.n_target = 0  # target tokens of the context turned into draft text
        self.retokenize_s = 0.0  # keeping the draft's tokens in step and encoding its text for the target
        self.draft_tokens = 0  # the draft model's own tokens drafted (a target token may be more or fewer)

    def for_target(self, target, draft_prompt: str = "") -> "CrossVocabDrafting":
        """Draft for `target`; `draft_prompt`: the conversation as the draft's own chat template
        renders it (special tokens as text), else the draft reads the prompt's text."""
        self.target = target
        self.draft_prompt = draft_prompt
        self.shared = None if self.sampling.greedy else intersection(target, self.draft)
        return self

    def begin(self, prompt: Sequence[int]) -> None:
        started = time.perf_counter()
        if self.draft_prompt:
            self.text = DraftText(self.draft, self.draft.tokenize(self.draft_prompt, parse_special=True))
        else:
            bos = [self.draft.vocab.bos] if self.draft.vocab.add_bos and self.draft.vocab.bos is not None else []
            self.text = DraftText(self.draft, bos, self._bytes(prompt))
        self.n_target = len(prompt)
        self.retokenize_s += time.perf_counter() - started
        self.context.sync_prefix(self.text.ids)

    def _bytes(self, tokens: Sequence[int]) -> bytes:
        return b"".join(self.target.token_bytes(token) for token in tokens)

    def _draft_ids(self, context: Sequence[int]) -> list[int]:
        """The committed text as draft tokens, brought up to `context` (the target's tokens)."""
        if self.text is None or len(context) < self.n_target:
            self.begin(context)
        new = self._bytes(context[self.n_target:])
        self.n_target = len(context)
        return self.text.extend(new)

    def propose(self, context: Sequence[int], k: int) -> Draft:
        started = time.perf_counter()
        ids = self._draft_ids(context)
        self.retokenize_s += time.perf_counter() - started
        if len(ids) + k > self.context.n_ctx:  # the draft's tokens may outrun the target's: its context is full
            self.counters.record_proposal(0, time.perf_counter() - started)
            return Draft(())
        kept = self.context.sync_prefix(ids)
        if kept == len(ids):  # at least one token must be evaluated to get logits
            self.context.rollback(kept - 1)
            kept -= 1
        logits = self._next_logits(ids[kept:])
        draft = self._draft_sampled(logits, k) if self.shared is not None else self._draft_greedy(logits, context, k)
        self.counters.record_proposal(len(draft.tokens), time.perf_counter() - started)
        return draft

    def _draft_greedy(self, logits: np.ndarray, context: Sequence[int], k: int) -> Draft:
        """k draft tokens by argmax; their text as target tokens (at most k)."""
        text = b""
        for i in range(k):
            token = int(np.argmax(logits))
            if self.p_min > 0 and i > 0 and 1.0 / np.exp(logits - logits[token]).sum() < self.p_min:
                break
            piece = self.draft.token_bytes(token)
            if not piece:  # a control token (the draft's end of turn): the target's own decide the end
                break
            text += piece
            self.draft_tokens += 1
            if i + 1 < k:
                logits = self._next_logits([token])
        started = time.perf_counter()
        tokens = continuation(self.target, context, text)[:k] if text else []
        self.retokenize_s += time.perf_counter() - started
        return Draft(tuple(tokens))

    def _draft_sampled(self, logits: np.ndarray, k: int) -> Draft:
        """Up to k tokens sampled from the draft's q restricted to the shared tokens; q mapped
        to target ids, (n, V_target)."""
        shared = self.shared
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        for i in range(k):
            q = sampling_probs(logits, self.sampling)[shared.draft_ids]  # (n_shared,)
            mass = float(q.sum())
            if mass <= 0.0:
                break
            q = q / mass
            if self.p_min > 0 and i > 0 and q.max() < self.p_min:
                break
            pick = sample(q, self.rng)
            row = np.zeros(self.target.n_vocab, dtype=np.float64)
            row[shared.target_ids] = q
            tokens.append(int(shared.target_ids[pick]))
            self.draft_tokens += 1
            probs.append(row)
            if i + 1 < k:
                logits = self._next_logits([int(shared.draft_ids[pick])])
        return Draft(tuple(tokens), np.stack(probs) if probs else None)

    def stats(self) -> dict:
        return {**self.counters.as_dict(), "retokenize_s": self.retokenize_s, "draft_tokens": self.draft_tokens}
