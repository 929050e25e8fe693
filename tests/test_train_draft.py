"""`specdesk train-drafter --method draft`: a draft model of the target's own architecture, started
as a subset of its layers, distilled from the recorded top-k, exported for both engines, measured,
and chosen by "Use this model" only when it was adopted."""

import argparse
import json
import re
import shutil
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from specdesk.app.training import cli  # noqa: E402
from specdesk.app.training.draft import layer_ids  # noqa: E402
from specdesk.app.training.methods import DEPTH  # noqa: E402
from specdesk.engines.types import SpecDeskError  # noqa: E402

PROMPT = "with open(path) as f:\n"


def _run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return cli.run(parser.parse_args(argv))


def _argv(target: str, prompts: Path, out: Path) -> list[str]:
    return ["--target", target, "--method", "draft", "--prompts", str(prompts), "--out", str(out), "--device", "cpu",
            "--threads", "1", "--max-tokens", "16", "--compare-prompts", "2", "--compare-tokens", "16",
            "--batch-size", "4", "--minutes", "1"]


def _greedy(engine, specs) -> list:
    """The engine's greedy answers to PROMPT, one per speculative setting; the engine is closed after."""
    from specdesk.app.runtime.generation import run_once
    from specdesk.engines.types import GenerationRequest, SamplingParams

    try:
        tokens = tuple(engine.tokenize(PROMPT))
        return [run_once(engine, GenerationRequest(tokens, max_tokens=40, sampling=SamplingParams(temperature=0.0),
                                                   spec=spec)) for spec in specs]
    finally:
        engine.close()


def _greedy_torch(target: str, specs) -> list:
    from specdesk.engines.torch.engine import TorchEngine

    return _greedy(TorchEngine(target, device="cpu", dtype="float32"), specs)


def _greedy_llama(target: str, specs, draft_weights: str = "q8") -> list:
    from specdesk.engines.llama.engine import LlamaEngine

    return _greedy(LlamaEngine(target, n_ctx=256, n_threads=1, draft_weights=draft_weights), specs)


# --- pure pieces ---------------------------------------------------------------------------
def test_the_draft_starts_as_the_targets_first_layers_and_its_last():
    assert layer_ids(8) == (0, 7)  # a quarter of 8
    assert layer_ids(2) == (1,) and layer_ids(3) == (2,)
    assert layer_ids(32) == (0, 1, 2, 3, 4, 5, 6, 31)
    assert layer_ids(8, 6) == (0, 1, 2, 3, 4, 7)  # the demo recipe's draft
    with pytest.raises(SpecDeskError, match="--draft-layers 8 is out of range: the target has 8 layers, so use 1 to 7"):
        layer_ids(8, 8)
    with pytest.raises(SpecDeskError, match="--draft-layers 0 is out of range"):
        layer_ids(8, 0)
    with pytest.raises(SpecDeskError, match="the target has 1 layer"):
        layer_ids(1)


def test_a_draft_of_all_the_targets_layers_computes_the_target(demo_family):
    """The construction itself: started from every layer, the draft model is the target, whether
    the layers come from the Hugging Face folder or are dequantized from the GGUF (a llama file's
    Q/K rows put back in rotate-half order)."""
    from specdesk.app.training.draft import new_draft
    from specdesk.app.training.gguf_target import heads_network
    from specdesk.app.training.record import training_network
    from specdesk.engines.torch.engine import TorchEngine

    torch.set_num_threads(1)
    engine = TorchEngine(demo_family["target_hf"], device="cpu", dtype="float32")
    network = engine.target.network
    layers = tuple(range(network.config.num_hidden_layers))
    tokens = torch.as_tensor(engine.tokenize(PROMPT))[None]
    reference = training_network(engine)  # the engine's network, without its KV cache
    with torch.no_grad():
        expected = reference.logits(reference.hidden_states(tokens)[0])
        from_folder = new_draft(network, layers, Path(demo_family["target_hf"]))
        torch.testing.assert_close(from_folder.logits(from_folder.hidden_states(tokens)[0]), expected)
        gguf = Path(demo_family["target_gguf"])
        from_gguf = new_draft(heads_network(gguf, "cpu"), layers, gguf)
        got = from_gguf.logits(from_gguf.hidden_states(tokens)[0])
    assert (got.argmax(-1) == expected.argmax(-1)).all()
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-2 * float(expected.abs().max()))
    # trained: the layers and the final norm; the embeddings and head are the target's, frozen
    trained = {name for name, p in from_folder.named_parameters() if p.requires_grad}
    assert "model.norm.weight" in trained and not any(n.startswith(("model.embed_tokens", "lm_head")) for n in trained)
    engine.close()


