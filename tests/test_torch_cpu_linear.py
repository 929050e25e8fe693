"""The CPU's reordered weight copies (engines/torch/cpu_linear.py): the same products as
F.linear, the same state dicts, and greedy speculation through them still equals baseline."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")
if not torch.backends.mkldnn.is_available():
    pytest.skip("this torch has no oneDNN", allow_module_level=True)

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from specdesk.app.runtime.compare import load_prompts  # noqa: E402
from specdesk.app.storage.paths import assets_dir  # noqa: E402
from specdesk.engines.torch import cpu_linear  # noqa: E402
from specdesk.engines.torch.cpu_linear import ENV, PackedLinear, linear, pack_linears, reorder  # noqa: E402
from specdesk.engines.torch.engine import TorchEngine  # noqa: E402
from specdesk.engines.types import GenerationRequest, SamplingParams, SpecConfig  # noqa: E402


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 33])
@pytest.mark.parametrize("batched", [False, True])
def test_the_copy_computes_what_f_linear_does(rows, batched):
    generator = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(96, 40, generator=generator), torch.randn(96, generator=generator)
    x = torch.randn((1, rows, 40) if batched else (rows, 40), generator=generator)
    with torch.inference_mode():
        ours = linear(x, weight, bias, reorder(weight))
    assert ours.shape == F.linear(x, weight, bias).shape
    torch.testing.assert_close(ours, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


def _module() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.SiLU(), nn.Sequential(nn.Linear(64, 32, bias=False)))


def test_packing_keeps_the_state_dict_and_the_outputs(monkeypatch):
    monkeypatch.setenv(ENV, "1")
    plain, packed = _module(), _module()
    before = packed.state_dict()
    assert pack_linears(packed)
    assert isinstance(packed[0], PackedLinear) and isinstance(packed[2][0], PackedLinear)
    after = packed.state_dict()
    assert list(after) == list(before) and all(after[n].data_ptr() == before[n].data_ptr() for n in before)
    x = torch.randn(6, 32)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), plain(x), rtol=1e-5, atol=1e-5)
    # with gradients on (training), the plain kernel runs: the copy's op has no backward
    assert packed(x).requires_grad


@pytest.mark.parametrize("precision", [None, torch.bfloat16])
def test_packed_linears_agree_with_autocast_in_every_precision(monkeypatch, precision):
    """A training step's evaluation runs the packed model under bfloat16 autocast where the CPU
    multiplies bfloat16 fast: its inputs then arrive in bfloat16, which oneDNN's float32 copy
    refuses. Both precisions are forced here, whatever this CPU would choose."""
    monkeypatch.setenv(ENV, "1")
    plain, packed = _module(), _module()
    assert pack_linears(packed)
    x = torch.randn(2, 6, 32)
    context = torch.autocast("cpu", dtype=precision) if precision else torch.autocast("cpu", enabled=False)
    with torch.inference_mode(), context:
        ours, theirs = packed(x), plain(x)
        bfloat16_input = packed(x.to(torch.bfloat16)) if precision else None  # what attention hands on
    assert ours.dtype == theirs.dtype == (precision or torch.float32)
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=1e-2 if precision else 1e-5,
                               atol=1e-2 if precision else 1e-5)
    assert bfloat16_input is None or bfloat16_input.dtype == torch.bfloat16


def test_packing_is_skipped_where_it_cannot_or_should_not_run(monkeypatch):
    monkeypatch.setenv(ENV, "0")
    module = _module()
    assert not pack_linears(module) and type(module[0]) is nn.Linear
    monkeypatch.setenv(ENV, "1")
    assert not pack_linears(_module().double())  # float32 only
    monkeypatch.setattr(cpu_linear, "MAX_PACKED_BYTES", 1024)
    assert not pack_linears(_module())  # the copy would not fit


def test_the_timing_decides_once_per_thread_count(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(cpu_linear, "_decisions", {})
    asked = []
    monkeypatch.setattr(cpu_linear, "_time_rows", lambda w, p, rows: asked.append(rows) or (1.0, 2.0))
    assert not pack_linears(_module()) and not pack_linears(_module())  # slower here: not used
    assert asked == [cpu_linear.PACKED_MIN_ROWS]
    monkeypatch.setattr(cpu_linear, "_decisions", {})
    monkeypatch.setattr(cpu_linear, "_time_rows", lambda w, p, rows: (2.0, 1.0))
    assert pack_linears(_module())


@pytest.fixture(scope="module")
def packed_engine(demo_family):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ENV, "1")
        engine = TorchEngine(demo_family["target_hf"], n_ctx=256, device="cpu", dtype="float32", n_threads=1)
        engine.load_draft(demo_family["draft_hf"])
        yield engine
    engine.close()


def _tokens(engine, prompt, spec):
    request = GenerationRequest(tuple(engine.tokenize(prompt)), max_tokens=40, sampling=SamplingParams(), spec=spec)
    return [t for event in engine.generate(request, threading.Event()) for t in event.tokens]


@pytest.mark.parametrize("method", ["draft", "mtp", "dflash"])
def test_greedy_speculation_through_the_copies_equals_baseline(packed_engine, demo_family, method, monkeypatch):
    """k = 4: verification's five rows (and DFlash's blocks) take the reordered copies."""
    monkeypatch.setenv(ENV, "1")  # drafters loaded during the test are packed too
    assert packed_engine.target.packed_linears
    spec = SpecConfig(method=method, k=4, draft_path={"draft": demo_family["draft_hf"],
                                                     "dflash": demo_family["dflash_hf"]}.get(method))
    accepted = 0
    for prompt in load_prompts(assets_dir() / "prompts" / "code.jsonl")[:6]:
        speculative = _tokens(packed_engine, prompt, spec)
        accepted += packed_engine.last_proposer.stats()["accepted"]
        assert speculative == _tokens(packed_engine, prompt, SpecConfig()), method
    assert accepted > 0
