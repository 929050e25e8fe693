"""The engine-agnostic parts of one generation step (docs/ARCHITECTURE.md, "The generation contract").

Each engine owns its forward pass, its KV cache and where verification runs; what a step
commits, when a run ends and what the StepEvent says are the same everywhere, and live here
so the engines cannot drift apart on them.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Iterator, Optional, Protocol, Sequence

import numpy as np

from ..text import IncrementalDetokenizer
from ..types import Draft, GenerationRequest, SamplingParams, SpecDeskError, StepEvent
from .proposers import ModelSource, make_proposer, prepare
from .protocols import ChoosingProposer, Proposer, TargetObserver
from .step import verified_step
from .verify import VerifyResult

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


def check_prompt_text(text: str, n_ctx: int, model, special: bool = True, longest: Optional[int] = None) -> None:
    """Refuse text that cannot be a prompt before tokenizing it: text longer than the context
    can hold whatever the tokens (so a 50 MB paste is refused at once, not after seconds of
    tokenizing), and text that is not valid Unicode (a lone surrogate). `special`: whether
    the tokenizer will recognise special-token text (see max_token_chars); `longest`: that
    figure when the caller has it already (an engine process's, read there once).

    The bound assumes a token stands for at most its own text (times NORMALIZATION_SLACK);
    a tokenizer that fuses a whole run of unknown characters into one token (a Hugging Face
    Unigram or BPE model with fuse_unk and no byte fallback) is outside it."""
    if len(text) >= n_ctx:  # shorter text cannot be proven too long: a token covers at least one character
        longest = (longest or max_token_chars(model, special)) * NORMALIZATION_SLACK
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
               draft_s: float, verify_s: float, finish_reason: Optional[str], method: Optional[str] = None,
               reason: Optional[str] = None, auto_report: Optional[dict] = None) -> StepEvent:
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
        method=method,
        reason=reason,
        auto_report=auto_report,
    )


def top_entries(logits: np.ndarray, n: int) -> list[tuple[int, float]]:
    """The n largest entries of a (V,) logits row as (token, logit), largest first; ties go
    to the lower token id, as argmax breaks them."""
    row = np.asarray(logits, dtype=np.float32)
    order = np.argsort(-row, kind="stable")[:n]
    return [(int(token), float(row[token])) for token in order]


class TargetCache(Protocol):
    """The target's KV cache as the loop sees it: positions held, and a cut back to a position."""

    @property
    def n_past(self) -> int: ...

    def rollback(self, n_keep: int) -> None: ...


class TargetModel(Protocol):
    n_vocab: int

    def is_eog(self, token: int) -> bool: ...

    def token_bytes(self, token: int) -> bytes: ...


class StepTarget(ModelSource, Protocol):
    """The hooks an engine gives the shared loop (and, as a ModelSource, the proposer
    factory); everything else about a step lives here. `observer` is the proposer the target
    hands its hidden states to (protocols.target_observer), or None: the loop names it for
    every pass, and anything that is not a TargetObserver means none."""

    n_ctx: int
    target: TargetModel
    context: TargetCache
    last_proposer: Optional[Proposer]

    def prefill(self, prompt: list[int], observer: Optional[TargetObserver]) -> None:
        """Put prompt[:-1] in the target's cache (reusing what it holds) and give `observer`
        the prompt's rows; its `begin` has already run."""

    def target_pass(self, tokens: list[int], observer: Optional[TargetObserver]) -> Any:
        """One target pass over [last, d1..dk] at the next positions, keeping the rows
        `observer` reads; what it returns goes to `verify_pass` and `observe`."""

    def verify_pass(self, draft: Draft, output: Any, sampling: SamplingParams,
                    rng: np.random.Generator) -> VerifyResult:
        """Accept a prefix of the draft against the pass's rows (engines/speculation/verify.py semantics)."""

    def observe(self, observer: Optional[TargetObserver], output: Any, tokens: list[int], start: int) -> None:
        """Hand `observer` the rows of the tokens the target kept: `tokens` are those tokens,
        at positions start.., followed by the token after them."""


def run_steps(engine: StepTarget, request: GenerationRequest, cancel: threading.Event) -> Iterator[StepEvent]:
    """The generation loop of both engines: one verified step after another
    (engines/speculation/step.py: propose up to k tokens -> one target pass over
    [last, d1..dk] -> accept a prefix -> roll the cache back past the rejected tail), each
    committing accepted + one target token as one StepEvent. Baseline is the same loop with
    k = 0, so baseline and speculative numbers come from the same code."""
    prompt = list(request.prompt_tokens)
    check_prompt(prompt, engine.n_ctx, engine.target.n_vocab)
    prepare(engine, request.spec)  # its own job, done before this run starts: auto's costs
    # One generator for the proposer's samples and the verifier's draws, in that order each step.
    rng = np.random.default_rng(request.sampling.seed)
    proposer = make_proposer(engine, request.spec, request.sampling, rng)
    engine.last_proposer = proposer
    # Checked once per run (a protocol check costs more than a small model's pass): who gets
    # the target's hidden states (protocols.target_observer), a chooser's observer read anew
    # each pass since it may let it go.
    chooser = proposer if isinstance(proposer, ChoosingProposer) else None
    reader = proposer if isinstance(proposer, TargetObserver) else None

    def observer() -> Optional[TargetObserver]:
        return chooser.observer if chooser is not None else reader

    if proposer is not None:
        proposer.begin(prompt)
    engine.prefill(prompt, observer())
    detok = IncrementalDetokenizer(engine.target.token_bytes)
    context = list(prompt)
    generated = 0
    max_k = request.spec.draft_tokens
    while not cancel.is_set():
        remaining = request.max_tokens - generated
        room = engine.n_ctx - len(context)  # tokens the sequence may still grow by
        if room <= 0:
            return
        step = verified_step(engine, proposer, observer(), context, step_budget(max_k, remaining, room),
                             request.sampling, rng)
        n_drafted = len(step.draft.tokens)
        committed, from_draft, finish_reason = commit(step.draft.tokens, step.accepted, step.next_token, remaining,
                                                      room, engine.target.is_eog, request.stop_at_eos)
        if chooser is not None:
            chooser.record_timing(1 + n_drafted, step.pass_s, step.observe_s, step.draft_s)
        if proposer is not None:
            proposer.accept(step.accepted, committed)
        context.extend(committed)
        generated += len(committed)
        text = detok.push(committed)
        if finish_reason is not None:
            text += detok.flush()
        choice = chooser.choice if chooser is not None else None
        yield step_event(n_drafted, step.accepted, committed, from_draft, text, step.draft_s,
                         step.pass_s + step.observe_s, finish_reason, choice and choice.method,
                         choice and choice.reason,
                         chooser.report() if chooser is not None and finish_reason is not None else None)
        if finish_reason is not None:
            return
