"""`specdesk compare --engine torch`: the same JSON report, every torch method, clear errors."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from specdesk.app.main import main  # noqa: E402


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("method", ["draft", "mtp", "dflash"])
def test_compare_reports_the_torch_engine(capsys, demo_family, demo_cache_dir, monkeypatch, method):
    monkeypatch.setenv("SPECDESK_CACHE_DIR", str(demo_cache_dir))
    code, out, err = run_cli(capsys, "compare", "--engine", "torch", "--device", "cpu", "--small-demo",
                             "--method", method, "--k", "3", "--max-tokens", "20", "--threads", "1",
                             "--prompt", "def main():\n", "--json", "-")
    assert code == 0, err
    report = json.loads(out)
    assert report["engine"] == "torch" and report["method"] == method and report["k"] == 3
    assert report["target"] == demo_family["target_hf"]
    assert report["draft"] == {"draft": demo_family["draft_hf"], "dflash": demo_family["dflash_hf"]}.get(method)
    assert report["baseline"]["tokens"] == report["speculative"]["tokens"] == 20
    assert report["speculative"]["drafted"] > 0
    assert report["identical_outputs"] is True


def test_torch_engine_errors_are_one_line(capsys, demo_family, tmp_path):
    code, _, err = run_cli(capsys, "compare", "--engine", "torch", "--target", str(tmp_path), "--method", "ngram")
    assert code == 2 and "config.json is missing: a Hugging Face model folder needs it" in err
    code, _, err = run_cli(capsys, "compare", "--engine", "torch", "--target", demo_family["draft_hf"],
                           "--method", "mtp", "--device", "cpu", "--prompt", "x = 1\n", "--max-tokens", "4")
    assert code == 2 and "has no MTP layers" in err
    code, _, err = run_cli(capsys, "compare", "--engine", "torch", "--target", demo_family["target_hf"],
                           "--method", "dflash", "--device", "cpu")
    assert code == 2 and "needs a DFlash drafter folder: pass --draft DIR" in err
    if not torch.cuda.is_available():
        code, _, err = run_cli(capsys, "compare", "--engine", "torch", "--target", demo_family["target_hf"],
                               "--method", "ngram", "--device", "cuda")
        assert code == 2 and "device cuda was requested but torch sees no CUDA or ROCm GPU" in err
