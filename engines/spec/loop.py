"""The engine-agnostic parts of one generation step (DESIGN.md, "the generation contract").

Each engine owns its forward pass, its KV cache and where verification runs; what a step
commits, when a run ends and what the StepEvent says are the same everywhere, and live here
so the engines cannot drift apart on them.
"""

from __future__ import annotations

import weakref
from typing import Callable, Optional, Sequence

from ..types import SpecDeskError, StepEvent

# Some tokenizers normalize text first (NFC composes a letter and its accents into one
# character); a token then stands for up to this many times the characters of its own text.
NORMALIZATION_SLACK = 4

_WHITESPACE = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200b))) \
    + "\u2028\u2029\u202f\u205f\u3000"  # what str.isspace() accepts
_longest_token: "weakref.WeakKeyDictionary[object, dict[bool, int]]" = weakref.WeakKeyDictionary()


def check_prompt(prompt: Sequence[int], n_ctx: int, n_vocab: int) -> None:
    """Refuse a prompt that cannot run, before anything is decoded."""
    if len(prompt) >= n_ctx:
        raise SpecDeskError(f"the prompt is {len(prompt)} tokens but the context holds {n_ctx}: "
                            "shorten it or raise the context size")
    for token in prompt:
        if not (0 <= token < n_vocab):
            raise SpecDeskError(f"prompt token id {token} is outside the vocabulary of {n_vocab}")


class PromptTooLong(SpecDeskError):
    """Text that provably cannot fit the context. Its message starts with TOO_LONG, so the
    error is still recognised after crossing from an engine process (which keeps only text)."""


TOO_LONG = "the prompt is too long: "


def is_prompt_too_long(error: BaseException) -> bool:
    return isinstance(error, PromptTooLong) or str(error).startswith(TOO_LONG)


def max_token_chars(model, special: bool = True) -> int:
    """The most characters of text any one token of `model` stands for: its bytes, and with
    `special` (text tokenized with special tokens recognised, as chat templates are) also
    its vocabulary text, which a special token matches whole. Read once per model."""
    longest = _longest_token.get(model, {}).get(special)
    if longest is None:
        longest = 1
        for token in range(model.n_vocab):
            longest = max(longest, len(model.token_bytes(token)))
            if special:
                longest = max(longest, len(model.token_text(token)))
        _longest_token.setdefault(model, {})[special] = longest
    return longest


def check_prompt_text(text: str, n_ctx: int, model, special: bool = True) -> None:
    """Refuse text that cannot be a prompt before tokenizing it: text longer than the context
    can hold whatever the tokens (so a 50 MB paste is refused at once, not after seconds of
    tokenizing), and text that is not valid Unicode (a lone surrogate). `special`: whether
    the tokenizer will recognise special-token text (see max_token_chars).

    The bound assumes a token stands for at most its own text (times NORMALIZATION_SLACK);
    a tokenizer that fuses a whole run of unknown characters into one token (a Hugging Face
    Unigram or BPE model with fuse_unk and no byte fallback) is outside it."""
    if len(text) >= n_ctx:  # shorter text cannot be proven too long: a token covers at least one character
        longest = max_token_chars(model, special) * NORMALIZATION_SLACK
        # Some tokenizers drop whitespace (WordPiece, collapsed runs): only the rest counts.
        if len(text) > n_ctx * longest and len(text) - sum(map(text.count, _WHITESPACE)) > n_ctx * longest:
            raise PromptTooLong(f"{TOO_LONG}{len(text):,} characters, more than the context of {n_ctx} tokens "
                                f"can hold (a token of this model covers at most {longest // NORMALIZATION_SLACK} "
                                "characters): shorten it or raise the context size")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise SpecDeskError(f"the prompt is not valid text: character {e.start + 1} is a lone surrogate "
                            f"({text[e.start]!a}); remove it") from None


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
