"""benchmarks/pass_cost.py's arithmetic, and the binding's pass settings it sweeps, on the small demo target."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import pass_cost
from specdesk.engines.llama.binding import GgufContext, GgufModel, gguf_header

SHAPE = {"weight_bytes": 1000, "matmul_elements": 400, "n_layers": 2, "n_head": 4, "n_head_kv": 2, "head_dim": 8}


def test_pass_bytes_are_the_weights_once_and_the_attended_cache():
    # keys and values, f16: 2 x 2 bytes x 2 layers x 2 KV heads x 8 = 128 bytes per position
    assert pass_cost.pass_bytes(SHAPE, n=1, n_past=9) == 1000 + 128 * 10
    assert pass_cost.pass_bytes(SHAPE, n=4, n_past=9) == 1000 + 128 * 13


def test_pass_flops_grow_with_the_rows():
    # 2 per weight element per row; Q.K and P.V: 2 x 2 x layers x heads x head_dim per attended pair
    attention_one = 2 * 2 * 2 * 4 * 8 * 1 * (9 + 1)
    assert pass_cost.pass_flops(SHAPE, n=1, n_past=9) == 2 * 400 + attention_one
    assert pass_cost.pass_flops(SHAPE, n=3, n_past=9) == 2 * 400 * 3 + 2 * 2 * 2 * 4 * 8 * 3 * (9 + 2)


def test_pass_shape_counts_what_a_target_pass_reads(demo_family):
    path = demo_family["target_gguf"]
    tensors = gguf_header(path).tensor_infos
    shape = pass_cost.pass_shape(path)
    untied = "output.weight" in tensors
    expected = sum(info.n_bytes for name, info in tensors.items()
                   if not (untied and name == "token_embd.weight"))
    assert shape["weight_bytes"] == expected
    assert shape["weight_type"] == "F16"
    assert shape["matmul_elements"] < sum(info.n_elements for info in tensors.values())


def test_context_settings_reach_llama_cpp(demo_family):
    """The settings the benchmark sweeps: repacked buffers off, a small micro-batch, flash
    attention off; the logits agree with the default context's (different kernels, same model)."""
    default_model = GgufModel(demo_family["target_gguf"])
    model = GgufModel(demo_family["target_gguf"], extra_buffers=False)
    try:
        default = GgufContext(default_model, n_ctx=64, n_threads=1)
        tuned = GgufContext(model, n_ctx=64, n_threads=1, n_batch=16, n_ubatch=4, flash_attn_type=0)
        assert model._lib.llama_n_ubatch(tuned._ctx) == 4
        tokens = model.tokenize("def add(a, b):\n    return")[:8]
        a, b = default.decode(tokens), tuned.decode(tokens)
        assert a.shape == b.shape == (len(tokens), model.n_vocab)
        assert np.array_equal(a.argmax(axis=1), b.argmax(axis=1))
        assert np.abs(a - b).max() < 0.05 * np.abs(a).max()
        default.close()
        tuned.close()
    finally:
        model.close()
        default_model.close()


@pytest.mark.parametrize("threads", [1, 2])
def test_measure_prints_a_line_with_its_floor(demo_family, threads):
    job = {"model": demo_family["target_gguf"], "threads": threads, "ubatch": 512, "extra": "on", "flash": "auto",
           "cpu_module": "auto", "max_n": 3, "peak_n": 4, "repeats": 1, "warmup": 0, "prompt_tokens": 8,
           "bandwidth": None}
    line = pass_cost.measure(job)
    assert line["timed"] == ("cpu" if threads == 1 else "wall")
    assert len(line["ratio"]) == len(line["floor_ms"]) == len(line["bound"]) == 3
    assert line["ratio"][0] == 1.0
    assert all(floor > 0 for floor in line["floor_ms"])
    assert set(line["bound"]) <= {"memory", "compute"}
    assert line["weight_type"] == "F16"
