"""The `specdesk` command: JSON report, chat, demo build, and bad input handled cleanly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from specdesk.app.main import main

from llama_helpers import rewrite_gguf

REPORT_KEYS = {"engine", "target", "draft", "method", "k", "temperature", "prompts", "baseline", "speculative",
               "speedup", "speedup_spread", "speedup_range", "speedup_of_medians", "speedup_beyond_noise", "runs",
               "busy", "too_short", "identical_outputs", "divergences", "placement", "device", "chat_template"}


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_compare_writes_one_json_object(capsys, demo_family, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def main():\\n"}\n\n{"prompt": "class A:\\n    def"}\n')
    code, out, _ = run_cli(capsys, "compare", "--target", demo_family["target_gguf"], "--draft",
                           demo_family["draft_gguf"], "--method", "draft", "--k", "3", "--max-tokens", "24",
                           "--threads", "1", "--prompts", str(prompts), "--json", "-")
    assert code == 0
    report = json.loads(out)
    assert set(report) == REPORT_KEYS
    assert report["engine"] == "llama.cpp" and report["method"] == "draft" and report["prompts"] == 2
    assert report["baseline"]["tokens"] == report["speculative"]["tokens"] == 48
    assert set(report["speculative"]) == {"tokens", "seconds", "tok_per_s", "tok_per_s_spread", "drafted", "accepted",
                                          "acceptance_rate", "mean_accepted_length", "per_position_acceptance"}
    assert 3 <= report["runs"] <= 7 and report["speedup_spread"] >= 0  # the median of runs repeated until steady
    assert len(report["speculative"]["per_position_acceptance"]) == 3
    assert report["identical_outputs"] is True and report["divergences"] == []
    assert report["speedup"] > 0


def test_compare_table_and_json_file_with_sampling(capsys, demo_family, tmp_path):
    out_path = tmp_path / "report.json"
    code, out, _ = run_cli(capsys, "compare", "--target", demo_family["target_gguf"], "--method", "ngram",
                           "--temperature", "0.7", "--top-p", "0.9", "--max-tokens", "16", "--threads", "1",
                           "--prompt", "import os\n", "--json", str(out_path))
    assert code == 0
    assert "speedup" in out and "baseline" in out
    report = json.loads(out_path.read_text())
    assert report["identical_outputs"] is None and report["temperature"] == 0.7


def test_chat_streams_and_reports(demo_family):
    env = dict(os.environ, SPECDESK_LLAMA_LOG="")
    result = subprocess.run(
        [sys.executable, "-m", "specdesk.app.main", "chat", "--target", demo_family["target_gguf"], "--draft",
         demo_family["draft_gguf"], "--max-tokens", "12", "--threads", "1"],
        input="write a parser\n/new\nsort a list\n\n", capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("model> ") == 2
    assert result.stderr.count("tok/s") == 2 and "acceptance" in result.stderr


def test_terminal_chat_defaults_to_auto_keeps_clean_turns_and_saves_markdown(demo_family, tmp_path):
    """A target of one's own and no draft: method auto (as in the app), not an error asking for a
    draft; a system prompt, /save and /reset; each prompt and reply on lines of their own."""
    first, second = tmp_path / "first.md", tmp_path / "second.md"
    env = dict(os.environ, SPECDESK_LLAMA_LOG="")
    result = subprocess.run(
        [sys.executable, "-m", "specdesk.app.main", "chat", "--target", demo_family["target_gguf"],
         "--max-tokens", "6", "--threads", "1", "--system", "You write Python."],
        input=f"def f(x):\n/save {first}\n/reset\nclass A:\n/save {second}\n/save {tmp_path}\n\n",
        capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    assert "method auto" in result.stderr and result.stderr.count("tok/s") == 2
    out = result.stdout
    assert out.count("you> \n") == 7 and out.count("you> \nmodel> ") == 2  # a prompt never shares a line
    assert all(turn.endswith("\n") for turn in out.split("you> ")[1:-1])  # each reply ends its line
    assert f"cannot write {tmp_path}" in result.stderr  # a folder is not a file: one line, the chat goes on
    saved = first.read_text(encoding="utf-8")
    assert saved.startswith("# SpecDesk chat\n") and "## System\n\nYou write Python.\n" in saved
    assert "## You\n\ndef f(x):\n" in saved and "## Model\n" in saved
    after_reset = second.read_text(encoding="utf-8")
    assert "You write Python." in after_reset and "class A:" in after_reset and "def f(x):" not in after_reset


def test_demo_build_prints_one_json_object(demo_family, demo_cache_dir):
    env = dict(os.environ, SPECDESK_CACHE_DIR=str(demo_cache_dir))
    result = subprocess.run([sys.executable, "-m", "specdesk.app.main", "demo", "build", "--small"],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    roles = json.loads(result.stdout)
    assert {"target_gguf", "draft_gguf", "target_hf", "draft_hf"} <= set(roles)
    assert roles["target_gguf"] == demo_family["target_gguf"]
    # llama.cpp's native drafters come with it, the untrained EAGLE-3 head labelled as seeded
    assert {"mtp_gguf", "dflash_gguf", "eagle3_gguf_seeded"} <= set(roles) and "eagle3_gguf" not in roles
    assert all(Path(roles[r]).is_file() for r in ("mtp_gguf", "dflash_gguf", "eagle3_gguf_seeded"))


def _bad_inputs(demo_family, tmp_path):
    target = demo_family["target_gguf"]
    truncated = tmp_path / "truncated.gguf"
    data = Path(target).read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("these are not weights\n")
    bad_draft = rewrite_gguf(demo_family["draft_gguf"], tmp_path / "other-eos.gguf", eos_id=7)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "ok"}\n{"prompt": "unterminated\n')
    base = ["compare", "--threads", "1", "--max-tokens", "8"]
    return {
        "missing file": (base + ["--target", str(tmp_path / "nope.gguf"), "--method", "ngram"], "no such file"),
        "truncated GGUF": (base + ["--target", str(truncated), "--method", "ngram"], "truncated GGUF file"),
        "not GGUF": (base + ["--target", str(not_gguf), "--method", "ngram"], "not a GGUF file"),
        "incompatible draft": (base + ["--target", target, "--draft", str(bad_draft)], "EOS id 1 vs 7"),
        "prompt too long": (base + ["--target", target, "--method", "ngram", "--ctx", "32",
                                    "--prompt", "def f(x):\n    return x\n" * 20], "context holds 32"),
        "k too small": (base + ["--target", target, "--method", "ngram", "--k", "0"], "k = 0 is out of range"),
        "k too large": (base + ["--target", target, "--method", "ngram", "--k", "99"], "k = 99 is out of range"),
        "broken prompts file": (base + ["--target", target, "--method", "ngram", "--prompts", str(broken)],
                                "broken.jsonl, line 2: not valid JSON"),
        "bad temperature": (base + ["--target", target, "--method", "ngram", "--temperature", "-1"],
                            "temperature -1.0 is out of range"),
    }


def test_bad_input_gives_one_line_error(capsys, demo_family, tmp_path):
    for name, (argv, expected) in _bad_inputs(demo_family, tmp_path).items():
        code, out, err = run_cli(capsys, *argv)
        lines = err.strip().splitlines()
        assert code == 2, name
        assert len(lines) == 1 and lines[0].startswith("specdesk: error: "), f"{name}: {err!r}"
        assert expected in lines[0], f"{name}: {lines[0]}"
        assert "Traceback" not in err


def test_bad_input_exit_status_from_a_real_process(demo_family, tmp_path):
    result = subprocess.run([sys.executable, "-m", "specdesk.app.main", "compare", "--target",
                             str(tmp_path / "missing.gguf"), "--method", "ngram"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"specdesk: error: {tmp_path / 'missing.gguf'}: no such file (check the path, or choose another model)"]
