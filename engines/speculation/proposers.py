"""The one proposer factory: which proposer a request's method gets, on either engine.

The n-gram methods are engine-independent (their row's `shared` proposer); the model methods
(draft, MTP, DFlash, EAGLE-3) differ only in how an engine loads the model and which class
drafts with it (their row's `native` loader and `proposer` class for each engine,
engines/methods.py), so an engine supplies those two things (`ModelSource`) and nothing else.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional, Protocol

import numpy as np

from ..methods import METHODS as METHOD_TABLE
from ..methods import auto_methods, method_info, needs_draft_model, resolve
from ..types import METHODS, SamplingParams, SpecConfig, SpecDeskError
from .auto import AutoPlan, auto_plan, start_auto
from .compat import loaded_incompatibilities
from .costs import load_or_measure, measured
from .ngram import NgramPoolProposer
from .protocols import Proposer

SUPPORTED_METHODS = METHODS  # both engines run every method
# The modules the rows name in each engine package, imported by name on first use (an
# installer bundle must list them: a freezing tool cannot see imports made by name).
PROPOSER_MODULES = tuple(dict.fromkeys(
    module.rsplit(".", 1)[1] for info in METHOD_TABLE.values()
    for refs in (info.proposer, info.native, info.problem) for module, _ in refs.values()))


class ModelSource(Protocol):
    """What an engine gives the factory for the model methods."""

    pool: NgramPoolProposer  # learns across the turns of a chat, so it lives as long as the engine
    drafter_file: tuple[str, str]  # how a drafter is stored and named on the command line: ("GGUF", "PATH")

    def load_draft(self, path: str | os.PathLike) -> object: ...

    def load_native(self, method: str, path: str | os.PathLike | None = None) -> object: ...

    def method_availability(self) -> dict[str, Optional[str]]: ...

    name: str  # the engine's name: the key of the rows' `proposer` and `native` (engines/methods.py)


def make_proposer(engine: ModelSource, spec: SpecConfig, sampling: SamplingParams,
                  rng: np.random.Generator) -> Optional[Proposer]:
    """The proposer for one run (None for baseline); `rng` is shared with the verifier."""
    info = method_info(spec.method)
    if info.role == "baseline":
        return None
    if info.role == "chooser":
        spec = auto_spec(engine, spec)
        plan = auto_plan(spec, engine.method_availability())
        return start_auto(engine, plan, _auto_members(engine, spec, plan, sampling, rng), sampling.greedy)
    if info.shared is not None:
        return resolve(info.shared)(engine, spec)
    if info.takes == "drafter_file" and not spec.draft_path:
        stored, argument = engine.drafter_file
        raise SpecDeskError(f"method {spec.method!r} needs {info.drafter} {stored}: pass --draft {argument}")
    cls = proposer_class(engine.name, spec.method)
    # A proposer made for a draft with a vocabulary of its own (engines/speculation/crossvocab.py)
    # says so, and is given the target to tokenize for.
    same_vocabulary = getattr(cls, "same_vocabulary", True)
    if info.takes == "draft_model":
        model = engine.load_draft(spec.draft_path, same_vocabulary=same_vocabulary)
    else:
        model = engine.load_native(spec.method, spec.draft_path if info.uses_file else None)
    proposer = cls(model, sampling, rng, spec.draft_p_min)
    return proposer if same_vocabulary else proposer.for_target(engine.target, spec.draft_prompt)


def prepare(engine: ModelSource, spec: SpecConfig) -> None:
    """What a method needs done before its runs, as a job of its own rather than inside one:
    auto's costs on this machine, read from its cache or measured now by a probe, and measured
    again when the passes replies ran drifted far from it (engines/speculation/costs.py). Quick
    once done; the other methods need nothing."""
    if method_info(spec.method).role != "chooser":
        return
    spec = auto_spec(engine, spec)
    plan = auto_plan(spec, engine.method_availability())
    model = measured(engine, plan.methods, plan.max_k, plan.draft_path)
    if model is not None and not model.drifted():
        return
    # Proposers of its own, greedy and seeded: the probe draws nothing from a run's generator.
    members = _auto_members(engine, spec, plan, SamplingParams(), np.random.default_rng(0))
    load_or_measure(engine, members, plan.max_k, plan.draft_path, plan.observer)


def auto_spec(engine: ModelSource, spec: SpecConfig) -> SpecConfig:
    """Auto's request with a draft model whose vocabulary differs from the target's: the
    cross-vocabulary method takes the draft method's place among its candidates (measured like
    any other), where the draft method would refuse the draft."""
    candidates = spec.auto_methods or auto_methods()
    if not spec.draft_path or not any(needs_draft_model(m) for m in candidates):
        return spec
    cross = next((m for m in METHOD_TABLE if crosses_vocabularies(engine.name, m)), None)
    draft = engine.load_draft(spec.draft_path, same_vocabulary=False).model
    if cross is None or not loaded_incompatibilities(engine.target, draft):
        return spec
    methods = (cross if needs_draft_model(m) else m for m in candidates)
    return dataclasses.replace(spec, auto_methods=tuple(dict.fromkeys(methods)))


def cross_vocabulary_draft(engine: ModelSource, spec: SpecConfig):
    """The draft model of a run that drafts across vocabularies (the cross-vocabulary method, or
    auto given a draft of another vocabulary), else None: its conversation is rendered in its
    own template (SpecConfig.draft_prompt)."""
    if not spec.draft_path:
        return None
    methods = auto_spec(engine, spec).auto_methods if method_info(spec.method).role == "chooser" else (spec.method,)
    if not any(crosses_vocabularies(engine.name, m) for m in methods):
        return None
    return engine.load_draft(spec.draft_path, same_vocabulary=False).model


def _auto_members(engine: ModelSource, spec: SpecConfig, plan: AutoPlan, sampling: SamplingParams,
                  rng: np.random.Generator) -> dict[str, Proposer]:
    """The proposer of each method auto chooses among, as that method alone would get it."""
    return {method: make_proposer(engine, dataclasses.replace(spec, method=method, auto_methods=()), sampling, rng)
            for method in plan.methods}


def crosses_vocabularies(engine: str, method: str) -> bool:
    """Whether `method` drafts with a model of another vocabulary on this engine (its proposer
    class says `same_vocabulary = False`: engines/speculation/crossvocab.py)."""
    info = method_info(method)
    return (info.takes == "draft_model" and bool(info.proposer) and engine in info.proposer
            and not getattr(proposer_class(engine, method), "same_vocabulary", True))


def proposer_class(engine: str, method: str) -> type:
    """A model method's proposer class on an engine (by its `name`), as its row names it; imported
    on first use, so an engine that never runs a method never imports its module."""
    info = method_info(method)
    if engine not in info.proposer:
        raise SpecDeskError(f"method {method!r} does not run on the {engine} engine")
    return resolve(info.proposer[engine])


def load_native(engine, method: str, path=None):
    """A native drafter (MTP layers, a DFlash or EAGLE-3 drafter) for an engine, loaded by the
    loader its row names for that engine: (engine, path) -> the model its proposer drafts with."""
    info = method_info(method)
    if engine.name not in info.native:
        raise SpecDeskError(f"method {method!r} has no native drafter on the {engine.name} engine")
    return resolve(info.native[engine.name])(engine, path)
