"""benchmarks/auto.py end to end on the demo pair, briefly: every configuration's line and the
summary the auto issue's bars are read from."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SPEC = importlib.util.spec_from_file_location("auto_benchmark",
                                              Path(__file__).resolve().parent.parent / "benchmarks" / "auto.py")
auto_benchmark = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(auto_benchmark)


def test_auto_is_measured_against_every_fixed_setting_interleaved(demo_family, capsys):
    from specdesk.engines.llama.engine import LlamaEngine
    from specdesk.engines.speculation import costs

    prompts = ["def add(a, b):\n    return a + b\n\ndef sub(a, b):\n", "The river runs past the mill and"]
    engine = LlamaEngine(demo_family["target_gguf"], n_ctx=256, n_threads=1)
    saved = dict(costs._models)
    try:
        configs = auto_benchmark.configurations("llama", demo_family["draft_gguf"], [2])
        auto_benchmark.bench("llama", engine, configs, prompts, max_tokens=12)
    finally:
        engine.close()
        costs._models.clear()
        costs._models.update(saved)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    by_config = {line["config"]: line for line in lines if "config" in line}
    assert set(by_config) == {"none", "ngram k=2", "ngram-pool k=2", "draft k=2", "auto"}
    assert all(line["tokens"] == 24 and line["tok_per_s"] > 0 for line in by_config.values())
    assert by_config["none"]["speedup"] == 1.0 and by_config["none"]["identical"] is True
    for line in by_config.values():  # a difference from no speculation is classified, never a bug
        assert line["identical"] or set(line["divergences"]) <= {"near_tie"}, line
    auto = by_config["auto"]
    assert abs(sum(auto["steps_by_method"].values()) - 1.0) < 0.01
    assert abs(sum(auto["steps_by_choice"].values()) - 1.0) < 0.01 and auto["costs_at_end"]["probes"] >= 1
    (summary,) = [line for line in lines if line.get("summary")]
    assert summary["best_fixed"] in by_config and summary["best_fixed"] not in ("none", "auto")
    assert {"auto_over_best_fixed", "auto_over_none", "auto_over_best_fixed_from_second_reply",
            "auto_over_best_fixed_chosen_apart"} <= set(summary)
