"""Pairing a draft with a vocabulary of its own (app/models/crossvocab_pair.py): its overlap,
retokenizing cost, acceptance and expected speedup, as `specdesk models pair` prints them,
measured on the demo family's target and SmolLM2-135M-Instruct."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import zoo
from specdesk.app.models.crossvocab_pair import predict_files, refused_for_vocabulary, vocab_overlap
from specdesk.engines.llama.binding import GgufModel

from llama_helpers import rewrite_gguf


def test_only_vocabulary_refusals_make_a_cross_vocabulary_draft():
    assert refused_for_vocabulary(["vocab type spm vs bpe (target vs draft)", "vocab size 262144 vs 49152",
                                   "BOS id 2 (added: True) vs 1 (added: False)", "EOS id 1 vs 2",
                                   "token 100: 'a' vs 'b'"])
    assert refused_for_vocabulary(["EOS id 1 vs 7 (target vs draft)"])  # one difference is enough
    assert not refused_for_vocabulary([])
    assert not refused_for_vocabulary(["vocab size 1024 vs 2048", "an HF checkpoint: the llama.cpp engine runs GGUF drafts"])


def test_overlap_is_the_share_of_the_targets_tokens_the_draft_has():
    qwen = GgufModel(zoo.build("qwen2", "F16", small=True)["draft_gguf"])
    phi = GgufModel(zoo.build("phi-3", "F16", small=True)["draft_gguf"])
    texts = ["def read_lines(path):\n    with open(path) as f:\n", "The capital of France is Paris."]
    try:
        assert vocab_overlap(qwen, qwen, texts) == 1.0
        across = vocab_overlap(qwen, phi, texts)
        assert 0.2 < across < 1.0  # the code's indentation runs, as one qwen2 token each, are not phi-3 tokens
    finally:
        qwen.close(), phi.close()


def test_a_prediction_says_whether_it_pays(demo_family, smollm2):
    found = predict_files(demo_family["target_gguf"], smollm2, prompts=["def read_lines(path):\n"], max_tokens=12,
                          n_threads=1)
    assert 0 < found.overlap <= 1 and found.shared_tokens > 100
    assert 0 <= found.acceptance <= 1 and found.retokenize_ms_per_token > 0 and found.draft_step_ms > 0
    assert found.pays == (found.expected_speedup > 1)
    assert found.verdict.startswith("will not pay here") != found.pays
    assert json.loads(json.dumps(found.to_json()))["draft"] == smollm2


def test_models_pair_prints_a_cross_vocabulary_draft_as_json(demo_family, smollm2, monkeypatch, tmp_path, capsys):
    """SmolLM2 in the library is listed as a cross-vocabulary draft; the draft --draft names (the
    demo draft with renamed tokens: a vocabulary of its own, quick to measure) is measured."""
    from specdesk.app.main import main

    monkeypatch.setenv("SPECDESK_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("SPECDESK_CACHE_DIR", str(tmp_path / "cache"))  # not this machine's demo family
    renamed = str(rewrite_gguf(demo_family["draft_gguf"], tmp_path / "renamed.gguf",
                               edit_tokens=lambda tokens: [t + "\u00a7" if i % 3 == 2 and i > 16 else t
                                                           for i, t in enumerate(tokens)]))
    args = ["models", "pair", "--target", demo_family["target_gguf"], "--path", demo_family["draft_gguf"],
            "--path", smollm2, "--no-apps", "--no-hf-cache", "--ctx", "128", "--draft", renamed]
    assert main(args + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    crossed = {Path(d["path"]).resolve(): d for d in report["cross_vocab"]}
    assert Path(smollm2).resolve() in crossed and "prediction" not in crossed[Path(smollm2).resolve()]
    prediction = crossed[Path(renamed).resolve()]["prediction"]
    assert prediction["acceptance"] > 0 and 0.5 < prediction["overlap"] < 1
    assert {"overlap", "acceptance", "expected_speedup", "retokenize_ms_per_token", "pays", "verdict"} <= set(prediction)
    assert report["compatible"][0]["path"] == demo_family["draft_gguf"]  # the same-vocabulary draft is still ranked
    assert main(args) == 0
    assert "cross-vocabulary draft" in capsys.readouterr().out

