"""llama.cpp's CPU module: ggml picks it by what the CPU reports; SpecDesk keeps it only when a
probe decodes through it, else the best one that does (engines/llama/cpu_variant.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdesk.engines.llama import cpu_variant
from specdesk.engines.llama.binding import llama_lib


@pytest.fixture
def folder(monkeypatch, tmp_path) -> Path:
    folder = Path(llama_lib().llama_cpp._lib._name).parent  # loading it chose a module and named it in ENV
    monkeypatch.setenv("SPECDESK_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(cpu_variant.ENV, raising=False)
    return folder


def test_a_module_that_dies_is_passed_over_for_the_best_one_that_runs(folder, monkeypatch):
    order = cpu_variant.ranked(folder)
    if len(order) < 2:
        pytest.skip("this build has a single CPU module")
    probed = []

    def probe(path):
        probed.append(path)
        return (False, "a decode ended with SIGILL") if path == order[0][1] else (True, "")

    monkeypatch.setattr(cpu_variant, "probe", probe)
    chosen, instead, skipped = cpu_variant.choose(folder)
    assert (chosen, instead) == (order[0][1], order[1][1])
    assert skipped == [f"{order[0][1].name}: a decode ended with SIGILL"]
    assert cpu_variant.os.environ[cpu_variant.ENV] == str(order[1][1])  # child processes skip the probe
    # the verdicts are kept: a second choice probes nothing
    cpu_variant.os.environ.pop(cpu_variant.ENV)
    assert cpu_variant.choose(folder)[1] == order[1][1] and probed == [order[0][1], order[1][1]]
    verdicts = json.loads((Path(cpu_variant.os.environ["SPECDESK_CACHE_DIR"]) / "llama-cpu-modules.json").read_text())
    assert sorted(v["runs"] for v in verdicts.values()) == [False, True]


def test_the_probe_decodes_a_quantized_model_through_the_module_this_process_uses(folder):
    chosen, instead, skipped = cpu_variant.choose(folder)
    runs, why = cpu_variant.probe(instead or chosen)
    assert runs, why
    # the modules passed over really fail their probe (on a machine whose CPU reports more than it runs)
    for line in skipped:
        name = line.split(":")[0]
        assert not cpu_variant.probe(folder / name)[0]


def test_a_module_that_cannot_load_is_named_in_the_probes_verdict(folder, tmp_path):
    runs, why = cpu_variant.probe(tmp_path / "libggml-cpu-missing.so")
    assert not runs and "libggml-cpu-missing.so" in why
