"""Both engines and every proposer against the written contracts of engines/speculation/protocols.py:
the names and the parameters of each method, so a drifted signature fails here."""

from __future__ import annotations

import inspect
import threading

import numpy as np
import pytest

from specdesk.engines.methods import METHODS
from specdesk.engines.speculation.loop import StepTarget
from specdesk.engines.speculation.ngram import NgramPoolProposer, NgramProposer
from specdesk.engines.speculation.proposers import SUPPORTED_METHODS, make_proposer, proposer_class
from specdesk.engines.speculation.protocols import Engine, Proposer, TargetObserver
from specdesk.engines.speculation.stats import ProposerCounters
from specdesk.engines.types import GenerationRequest, SamplingParams, SpecConfig, SpecDeskError

MODEL_METHODS = tuple(name for name, info in METHODS.items() if info.proposer)  # every model method
ENGINE_PACKAGES = ["llama.cpp", "torch"]  # the engines by name


def protocol_methods(protocol: type) -> list[str]:
    return [name for name, value in vars(protocol).items() if inspect.isfunction(value) and not name.startswith("_")]


def assert_follows(cls: type, protocol: type) -> None:
    """Every method of the protocol exists on cls with the same parameter names, in order."""
    for name in protocol_methods(protocol):
        assert callable(getattr(cls, name, None)), f"{cls.__name__} has no {name}()"
        wanted = list(inspect.signature(getattr(protocol, name)).parameters)
        have = list(inspect.signature(getattr(cls, name)).parameters)
        assert have[:len(wanted)] == wanted, f"{cls.__name__}.{name}{have} does not match the protocol's {wanted}"
        assert all(inspect.signature(getattr(cls, name)).parameters[p].default is not inspect.Parameter.empty
                   for p in have[len(wanted):]), f"{cls.__name__}.{name} needs more arguments than the protocol gives"


def all_proposer_classes() -> list[type]:
    pytest.importorskip("torch")
    return [NgramProposer, NgramPoolProposer,
            *(proposer_class(package, method) for package in ENGINE_PACKAGES for method in MODEL_METHODS)]


def test_every_proposer_follows_the_protocol_and_is_named_for_its_method():
    for cls in all_proposer_classes():
        assert_follows(cls, Proposer)
        assert cls.__name__.endswith("Proposer")
        # One constructor shape, so the factory can build any of them.
        if cls not in (NgramProposer, NgramPoolProposer):
            assert list(inspect.signature(cls).parameters)[1:] == ["sampling", "rng", "p_min"], cls


def test_hidden_state_proposers_of_both_engines_follow_the_one_observer_protocol():
    for package in ENGINE_PACKAGES:
        for method in ("mtp", "dflash", "eagle3"):
            assert_follows(proposer_class(package, method), TargetObserver)


def test_both_engines_hand_hidden_states_through_the_same_hook():
    """One shape: the shared loop's observe hook, on both engines; no callback inside a decode."""
    from specdesk.engines.llama.binding import GgufContext
    from specdesk.engines.llama.engine import LlamaEngine

    for engine in (LlamaEngine, pytest.importorskip("specdesk.engines.torch.engine").TorchEngine):
        assert list(inspect.signature(engine.observe).parameters) == \
            list(inspect.signature(StepTarget.observe).parameters)
    assert not hasattr(GgufContext, "on_decode") and "on_decode" not in inspect.getsource(GgufContext)


def test_a_drifted_signature_is_caught():
    class Drifted:
        def begin(self, prompt): ...

        def propose(self, context): ...  # no k

        def accept(self, n_accepted, committed): ...

        def stats(self): ...

    with pytest.raises(AssertionError, match="propose"):
        assert_follows(Drifted, Proposer)


def test_n_gram_proposers_count_with_proposer_counters():
    for proposer in (NgramProposer(), NgramPoolProposer()):
        proposer.begin([1, 2, 3, 1, 2])
        proposer.propose([1, 2, 3, 1, 2], 2)
        proposer.accept(1, [3])
        assert isinstance(proposer.counters, ProposerCounters)
        assert set(ProposerCounters().as_dict()) <= set(proposer.stats())
        assert proposer.stats()["proposals"] == 1 and proposer.stats()["accepted"] == 1


def test_the_factory_names_the_missing_drafter_file_per_engine():
    class Source:
        pool = NgramPoolProposer()
        drafter_file = ("folder", "DIR")
        name = "torch"

    rng = np.random.default_rng(0)
    assert make_proposer(Source(), SpecConfig(), SamplingParams(), rng) is None
    assert isinstance(make_proposer(Source(), SpecConfig("ngram"), SamplingParams(), rng), NgramProposer)
    assert make_proposer(Source(), SpecConfig("ngram-pool"), SamplingParams(), rng) is Source.pool
    with pytest.raises(SpecDeskError, match="method 'dflash' needs a DFlash drafter folder: pass --draft DIR"):
        make_proposer(Source(), SpecConfig("dflash"), SamplingParams(), rng)
    with pytest.raises(SpecDeskError, match="method 'eagle3' needs an EAGLE-3 drafter folder: pass --draft DIR"):
        make_proposer(Source(), SpecConfig("eagle3"), SamplingParams(), rng)


def check_engine(engine) -> None:
    assert isinstance(engine, Engine)
    assert_follows(type(engine), Engine)
    assert_follows(type(engine), StepTarget)  # the shared loop's hooks
    assert set(engine.method_availability()) == set(SUPPORTED_METHODS)
    tokens = engine.tokenize("def f(x):")
    assert "f(x)" in engine.detokenize(tokens)
    events = list(engine.generate(GenerationRequest(tuple(tokens), max_tokens=3), threading.Event()))
    assert sum(len(e.tokens) for e in events) == 3


def test_the_llama_engine_follows_the_protocol(demo_family):
    from specdesk.engines.llama.engine import LlamaEngine

    engine = LlamaEngine(demo_family["target_gguf"], n_ctx=64, n_threads=1)
    try:
        check_engine(engine)
    finally:
        engine.close()


def test_the_torch_engine_follows_the_protocol(demo_family):
    pytest.importorskip("torch")
    from specdesk.engines.torch.engine import TorchEngine

    engine = TorchEngine(demo_family["target_hf"], n_ctx=64, device="cpu", dtype="float32", n_threads=1)
    try:
        check_engine(engine)
        assert engine.method_availability()["dflash"].startswith("pick a DFlash drafter folder")
        engine.load_native("dflash", demo_family["dflash_hf"])
        assert engine.method_availability()["dflash"] is None  # a loaded drafter makes its method available
    finally:
        engine.close()