# --- train-drafter end to end --------------------------------------------------------------
def test_a_draft_model_trained_for_one_step_runs_in_both_engines_and_is_not_adopted(demo_family, small_prompts,
                                                                                     tmp_path, capsys):
    started = time.perf_counter()
    out = tmp_path / "run"
    argv = _argv(demo_family["target_hf"], small_prompts, out) + ["--steps", "1", "--target-gguf",
                                                                   demo_family["target_gguf"]]
    assert _run_cli(argv) == 0
    seconds = time.perf_counter() - started
    assert seconds < 60, seconds
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["method"] == "draft" and provenance["training"]["steps"] == 1
    assert provenance["training"]["taps"] == []  # a draft model reads no hidden states
    assert provenance["drafter"] == str((out / "draft").resolve())
    assert provenance["gguf"] == str((out / "draft-F16.gguf").resolve())
    assert len(provenance["held_out_acceptance_per_position"]) == DEPTH
    assert provenance["measured"]["trained"]["identical_outputs"] is True
    assert provenance["adopted"] is False
    speedups = {"plain decoding": 1.0, **{name: m["speedup"] for name, m in provenance["measured"]["existing"].items()}}
    best = max(speedups, key=speedups.get)
    match = re.fullmatch(r"trained draft model: (\d+\.\d\d)x, below (.+) (\d+\.\d\d)x", provenance["reason"])
    assert match, provenance["reason"]
    assert match[2] == best and abs(float(match[3]) - speedups[best]) <= 0.006
    err = capsys.readouterr().err
    assert "training a draft model" in err and "kept, not adopted: trained draft model" in err

    # The folder: the target's architecture with one of its two layers, and its tokenizer.
    config = json.loads((out / "draft" / "config.json").read_text())
    target_config = json.loads((Path(demo_family["target_hf"]) / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["hidden_size"] == target_config["hidden_size"]
    assert config["architectures"] == target_config["architectures"]
    tokenizer = (Path(demo_family["target_hf"]) / "tokenizer.json").read_bytes()
    assert (out / "draft" / "tokenizer.json").read_bytes() == tokenizer

    from specdesk.engines.types import SpecConfig

    # The PyTorch engine loads the folder as a draft model; greedy output through it is the baseline's.
    plain, drafted = _greedy_torch(demo_family["target_hf"],
                                   [SpecConfig(), SpecConfig(method="draft", k=3, draft_path=str(out / "draft"))])
    assert plain.tokens == drafted.tokens and len(plain.tokens) == 40
    assert drafted.stats.drafted > 0
    # ... and the llama.cpp engine the GGUF, drafting what the PyTorch one does.
    native_plain, native = _greedy_llama(demo_family["target_gguf"],
                                         [SpecConfig(), SpecConfig(method="draft", k=3, draft_path=provenance["gguf"])])
    assert native_plain.tokens == native.tokens == plain.tokens
    assert native.stats.drafted > 0
    assert abs(native.stats.acceptance_rate - drafted.stats.acceptance_rate) <= 0.1
    print("draft model acceptance: torch", drafted.stats.acceptance_rate, "llama.cpp", native.stats.acceptance_rate,
          f"({seconds:.1f} s end to end)")


def test_a_draft_model_is_trained_from_a_gguf_target_alone(demo_family, small_prompts, tmp_path, capsys):
    """No Hugging Face folder: llama.cpp records, the draft starts as the GGUF's last layer
    dequantized, and the GGUF draft model beside the target runs in the llama.cpp engine."""
    from specdesk.app.models.library import is_hf_folder
    from specdesk.engines.types import SpecConfig

    target = tmp_path / "model.gguf"
    shutil.copyfile(demo_family["target_gguf"], target)
    argv = _argv(str(target), small_prompts, tmp_path / "unused")
    argv = argv[:argv.index("--out")] + argv[argv.index("--out") + 2:]
    assert _run_cli(argv + ["--steps", "20", "--eval-every", "20"]) == 0
    out = tmp_path / "model-draft-trained"
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["target"] == str(target.resolve())
    assert provenance["gguf"] == str((out / "draft-F16.gguf").resolve())
    assert provenance["measured"]["trained"]["identical_outputs"] is True  # measured on llama.cpp with the GGUF
    assert provenance["held_out_acceptance_per_position"][0] > 0.3, provenance["training"]["history"]
    assert provenance["adopted"] is False and "kept, not adopted: trained draft model" in capsys.readouterr().err
    assert not is_hf_folder(out / "draft")  # no tokenizer files to load it with: the GGUF's source only
    plain, drafted = _greedy_llama(str(target), [SpecConfig(), SpecConfig(method="draft", k=3,
                                                                           draft_path=provenance["gguf"])])
    assert drafted.tokens == plain.tokens and drafted.stats.accepted > 0


def test_a_layer_count_the_target_cannot_give_is_refused_before_recording(demo_family, small_prompts, tmp_path,
                                                                           capsys):
    out = tmp_path / "run"
    assert _run_cli(_argv(demo_family["target_hf"], small_prompts, out) + ["--draft-layers", "2"]) == 2
    assert "--draft-layers 2 is out of range: the target has 2 layers, so use 1 to 1" in capsys.readouterr().err
    assert not (out / "cache").exists()


# --- "Use this model" ----------------------------------------------------------------------
@pytest.fixture()
def _plenty_of_memory(monkeypatch):
    from specdesk.app.models import pairing

    monkeypatch.setattr(pairing, "available_memory", lambda: pairing.MemoryInfo(64 << 30, 64 << 30))


def _provenance(out: Path, folder: Path, gguf: Path, target: str, adopted: bool, reason: str) -> None:
    (out / "provenance.json").write_text(json.dumps({
        "method": "draft", "drafter": str(folder), "gguf": str(gguf), "trained_here": True, "target": target,
        "trained_at": "2026-12-02T07:00:00+00:00", "speedup": 1.62 if adopted else 0.47, "adopted": adopted,
        "reason": reason}))


def test_use_this_model_takes_a_trained_draft_model_only_when_it_was_adopted(demo_family, tmp_path,
                                                                            _plenty_of_memory):
    """Like a trained native drafter: adopted, it is chosen first with its measured speedup (for the
    Hugging Face target its folder, for the GGUF its GGUF); kept, it is named with its reason and
    never loaded by default, even where pairing would expect a draft model of its size to pay."""
    from specdesk.app.models.choose import choose_for
    from specdesk.app.models.library import read_model

    out = tmp_path / "target-hf-draft-trained"
    folder, gguf = out / "draft", out / "draft-F16.gguf"
    shutil.copytree(demo_family["draft_hf"], folder)  # a draft model of the family stands in for a trained one
    shutil.copyfile(demo_family["draft_gguf"], gguf)
    entries = [read_model(p) for p in (demo_family["target_hf"], demo_family["target_gguf"], str(folder), str(gguf))]

    _provenance(out, folder, gguf, demo_family["target_hf"], False, "trained draft model: 0.47x, below n-gram 1.24x")
    for target in (demo_family["target_hf"], demo_family["target_gguf"]):
        choice = choose_for(target, entries, records=[])
        assert choice.draft is None, (target, choice)
        assert ("the draft model trained here is kept, not used (trained draft model: 0.47x, below n-gram 1.24x)"
                in choice.why), choice.why

    _provenance(out, folder, gguf, demo_family["target_hf"], True, "trained draft model: 1.62x, above n-gram 1.24x")
    choice = choose_for(demo_family["target_hf"], entries, records=[])
    assert choice.draft == str(folder) and "draft model trained here (1.62x measured)" in choice.why
    choice = choose_for(demo_family["target_gguf"], entries, records=[])
    assert choice.draft == str(gguf) and "draft model trained here (1.62x measured)" in choice.why


def test_the_app_offers_draft_model_training():
    from specdesk.app.training.job import TrainingRequest

    request = TrainingRequest(target="some/model", method="draft")
    assert request.out_folder() == Path("some/model-draft-trained")
    assert request.argv()[request.argv().index("--method") + 1] == "draft"
    pytest.importorskip("PySide6")
    from specdesk.ui.train_dialog import method_choices

    assert "draft" in [method for _, method in method_choices()]


def test_the_librarys_row_of_a_trained_draft_model_gives_its_verdict(demo_family, tmp_path, qtbot):
    pytest.importorskip("PySide6")
    from specdesk.app.models.library import LibraryConfig, read_model
    from specdesk.ui.models_view import ModelsView

    out = tmp_path / "target-draft-trained"
    out.mkdir()
    gguf = out / "draft-F16.gguf"
    shutil.copyfile(demo_family["draft_gguf"], gguf)
    _provenance(out, out / "draft", gguf, demo_family["target_hf"], False,
                "trained draft model: 0.47x, below n-gram 1.24x")
    view = ModelsView(lambda: LibraryConfig(demo_root=tmp_path / "none", user_paths=[str(out)], include_apps=False),
                      scan_when_shown=False)
    qtbot.addWidget(view)
    try:
        view._show_library([read_model(str(gguf))])
        cells = [view.library.item(0, c).text() for c in range(view.library.columnCount())]
        assert "trained here 2026-12-02, kept, not adopted: trained draft model: 0.47x, below n-gram 1.24x" in cells
    finally:
        view.shutdown()


def test_a_qwen2_gguf_becomes_a_qwen2_draft_model_that_llama_cpp_runs(tmp_path):
    """The zoo's qwen2 target (q/k/v biases, grouped keys and values, a 150k vocabulary): a draft
    model of all its layers, dequantized from the file and written back by export_gguf as qwen2
    with the file's vocabulary, drafts in llama.cpp exactly what the target says."""
    from benchmarks import zoo
    from specdesk.app.training.draft import export_draft, export_gguf_draft, new_draft
    from specdesk.app.training.gguf_target import heads_network, model_config
    from specdesk.engines.types import SpecConfig

    target = Path(zoo.build("qwen2", "F16", small=True)["target_gguf"])
    config = model_config(target)
    assert config.num_key_value_heads < config.num_attention_heads and config.attention_bias
    model = new_draft(heads_network(target, "cpu"), tuple(range(config.num_hidden_layers)), target)
    folder = export_draft(model, target, (), tmp_path / "draft")
    gguf = export_gguf_draft(folder, target, tmp_path / "draft-F16.gguf")
    # the draft as exported (F16), not the Q8_0 copy the engine would otherwise run it from: the
    # copy's rounding flips this small zoo model's near-tied picks (0.82 of drafts accepted)
    plain, drafted = _greedy_llama(str(target), [SpecConfig(), SpecConfig(method="draft", k=3, draft_path=str(gguf))],
                                   draft_weights="file")
    assert drafted.tokens == plain.tokens
    assert drafted.stats.acceptance_rate > 0.9, drafted.stats
