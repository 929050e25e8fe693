"""The written contracts between the generation loop, the proposers and the app.

`Proposer` is what engines/speculation/loop.py drives each step (`TargetObserver` one that
reads the target's hidden states, `ChoosingProposer` one that picks a method each step);
`Engine` is what the app and the engine host call. Both engines and every proposer are
checked against them in tests/test_protocols.py, so a missing method fails a test rather
than a user's run.
"""

from __future__ import annotations

import threading
from typing import Iterator, Optional, Protocol, Sequence, runtime_checkable

from ..types import Draft, GenerationRequest, StepEvent


@runtime_checkable
class Proposer(Protocol):
    """Drafts tokens for the target to verify. The loop calls begin once per run, then
    propose / accept once per step; stats() reports speculation/stats.ProposerCounters' fields."""

    def begin(self, prompt: Sequence[int]) -> None: ...

    def propose(self, context: Sequence[int], k: int) -> Draft:
        """Up to k tokens to follow `context` (fewer, or none, when unsure)."""

    def accept(self, n_accepted: int, committed: Sequence[int]) -> None:
        """The target kept the first n_accepted draft tokens and committed `committed`."""

    def stats(self) -> dict: ...


@runtime_checkable
class TargetObserver(Proposer, Protocol):
    """A proposer that reads the target's hidden states (MTP, DFlash, EAGLE-3), the same on
    both engines: the target keeps the rows of `taps` (t: the input of layer t; empty: the
    final-normed rows the lm_head reads), and after each pass (and the prompt's prefill) the
    engine calls `observe` with the rows of the tokens it kept. `output.hidden` and
    `output.taps[t]` are those rows: a PyTorch pass's tensors, or views of llama.cpp's
    buffers that last until the target's next decode."""

    taps: tuple[int, ...]

    def observe(self, output, tokens: Sequence[int], start: int) -> None:
        """output's first len(tokens) - 1 rows are those of tokens[:-1] at positions start..;
        tokens[-1] is the token the target put after them."""


@runtime_checkable
class ChoosingProposer(Proposer, Protocol):
    """A proposer that chooses a method and k each step from measured costs and drafts with
    one of its member proposers (method auto, engines/speculation/auto.py). The loop hands it
    each step's timings before `accept`, puts its `choice` (`.method`, `.reason`) in every
    StepEvent and its `report()` in the last one; `observer` is the member the target feeds its
    hidden states every pass, whichever member drafted (None: none, or no longer)."""

    choice: object
    observer: Optional[TargetObserver]

    def record_timing(self, pass_tokens: int, pass_s: float, observe_s: float, draft_s: float) -> None:
        """This step's target pass over `pass_tokens` tokens (verification included), the
        hidden-state catch-up after it, and the drafting, in seconds."""

    def report(self) -> dict:
        """What it chose and why, for compare's JSON and the server's `specdesk` field."""


def target_observer(proposer) -> Optional[TargetObserver]:
    """The proposer the target hands its hidden states to on this pass: the proposer itself
    when it reads them, a choosing proposer's `observer`, else none."""
    fed = proposer.observer if isinstance(proposer, ChoosingProposer) else proposer
    return fed if isinstance(fed, TargetObserver) else None


@runtime_checkable
class Engine(Protocol):
    """A target model that generates: what the app asks of the llama.cpp and PyTorch engines."""

    name: str
    n_ctx: int

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def method_availability(self) -> dict[str, Optional[str]]:
        """Each method: None where this target can run it now, else why not."""

    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[StepEvent]: ...

    def top_logits(self, tokens: Sequence[int], n: int = 2) -> list[tuple[int, float]]:
        """The target's n highest (token, logit) for the token after `tokens`, largest first."""

    def logit_noise(self, tokens: Sequence[int]) -> float:
        """How far a gap between leading logits moves between a batched pass and single-token
        passes over `tokens` (engines/speculation/noise.py)."""

    def close(self) -> None: ...
