"""The engine-agnostic parts of one generation step (DESIGN.md, "the generation contract").

Each engine owns its forward pass, its KV cache and where verification runs; what a step
commits, when a run ends and what the StepEvent says are the same everywhere, and live here
so the engines cannot drift apart on them.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from ..types import SpecDeskError, StepEvent


def check_prompt(prompt: Sequence[int], n_ctx: int, n_vocab: int) -> None:
    """Refuse a prompt that cannot run, before anything is decoded."""
    if len(prompt) >= n_ctx:
        raise SpecDeskError(f"the prompt is {len(prompt)} tokens but the context holds {n_ctx}: "
                            "shorten it or raise the context size")
    for token in prompt:
        if not (0 <= token < n_vocab):
            raise SpecDeskError(f"prompt token id {token} is outside the vocabulary of {n_vocab}")


def step_budget(max_k: int, remaining: int, room: int) -> int:
    """Draft tokens this step may propose: never more than the run can still commit
    (the target adds one token of its own) or the context can still hold."""
    return max(0, min(max_k, remaining - 1, room - 1))


def commit(draft_tokens: Sequence[int], accepted: int, next_token: int, remaining: int, room: int,
           is_eog: Callable[[int], bool], stop_at_eos: bool) -> tuple[list[int], list[bool], Optional[str]]:
    """The tokens a verified step commits, which came from the draft, and why the run ends
    here (None: it goes on). Cut at the first end-of-generation token, at max tokens and at
    the context's end, in that order of precedence for the reason."""
    committed = [*draft_tokens[:accepted], next_token]
    from_draft = [True] * accepted + [False]
    finish_reason = None
    if stop_at_eos:
        for i, token in enumerate(committed):
            if is_eog(token):
                committed, from_draft, finish_reason = committed[:i + 1], from_draft[:i + 1], "eos"
                break
    if len(committed) >= remaining:
        committed, from_draft = committed[:remaining], from_draft[:remaining]
        finish_reason = finish_reason or "length"
    if len(committed) >= room:
        committed, from_draft = committed[:room], from_draft[:room]
        finish_reason = finish_reason or "context"
    return committed, from_draft, finish_reason


def step_event(n_drafted: int, accepted: int, committed: Sequence[int], from_draft: Sequence[bool], text: str,
               draft_s: float, verify_s: float, finish_reason: Optional[str]) -> StepEvent:
    return StepEvent(
        tokens=tuple(committed),
        text=text,
        drafted=n_drafted,
        accepted=accepted,
        position_accepted=tuple(i < accepted for i in range(n_drafted)),
        from_draft=tuple(from_draft),
        draft_s=draft_s,
        verify_s=verify_s,
        finished=finish_reason is not None,
        finish_reason=finish_reason,
    )
