"""The one proposer factory: which proposer a request's method gets, on either engine.

The n-gram methods are engine-independent (SHARED_PROPOSERS); the model methods (draft, mtp,
dflash, eagle3) differ only in how an engine loads the model and which class drafts with it
(the method table's `proposer`, engines/methods.py), so an engine supplies those two things
(`ModelSource`) and nothing else.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Callable, Optional, Protocol

import numpy as np

from ..methods import METHODS as METHOD_TABLE
from ..methods import method_info
from ..types import METHODS, SamplingParams, SpecConfig, SpecDeskError
from .auto import AutoPlan, auto_plan, start_auto
from .costs import load_or_measure, measured
from .ngram import NgramPoolProposer, NgramProposer
from .protocols import Proposer

SUPPORTED_METHODS = METHODS  # both engines run every method
# The modules proposer_class imports by name, in each engine package (an installer bundle
# must list them: a freezing tool cannot see imports made by name).
PROPOSER_MODULES = tuple(info.proposer[0] for info in METHOD_TABLE.values() if info.proposer)


# Methods that need no model: method -> its proposer for an engine and a request.
SHARED_PROPOSERS: dict[str, Callable[["ModelSource", SpecConfig], Proposer]] = {
    "ngram": lambda engine, spec: NgramProposer(spec.ngram_min, spec.ngram_max),
    "ngram-pool": lambda engine, spec: engine.pool,  # learns across the turns of a chat
}


class ModelSource(Protocol):
    """What an engine gives the factory for the model methods."""

    pool: NgramPoolProposer  # learns across the turns of a chat, so it lives as long as the engine
    drafter_file: tuple[str, str]  # how a drafter is stored and named on the command line: ("GGUF", "PATH")

    def load_draft(self, path: str | os.PathLike) -> object: ...

    def load_native(self, method: str, path: str | os.PathLike | None = None) -> object: ...

    def method_availability(self) -> dict[str, Optional[str]]: ...

    proposer_package: str  # the engine's package: its `<method module>.<Method>Proposer` classes


def make_proposer(engine: ModelSource, spec: SpecConfig, sampling: SamplingParams,
                  rng: np.random.Generator) -> Optional[Proposer]:
    """The proposer for one run (None for baseline); `rng` is shared with the verifier."""
    info = method_info(spec.method)
    if spec.method == "none":
        return None
    if spec.method == "auto":
        plan = auto_plan(spec, engine.method_availability())
        return start_auto(engine, plan, _auto_members(engine, spec, plan, sampling, rng), sampling.greedy)
    if spec.method in SHARED_PROPOSERS:
        return SHARED_PROPOSERS[spec.method](engine, spec)
    if info.takes == "drafter_file" and not spec.draft_path:
        stored, argument = engine.drafter_file
        raise SpecDeskError(f"method {spec.method!r} needs {info.drafter} {stored}: pass --draft {argument}")
    cls = proposer_class(engine.proposer_package, spec.method)
    # A proposer made for a draft with a vocabulary of its own (engines/speculation/crossvocab.py)
    # says so, and is given the target to tokenize for.
    same_vocabulary = getattr(cls, "same_vocabulary", True)
    if info.takes == "draft_model":
        model = engine.load_draft(spec.draft_path, same_vocabulary=same_vocabulary)
    else:
        model = engine.load_native(spec.method, spec.draft_path if info.uses_file else None)
    proposer = cls(model, sampling, rng, spec.draft_p_min)
    return proposer if same_vocabulary else proposer.for_target(engine.target)


def prepare(engine: ModelSource, spec: SpecConfig) -> None:
    """What a method needs done before its runs, as a job of its own rather than inside one:
    auto's costs on this machine, read from its cache or measured now by a probe, and measured
    again when the passes replies ran drifted far from it (engines/speculation/costs.py). Quick
    once done; the other methods need nothing."""
    if spec.method != "auto":
        return
    plan = auto_plan(spec, engine.method_availability())
    model = measured(engine, plan.methods, plan.max_k, plan.draft_path)
    if model is not None and not model.drifted():
        return
    # Proposers of its own, greedy and seeded: the probe draws nothing from a run's generator.
    members = _auto_members(engine, spec, plan, SamplingParams(), np.random.default_rng(0))
    load_or_measure(engine, members, plan.max_k, plan.draft_path, plan.observer)


def _auto_members(engine: ModelSource, spec: SpecConfig, plan: AutoPlan, sampling: SamplingParams,
                  rng: np.random.Generator) -> dict[str, Proposer]:
    """The proposer of each method auto chooses among, as that method alone would get it."""
    return {method: make_proposer(engine, dataclasses.replace(spec, method=method, auto_methods=()), sampling, rng)
            for method in plan.methods}


def proposer_class(package: str, method: str) -> type:
    """A model method's proposer class in an engine package; imported on first use, so an
    engine that never runs a method never imports its module."""
    module, name = method_info(method).proposer
    return getattr(importlib.import_module(f".{module}", package), name)
