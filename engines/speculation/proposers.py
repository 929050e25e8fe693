"""The one proposer factory: which proposer a request's method gets, on either engine.

The n-gram methods are engine-independent; the four model methods (draft, mtp, dflash,
eagle3) differ only in how an engine loads the model and which class drafts with it, so
an engine supplies those two things (`ModelSource`) and nothing else.
"""

from __future__ import annotations

import importlib
import os
from typing import Optional, Protocol

import numpy as np

from ..types import METHODS, SamplingParams, SpecConfig, SpecDeskError
from .ngram import NgramPoolProposer, NgramProposer
from .protocols import Proposer

SUPPORTED_METHODS = METHODS  # both engines run every method
# Every proposer is `<Method>Proposer`, built as cls(model, sampling, rng, draft_p_min).
_PROPOSERS = {"draft": ("draft", "DraftProposer"), "mtp": ("mtp", "MtpProposer"),
              "dflash": ("dflash", "DFlashProposer"), "eagle3": ("eagle3", "Eagle3Proposer")}
_DRAFTER_NAMES = {"dflash": "a DFlash drafter", "eagle3": "an EAGLE-3 drafter"}
# The modules proposer_class imports by name, in each engine package (an installer bundle
# must list them: a freezing tool cannot see imports made by name).
PROPOSER_MODULES = tuple(module for module, _ in _PROPOSERS.values())


class ModelSource(Protocol):
    """What an engine gives the factory for the model methods."""

    pool: NgramPoolProposer  # learns across the turns of a chat, so it lives as long as the engine
    drafter_file: tuple[str, str]  # how a drafter is stored and named on the command line: ("GGUF", "PATH")

    def load_draft(self, path: str | os.PathLike) -> object: ...

    def load_native(self, method: str, path: str | os.PathLike | None = None) -> object: ...

    proposer_package: str  # the engine's package: its `<method module>.<Method>Proposer` classes


def make_proposer(engine: ModelSource, spec: SpecConfig, sampling: SamplingParams,
                  rng: np.random.Generator) -> Optional[Proposer]:
    """The proposer for one run (None for baseline); `rng` is shared with the verifier."""
    if spec.method not in SUPPORTED_METHODS:
        raise SpecDeskError(f"method {spec.method!r} is not available: use one of {', '.join(SUPPORTED_METHODS)}")
    if spec.method == "none":
        return None
    if spec.method == "auto":
        from .auto import make_auto_proposer

        return make_auto_proposer(engine, spec, sampling, rng)
    if spec.method == "ngram":
        return NgramProposer(spec.ngram_min, spec.ngram_max)
    if spec.method == "ngram-pool":
        return engine.pool
    if spec.method in _DRAFTER_NAMES and not spec.draft_path:
        stored, argument = engine.drafter_file
        raise SpecDeskError(f"method {spec.method!r} needs {_DRAFTER_NAMES[spec.method]} {stored}: "
                            f"pass --draft {argument}")
    if spec.method == "draft":
        model = engine.load_draft(spec.draft_path)
    else:
        model = engine.load_native(spec.method, None if spec.method == "mtp" else spec.draft_path)
    return proposer_class(engine.proposer_package, spec.method)(model, sampling, rng, spec.draft_p_min)


def proposer_class(package: str, method: str) -> type:
    """A model method's proposer class in an engine package; imported on first use, so an
    engine that never runs a method never imports its module."""
    module, name = _PROPOSERS[method]
    return getattr(importlib.import_module(f".{module}", package), name)
