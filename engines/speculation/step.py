"""One verified step: propose up to k tokens -> one target pass over [last, d1..dk] ->
accept a prefix -> roll the cache back past the rejected tail -> hand the kept rows to the
proposer that reads the target's hidden states.

The generation loop (engines/speculation/loop.run_steps) runs it every step, and auto's cost
probe (engines/speculation/costs.py) times a hidden-state drafter with it, so both measure
the same step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..types import Draft, SamplingParams


@dataclass(frozen=True)
class VerifiedStep:
    draft: Draft
    accepted: int  # draft tokens the target kept
    next_token: int  # the target's own token after them
    draft_s: float  # proposing
    pass_s: float  # the target pass over [last, *draft] and verification
    observe_s: float  # the rollback and a hidden-state drafter's catch-up on the kept rows

    @property
    def kept(self) -> list[int]:
        """The tokens the target kept: the accepted draft prefix and its own next token."""
        return [*self.draft.tokens[:self.accepted], self.next_token]


def verified_step(engine, proposer, observer, context: Sequence[int], k: int, sampling: SamplingParams,
                  rng: np.random.Generator) -> VerifiedStep:
    """One step after `context` on `engine` (a loop.StepTarget); the caller commits the kept
    tokens and tells the proposer what was accepted. `observer`: the proposer the target hands
    its hidden states to this pass (protocols.target_observer), or None."""
    started = time.perf_counter()
    draft = proposer.propose(context, k) if (proposer is not None and k > 0) else Draft(())
    drafted = time.perf_counter()
    n_past = engine.context.n_past
    output = engine.target_pass([context[-1], *draft.tokens], observer)
    result = engine.verify_pass(draft, output, sampling, rng)
    passed = time.perf_counter()
    engine.context.rollback(n_past + 1 + result.accepted)
    # The rows of every token the target accepted, before any cut at eos or length.
    engine.observe(observer, output, [context[-1], *draft.tokens[:result.accepted], result.next_token], n_past)
    verified = time.perf_counter()
    return VerifiedStep(draft, result.accepted, result.next_token, drafted - started, passed - drafted,
                        verified - passed)
