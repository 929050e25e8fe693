"""Why speculation pays here or not, per model file and weight type, from the pass costs this
machine recorded (app/models/economics.py), as pairing, compare and auto say it."""

from __future__ import annotations

from specdesk.app.runtime import measurements
from specdesk.app.models.economics import file_stem, pass_economics
from specdesk.app.models.library import ModelEntry


def entry(path: str, quant: str) -> ModelEntry:
    return ModelEntry(path=path, name=path, format="gguf", source="user", quantization=quant)


def test_the_same_model_in_another_weight_type_has_the_same_stem():
    assert file_stem("/m/SmolLM2-135M-Instruct.Q4_1.gguf") == file_stem("/x/SmolLM2-135M-Instruct-F16.gguf")
    assert file_stem("/m/SmolLM2-135M-Instruct.Q4_1.gguf") != file_stem("/m/Qwen3-0.6B-Q4_1.gguf")


def test_recorded_pass_costs_say_per_weight_type_whether_a_draft_can_pay(tmp_path):
    q4, f16 = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf", tmp_path / "SmolLM2-135M-Instruct.F16.gguf"
    log = tmp_path / "measurements.jsonl"
    measurements.record_pass_costs(str(q4), "llama.cpp", {"pass_ms": [5.4, 11.4, 14.6, 16.2, 21.5]}, log)
    measurements.record_pass_costs(str(f16), "llama.cpp", {"pass_ms": [7.0, 13.5, 14.1, 15.0, 15.7]}, log)
    measurements.record_pass_costs(str(f16), "llama.cpp", {"pass_ms": [0.0]}, log)  # not a measurement: skipped
    records = measurements.read(log, pass_costs=True)
    assert len(records) == 2 and measurements.read(log) == []  # speedups and chat replies are read apart
    entries = [entry(str(q4), "Q4_1"), entry(str(f16), "F16")]
    text = pass_economics(entries[0], entries, records)
    assert text == ("a pass over 2 tokens costs 2.1x one here with Q4_1 weights, over 3 tokens 2.7x, "
                    "over 5 tokens 4.0x, so no draft can pay; the F16 file of this model costs 1.9x")
    assert "no draft can pay" not in pass_economics(entries[1], entries, records)
    assert pass_economics(entry(str(tmp_path / "other.gguf"), "Q8_0"), entries, records) is None
