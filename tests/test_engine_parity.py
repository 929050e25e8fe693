"""Every option behaves the same on both engines: native drafters (MTP, DFlash, EAGLE-3) draft
the top-1 token at any temperature, and draft_p_min stops every drafter the same way."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from specdesk.app.runtime.compare import load_prompts  # noqa: E402
from specdesk.app.demo.export_native_gguf import build_native  # noqa: E402
from specdesk.app.storage.paths import assets_dir  # noqa: E402
from specdesk.engines.speculation.drafting import confident_rows, top1_prob  # noqa: E402
from specdesk.engines.speculation.proposers import make_proposer  # noqa: E402
from specdesk.engines.types import SamplingParams, SpecConfig  # noqa: E402

from llama_helpers import generate_tokens  # noqa: E402

PROMPTS = load_prompts(assets_dir() / "prompts" / "code.jsonl")[:4]
NATIVE = ("mtp", "dflash", "eagle3")
CASES = [(engine, method) for engine in ("llama", "torch") for method in (*NATIVE, "draft")]


@pytest.fixture(scope="module")
def engines(demo_family, demo_cache_dir, tmp_path_factory):
    """(engine, draft path) for each engine and method."""
    from specdesk.engines.llama.engine import LlamaEngine
    from specdesk.engines.torch.engine import TorchEngine
    from torch_helpers import make_eagle3_checkpoint

    native = build_native(demo_family, demo_cache_dir / "native")
    llama_mtp = LlamaEngine(native["mtp_gguf"], n_ctx=256, n_threads=1)
    llama = LlamaEngine(demo_family["target_gguf"], n_ctx=256, n_threads=1)
    torch_engine = TorchEngine(demo_family["target_hf"], n_ctx=256, device="cpu", dtype="float32", n_threads=1)
    eagle3_hf = make_eagle3_checkpoint(demo_family["target_hf"], tmp_path_factory.mktemp("eagle3") / "eagle3-hf")
    yield {
        ("llama", "mtp"): (llama_mtp, None), ("llama", "dflash"): (llama, native["dflash_gguf"]),
        ("llama", "eagle3"): (llama, native["eagle3_gguf"]), ("llama", "draft"): (llama, demo_family["draft_gguf"]),
        ("torch", "mtp"): (torch_engine, None), ("torch", "dflash"): (torch_engine, demo_family["dflash_hf"]),
        ("torch", "eagle3"): (torch_engine, str(eagle3_hf)), ("torch", "draft"): (torch_engine, demo_family["draft_hf"]),
    }
    for engine in (llama_mtp, llama, torch_engine):
        engine.close()


def first_draft(engine, spec: SpecConfig, sampling: SamplingParams, prompt: list[int]):
    """The draft of a run's first step, through the engine's own hooks."""
    proposer = make_proposer(engine, spec, sampling, np.random.default_rng(sampling.seed))
    proposer.begin(prompt)
    engine.prefill(prompt, proposer)
    return proposer.propose(prompt, spec.k)


@pytest.mark.parametrize("engine_name,method", [c for c in CASES if c[1] in NATIVE])
def test_native_drafts_are_the_top_token_at_any_temperature(engines, engine_name, method):
    engine, path = engines[engine_name, method]
    spec = SpecConfig(method, k=4, draft_path=path)
    for prompt in PROMPTS:
        tokens = engine.tokenize(prompt)
        greedy = first_draft(engine, spec, SamplingParams(), tokens)
        for seed in (1, 2):
            hot = first_draft(engine, spec, SamplingParams(temperature=1.5, top_k=50, seed=seed), tokens)
            # q is one-hot (probs None) and the tokens do not depend on the sampler or its seed.
            assert hot.probs is None and hot.tokens == greedy.tokens, f"{engine_name} {method} on {prompt[:30]!r}"
        assert len(greedy.tokens) > 0


@pytest.mark.parametrize("engine_name,method", CASES)
def test_draft_p_min_stops_drafts_and_stays_lossless(engines, engine_name, method):
    engine, path = engines[engine_name, method]
    drafted = {}
    for p_min in (0.0, 0.6):
        spec = SpecConfig(method, k=4, draft_path=path, draft_p_min=p_min)
        total = 0
        for prompt in PROMPTS:
            tokens = engine.tokenize(prompt)
            speculative = generate_tokens(engine, tokens, spec, max_tokens=24)
            total += engine.last_proposer.stats()["drafted"]
            assert speculative == generate_tokens(engine, tokens, SpecConfig(), max_tokens=24), \
                f"p_min {p_min} on {prompt[:30]!r}"
        drafted[p_min] = total
    assert drafted[0.6] < drafted[0.0], f"{engine_name} {method}: p_min 0.6 drafted {drafted[0.6]} of {drafted[0.0]}"


def test_confident_rows_stop_at_the_first_unsure_row():
    sure, unsure = np.array([9.0, 0.0, 0.0]), np.array([1.0, 0.9, 0.8])
    assert top1_prob(sure) > 0.99 and top1_prob(unsure) < 0.4
    rows = np.stack([sure, sure, unsure, sure])
    assert confident_rows(rows, 0.0) == 4
    assert confident_rows(rows, 0.5) == 2
    assert confident_rows(rows[2:], 0.5) == 0
