"""This machine's measurements: recorded by compare runs, read back by pairing, which ranks
drafts by them and labels the rest as assumptions."""

from __future__ import annotations

import json
import shutil

from specdesk.app import measurements
from specdesk.app.library import read_model
from specdesk.app.pairing import MemoryInfo, pair

PLENTY = MemoryInfo(ram_available=64 << 30, ram_total=64 << 30)


def test_records_round_trip_and_damaged_lines_are_skipped(tmp_path):
    path = tmp_path / "m.jsonl"
    measurements.record("t.gguf", "d.gguf", "llama.cpp", "draft", 3, 1.2, 0.7, 96, 0.0, path)
    measurements.record("t.gguf", "d.gguf", "llama.cpp", "draft", 3, 1.4, 0.8, 96, 0.0, path)
    measurements.record("t.gguf", "d.gguf", "llama.cpp", "draft", 5, 1.25, 0.6, 96, 0.0, path)
    measurements.record("t.gguf", "d.gguf", "llama.cpp", "ngram", 6, 3.0, 0.9, 96, 0.0, path)
    with path.open("a") as f:
        f.write('{"broken\n[1, 2]\n')
    records = measurements.read(path)
    assert len(records) == 4
    best = measurements.measured_for("t.gguf", "d.gguf", "draft", records)
    assert (best.k, best.runs) == (3, 2) and abs(best.speedup - 1.3) < 1e-9 and abs(best.acceptance - 0.75) < 1e-9
    assert measurements.measured_for("t.gguf", "other.gguf", "draft", records) is None
    assert measurements.read(tmp_path / "missing.jsonl") == []


def test_pairing_ranks_by_measured_numbers_and_labels_assumptions(demo_family, tmp_path):
    target, draft = demo_family["target_gguf"], demo_family["draft_gguf"]
    other = shutil.copy(draft, tmp_path / "other-draft.gguf")
    entries = [read_model(p, "user") for p in (target, draft, other)]

    assumed = pair(target, entries, memory=PLENTY, records=[])
    assert all(v.basis == "assumed" and v.reasons[0].startswith("assumed, not measured") for v in assumed.compatible)

    path = tmp_path / "m.jsonl"
    measurements.record(target, draft, "llama.cpp", "draft", 4, 0.9, 0.6, 96, 0.0, path)
    measurements.record(target, str(other), "llama.cpp", "draft", 3, 1.21, 0.69, 96, 0.0, path)
    report = pair(target, entries, memory=PLENTY, records=measurements.read(path))
    ranked = [(v.path, v.score, v.k, v.basis) for v in report.compatible]
    assert ranked[:2] == [(str(other), 1.21, 3, "measured"), (draft, 0.9, 4, "measured")]
    assert report.compatible[0].reasons[0].startswith("measured on this machine: 1.21x at k = 3, acceptance 69%")
    assert json.loads(json.dumps(report.to_json()))["compatible"][0]["basis"] == "measured"


def test_a_compare_from_the_command_line_is_recorded(demo_family, tmp_path, capsys):
    from specdesk.app.main import main

    code = main(["compare", "--target", demo_family["target_gguf"], "--draft", demo_family["draft_gguf"],
                 "--method", "draft", "--k", "2", "--max-tokens", "8", "--threads", "1",
                 "--prompt", "def main():", "--json", "-"])
    assert code == 0
    [line] = measurements.read()
    assert line["method"] == "draft" and line["k"] == 2 and line["speedup"] > 0
    assert measurements.measured_for(demo_family["target_gguf"], demo_family["draft_gguf"]).runs == 1
