"""Frozen dataclasses passed between the stages of generation.

These are the whole vocabulary of the generation contract (docs/ARCHITECTURE.md): a request goes
in, one StepEvent per target forward pass comes out, RunStats summarises a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .errors import SpecDeskError
from .methods import method_info, method_names, needs_draft_model, proposing_methods

METHODS = method_names()  # the method table's names (engines/methods.py), in its order
MAX_DRAFT_TOKENS = 16


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k limit
    seed: int = 0

    def __post_init__(self) -> None:
        if not (0.0 <= self.temperature <= 10.0):
            raise SpecDeskError(f"temperature {self.temperature} is out of range: use 0 (greedy) to 10")
        if not (0.0 < self.top_p <= 1.0):
            raise SpecDeskError(f"top-p {self.top_p} is out of range: use a value in (0, 1]")
        if self.top_k < 0:
            raise SpecDeskError(f"top-k {self.top_k} is out of range: use 0 (off) or a positive count")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class SpecConfig:
    method: str = "none"
    k: int = 4  # draft tokens per step (upper bound for variable-length proposers)
    draft_path: Optional[str] = None
    ngram_min: int = 1
    ngram_max: int = 4
    draft_p_min: float = 0.0  # a draft model stops drafting when its top probability falls below this
    auto_methods: tuple[str, ...] = ()  # method "auto": the methods it may choose from (empty: every one available)
    draft_prompt: str = ""  # a draft with another vocabulary: the conversation in its own template ("": the prompt's text)

    def __post_init__(self) -> None:
        method_info(self.method)
        if self.method != "none" and not (1 <= self.k <= MAX_DRAFT_TOKENS):
            raise SpecDeskError(f"k = {self.k} is out of range: use 1 to {MAX_DRAFT_TOKENS}")
        if needs_draft_model(self.method) and not self.draft_path:
            raise SpecDeskError(f"method {self.method!r} needs a draft model: pass --draft PATH")
        if not (0.0 <= self.draft_p_min < 1.0):
            raise SpecDeskError(f"draft p-min {self.draft_p_min} is out of range: use 0 (off) up to below 1")
        for method in self.auto_methods:
            if method not in proposing_methods():
                raise SpecDeskError(f"auto cannot choose {method!r}: "
                                    f"name methods among {', '.join(proposing_methods())}")
        if not (1 <= self.ngram_min <= self.ngram_max):
            raise SpecDeskError(f"n-gram sizes {self.ngram_min}..{self.ngram_max} are invalid: need 1 <= min <= max")

    @property
    def draft_tokens(self) -> int:
        return 0 if self.method == "none" else self.k


@dataclass(frozen=True)
class GenerationRequest:
    prompt_tokens: tuple[int, ...]
    max_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    spec: SpecConfig = field(default_factory=SpecConfig)
    stop_at_eos: bool = True

    def __post_init__(self) -> None:
        if not self.prompt_tokens:
            raise SpecDeskError("the prompt is empty")
        if self.max_tokens < 1:
            raise SpecDeskError(f"max tokens {self.max_tokens} is out of range: use at least 1")


@dataclass(frozen=True)
class Draft:
    """What a proposer offers for one step."""

    tokens: tuple[int, ...]  # (k,) proposed continuation, possibly empty
    probs: Optional[np.ndarray] = None  # (k, vocab) draft distributions; None means one-hot


@dataclass(frozen=True)
class StepEvent:
    """One target forward pass (one verification step)."""

    tokens: tuple[int, ...]  # committed this step, at least one
    text: str  # their text; never splits a UTF-8 character (held back until complete)
    drafted: int
    accepted: int
    position_accepted: tuple[bool, ...]  # (drafted,) per draft position
    from_draft: tuple[bool, ...]  # (len(tokens),) whether each committed token was an accepted draft token
    draft_s: float
    verify_s: float
    finished: bool = False
    finish_reason: Optional[str] = None  # "eos", "length", "cancelled" on the last event
    method: Optional[str] = None  # method auto: what drafted this step ("none": nothing did)
    reason: Optional[str] = None  # method auto: why, e.g. "draft, k = 3: expected 1.30x"
    # method auto, on the run's last event: its share of steps by method and k, and the costs it used
    auto_report: Optional[dict] = None


@dataclass(frozen=True)
class RunStats:
    tokens: int
    seconds: float
    passes: int
    drafted: int
    accepted: int
    draft_s: float
    verify_s: float
    per_position_drafted: tuple[int, ...]
    per_position_accepted: tuple[int, ...]
    accepted_length_histogram: tuple[int, ...]  # index n: passes that accepted n draft tokens

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per verification pass (accepted drafts plus the target's own)."""
        return self.tokens / self.passes if self.passes else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.per_position_accepted, self.per_position_drafted)]
