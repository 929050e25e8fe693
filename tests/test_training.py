"""The drafter trainer (app/training/): prompts, the EAGLE-3 head against the engine that serves
it, the adoption rule, and `train-drafter` end to end on the small demo family."""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from specdesk.app.training import cli  # noqa: E402
from specdesk.app.training.adopt import Measured, decide  # noqa: E402
from specdesk.app.training.methods import DEPTH  # noqa: E402
from specdesk.app.training.prompts import (KINDS, Prompt, default_prompts_path, load_prompt_set,  # noqa: E402
                                           split_prompts)
from specdesk.engines import methods as methods_table  # noqa: E402
from specdesk.engines.types import SpecDeskError  # noqa: E402


def _run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return cli.run(parser.parse_args(argv))


def test_the_subcommand_registers_with_its_defaults():
    parser = argparse.ArgumentParser(prog="specdesk")
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["train-drafter", "--target", "some/model"])
    assert args.func is cli.run and args.method == "eagle3" and args.minutes == 20 and args.device == "auto"
    assert not args.resume and args.prompts is None
    with pytest.raises(SystemExit):
        parser.parse_args(["train-drafter", "--target", "m", "--method", "medusa"])


# --- prompts -----------------------------------------------------------------------------
def test_from_history_adds_the_users_own_messages_once_and_says_how_many(tmp_path, small_prompts):
    from specdesk.app.storage.history import History
    from specdesk.app.training.prompts import training_prompts

    missing = tmp_path / "none" / "history.sqlite3"
    with pytest.raises(SpecDeskError, match="no saved chats at .*history.sqlite3"):
        training_prompts(small_prompts, True, print, missing)
    assert not missing.exists()  # never created by asking

    path = tmp_path / "history.sqlite3"
    history = History(path)
    first = history.create_chat("one")
    asked = history.add_message(first, "user", "Write a function that reverses a list.")
    history.add_message(first, "assistant", "def reverse(items):\n    return items[::-1]\n")
    history.add_alternative(asked, "Write a function that reverses a string.")  # an edit: both count
    second = history.create_chat("two")
    history.add_message(second, "user", "Write a function that reverses a list.")  # asked again: once
    history.add_message(second, "user", "   ")
    history.close()

    said = []
    prompts = training_prompts(small_prompts, True, said.append, path)
    mine = prompts[len(load_prompt_set(small_prompts)):]
    assert [p.text for p in mine] == ["Write a function that reverses a list.", "Write a function that reverses a string."]
    assert all(p.kind == "chat" for p in mine)
    assert said == [f"adding 2 messages of yours from the saved chats in {path} (read here; nothing leaves this machine)"]
    assert training_prompts(small_prompts, False, said.append, path) == load_prompt_set(small_prompts)
    assert "--from-history" in _help()


def _help() -> str:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.format_help()


def test_the_bundled_prompt_set_is_large_and_covers_every_kind():
    prompts = load_prompt_set(default_prompts_path())
    assert len(prompts) >= 1000
    assert {p.kind for p in prompts} == set(KINDS)
    assert len({p.text for p in prompts}) == len(prompts)
    train, held = split_prompts(prompts)
    assert held and len(held) < len(prompts) // 10
    assert not {p.text for p in train} & {p.text for p in held}
    assert split_prompts(list(reversed(prompts)))[1] == list(reversed(held))  # by content, not by order


def test_a_broken_prompt_line_is_named(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "fine"}\n{"prompt": 3}\n')
    with pytest.raises(SpecDeskError, match=r"line 2: expected an object"):
        load_prompt_set(path)
    path.write_text('{"prompt": "fine"}\nnot json\n')
    with pytest.raises(SpecDeskError, match="line 2: not valid JSON"):
        load_prompt_set(path)


def test_a_tiny_prompt_set_still_holds_some_out():
    prompts = [Prompt(f"p{i}") for i in range(5)]
    train, held = split_prompts(prompts)
    assert len(held) >= 2 and len(train) + len(held) == 5
    with pytest.raises(SpecDeskError, match="none to train on"):
        split_prompts(prompts[:2])


# --- the cache size and the progress line ------------------------------------------------
def test_the_cache_size_said_before_recording_is_what_a_token_costs_within_the_limit():
    from specdesk.app.training.record import RecordSettings, estimate_bytes

    settings = RecordSettings(taps=(1, 2, 3), top_k=32, max_new_tokens=96, limit_bytes=10**6)
    assert settings.bytes_per_token(64) == 2 * 64 * 3 + 6 * 32 + 4  # fp16 taps, int32 ids + fp16 log-probs, a token
    assert estimate_bytes(10, 64, settings, 64) == 10 * (64 + 96) * 580
    assert estimate_bytes(1000, 64, settings, 64) == 10**6


def test_the_progress_line_says_steps_loss_acceptance_and_time_left():
    from specdesk.app.training.loop import LoopState, format_left, progress_line

    state = LoopState(step=120, elapsed=61.0)
    line = progress_line(state, 1.23456, {"acceptance": [0.8, 0.5, 0.25]}, budget_s=300.0)
    assert line == "step 120 · loss 1.2346 · held-out acceptance 0.80/0.50/0.25 (mean accepted 1.55) · 3:59 left"
    assert format_left(-5) == "0:00" and format_left(3600) == "60:00"


# --- adoption ----------------------------------------------------------------------------
def test_adoption_needs_to_beat_the_best_existing_method_and_plain_decoding():
    trained = Measured("trained EAGLE-3", 1.08, True, 0.5)
    adopted, reason = decide(trained, [Measured("draft model", 1.31, True, 0.7), Measured("n-gram", 1.1, True, 0.3)])
    assert not adopted and reason == "trained EAGLE-3: 1.08x, below draft model 1.31x"
    adopted, reason = decide(trained, [Measured("n-gram", 1.02, True, 0.3)])
    assert adopted and reason == "trained EAGLE-3: 1.08x, above n-gram 1.02x"
    adopted, reason = decide(trained, [Measured("n-gram", 0.9, True, 0.3)])
    assert adopted and reason == "trained EAGLE-3: 1.08x, above plain decoding 1.00x"
    adopted, reason = decide(Measured("trained EAGLE-3", 0.95, True, 0.5), [Measured("n-gram", 0.9, True, 0.3)])
    assert not adopted and reason == "trained EAGLE-3: 0.95x, below plain decoding 1.00x"
    adopted, reason = decide(Measured("trained EAGLE-3", 2.0, False, 0.5), [])
    assert not adopted and "differs from the baseline" in reason
    adopted, reason = decide(Measured("trained EAGLE-3", 1.04, True, 0.5, spread=0.06, beyond_noise=False),
                             [Measured("n-gram", 0.9, True, 0.3)])
    assert not adopted and reason == "trained EAGLE-3: 1.04x, within the noise of plain decoding (± 0.06)"


# --- the head against the engine ---------------------------------------------------------
def test_the_trained_head_computes_in_the_engine_what_training_unrolled(demo_family, tmp_path, small_prompts):
    """Every unrolled step of training is what the engine's EAGLE-3 drafter computes for the
    same rows: the first step over all committed rows, then chained steps on its own output."""
    from specdesk.app.training import eagle3
    from specdesk.app.training.record import RecordSettings, record
    from specdesk.engines.torch.eagle3 import Eagle3Drafter
    from specdesk.engines.torch.engine import TorchEngine

    torch.set_num_threads(1)
    engine = TorchEngine(demo_family["target_hf"], device="cpu", dtype="float32")
    network = engine.target.network
    taps = eagle3.default_taps(network.config.num_hidden_layers)
    files = record(engine, load_prompt_set(small_prompts)[:1], RecordSettings(taps=taps, max_new_tokens=16),
                   tmp_path / "cache", "train")
    from specdesk.app.training.record import load_sequence

    sequence = load_sequence(files[0])
    head = eagle3.new_head(network, seed=3)
    with torch.no_grad():  # away from the initial pass-through, so every module matters
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.02)
    folder = eagle3.export_head(head.half().float(), network.config, taps, tmp_path / "eagle3")
    drafter = Eagle3Drafter.from_folder(folder, engine.target, engine.n_ctx)
    assert drafter.taps == taps
    batch = eagle3.make_batch([sequence], 1024)
    with torch.no_grad():
        unrolled = eagle3.unroll(drafter.layer, eagle3.head_config(network.config), network.model.embed_tokens,
                                 batch, 3)
    tokens = sequence.tokens.tolist()
    p = len(tokens) - 5  # the last committed row of a pass, then two chained steps
    features = torch.from_numpy(sequence.features[:p + 1].astype("float32"))
    with torch.no_grad():
        out, logits = drafter.step(drafter.layer.fc(features), tokens[1:p + 2], 0)
        torch.testing.assert_close(logits, unrolled[0][0, p], rtol=1e-4, atol=1e-4)
        previous = drafter.layer.feedback(out[-1:])
        for step in (1, 2):
            out, logits = drafter.step(previous, [tokens[p + 1 + step]], p + step)
            torch.testing.assert_close(logits, unrolled[step][0, p], rtol=1e-4, atol=1e-4)
            previous = drafter.layer.feedback(out)


def test_the_trained_dflash_drafter_computes_in_the_engine_what_training_did(demo_family, tmp_path, small_prompts):
    import numpy as np

    from specdesk.app.training import dflash, eagle3
    from specdesk.app.training.record import RecordSettings, load_sequence, record
    from specdesk.engines.torch.dflash import DFlashDrafter
    from specdesk.engines.torch.engine import TorchEngine

    torch.set_num_threads(1)
    engine = TorchEngine(demo_family["target_hf"], device="cpu", dtype="float32")
    network = engine.target.network
    spec = dflash.spec_for(network.config)
    files = record(engine, load_prompt_set(small_prompts)[:1],
                   RecordSettings(taps=dflash.taps(spec), max_new_tokens=16), tmp_path / "cache", "train")
    sequence = load_sequence(files[0])
    drafter = dflash.new_drafter(network, spec)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)) * 0.02)
    folder = dflash.export_drafter(drafter.half().float(), spec, network.config, tmp_path / "dflash")
    served = DFlashDrafter.from_folder(folder, engine.target, engine.n_ctx)
    batch = eagle3.make_batch([sequence], 1024)
    anchor = len(sequence.tokens) - spec.block_size - 2
    with torch.no_grad():
        trained = network.logits(dflash._block_rows(served.network, network, spec, batch, np.array([anchor]))[0, 0])
        features = torch.from_numpy(sequence.features[:anchor].astype("float32"))
        engine_logits = served.draft_logits(features, 0, int(sequence.tokens[anchor]))
    torch.testing.assert_close(engine_logits, trained, rtol=1e-4, atol=1e-4)


def _dspark_drafter(network, seed: int):
    """A DSpark drafter as training makes it, moved off its start so that its Markov head's bias
    is as large as the logits (an untrained head adds nothing, and could not be told apart)."""
    from specdesk.app.training import dflash, dspark

    spec = dflash.spec_for(network.config)
    drafter = dspark.new_drafter(network, spec)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.02)
        head = drafter.markov_head
        head.markov_w1.weight.normal_(0.0, 1.0, generator=generator)
        head.markov_w2.weight.normal_(0.0, 1.0 / head.markov_w1.weight.shape[1] ** 0.5, generator=generator)
    return spec, drafter.half().float()  # the float16 the folder keeps


def test_the_trained_dspark_drafter_drafts_in_the_engine_what_training_computed(demo_family, tmp_path, small_prompts):
    """Every block row drafts (anchor first); the engine's Markov chain reads, row by row, the
    logits training computes with the same tokens before each row."""
    import numpy as np

    from specdesk.app.training import dflash, dspark, eagle3
    from specdesk.app.training.record import RecordSettings, load_sequence, record
    from specdesk.engines.torch.dflash import DFlashDrafter
    from specdesk.engines.torch.engine import TorchEngine

    torch.set_num_threads(1)
    engine = TorchEngine(demo_family["target_hf"], device="cpu", dtype="float32")
    network = engine.target.network
    spec, drafter = _dspark_drafter(network, seed=3)
    files = record(engine, load_prompt_set(small_prompts)[:1],
                   RecordSettings(taps=tuple(i + 1 for i in spec.target_layer_ids), max_new_tokens=16),
                   tmp_path / "cache", "train")
    sequence = load_sequence(files[0])
    folder = dspark.export_drafter(drafter, spec, network.config, tmp_path / "dspark")
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["Qwen3DSparkModel"]
    served = DFlashDrafter.from_folder(folder, engine.target, engine.n_ctx)
    assert served.config.first_draft_row == 0 and served.config.markov_rank > 0
    batch = eagle3.make_batch([sequence], 1024)
    anchors = np.array([len(sequence.tokens) - spec.block_size - 2])
    with torch.no_grad():
        features = torch.from_numpy(sequence.features[:anchors[0]].astype("float32"))
        last = int(sequence.tokens[anchors[0]])
        base = served.draft_logits(features, 0, last)  # (B, V)
        tokens, biased = served.draft(base, last)
        trained_tokens = dspark.chain_drafts(served.network, network, spec, batch, anchors, spec.block_size)[0]
        trained_base = network.logits(dflash._block_rows(served.network, network, spec, batch, anchors, first_row=0))
        forced = dspark.block_logits(served.network, network, spec, batch, anchors)[0, 0]  # the target's tokens before
        bias = served.network.markov_head(torch.cat([torch.tensor([last]), tokens[:-1]]))  # the drafts before
    assert tokens.tolist() == trained_tokens.tolist()
    torch.testing.assert_close(base, trained_base[0, 0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(biased, trained_base[0, 0] + bias, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(biased[0], forced[0], rtol=1e-4, atol=1e-4)  # row 0: the anchor before it in both
    assert bias.abs().max() > 1.0 and torch.equal(tokens, biased.argmax(-1))


def test_a_dspark_drafter_drafts_the_same_tokens_in_both_engines(demo_family, tmp_path):
    """The DSpark folder in the PyTorch engine and its GGUF (markov_w1/w2, sample_from_anchor)
    in the llama.cpp engine draft the same full block after the same prompt. (With this seed
    the Markov chain decides most drafts: without the head the block drafts other tokens.)"""
    import numpy as np

    from specdesk.app.demo.export_native_gguf import export_dflash_folder
    from specdesk.app.training import dspark
    from specdesk.engines.llama.engine import LlamaEngine
    from specdesk.engines.speculation.proposers import make_proposer
    from specdesk.engines.torch.engine import TorchEngine
    from specdesk.engines.types import SamplingParams, SpecConfig

    torch.set_num_threads(1)
    engine = TorchEngine(demo_family["target_hf"], n_ctx=256, device="cpu", dtype="float32", n_threads=1)
    spec, drafter = _dspark_drafter(engine.target.network, seed=7)
    folder = dspark.export_drafter(drafter, spec, engine.target.network.config, tmp_path / "dspark")
    gguf = export_dflash_folder(folder, Path(demo_family["target_gguf"]), tmp_path / "dspark-F16.gguf")
    llama = LlamaEngine(demo_family["target_gguf"], n_ctx=256, n_threads=1)

    def drafts(engine, path, prompt):
        run = SpecConfig("dflash", k=spec.block_size, draft_path=str(path))
        proposer = make_proposer(engine, run, SamplingParams(), np.random.default_rng(0))
        proposer.begin(prompt)
        engine.prefill(prompt, proposer)
        return proposer.propose(prompt, run.k).tokens

    try:
        for text in ("def read_lines(path):\n", "import os\n\n\ndef main():\n", "class Counter:\n"):
            prompt = engine.tokenize(text)
            assert prompt == llama.tokenize(text)
            ours, theirs = drafts(engine, folder, prompt), drafts(llama, gguf, prompt)
            assert len(ours) == spec.block_size and ours == theirs, text
    finally:
        llama.close()


def test_the_trained_mtp_layer_computes_in_the_engine_what_training_unrolled(demo_family, tmp_path, small_prompts):
    from specdesk.app.training import eagle3, mtp
    from specdesk.app.training.record import RecordSettings, load_sequence, record
    from specdesk.engines.torch.engine import TorchEngine

    torch.set_num_threads(1)
    engine = TorchEngine(demo_family["core_hf"], device="cpu", dtype="float32")
    network = engine.target.network
    files = record(engine, load_prompt_set(small_prompts)[:1],
                   RecordSettings(taps=mtp.taps(network.config), max_new_tokens=16), tmp_path / "cache", "train")
    sequence = load_sequence(files[0])
    layer = mtp.new_layer(network, seed=5)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(4)) * 0.02)
    folder = mtp.export_target_with_mtp(layer.half().float(), Path(demo_family["core_hf"]), tmp_path / "with-mtp")
    assert not (Path(demo_family["core_hf"]) / "model-mtp.safetensors").exists()  # the target is left alone
    served = TorchEngine(folder, device="cpu", dtype="float32")
    drafter = served.load_native("mtp")
    batch = eagle3.make_batch([sequence], 1024)
    with torch.no_grad():
        unrolled = mtp.unroll(drafter.layer, served.target.network, batch, 3)
        hidden = served.target.network.model.norm(torch.from_numpy(sequence.features.astype("float32")))
    tokens = sequence.tokens.tolist()
    p = len(tokens) - 5
    out, logits = drafter.step(hidden[:p + 1], tokens[1:p + 2], 0)
    torch.testing.assert_close(logits, unrolled[0][0, p], rtol=1e-4, atol=1e-4)
    previous = drafter.layer.feedback(out[-1:])
    for step in (1, 2):
        out, logits = drafter.step(previous, [tokens[p + 1 + step]], p + step)
        torch.testing.assert_close(logits, unrolled[step][0, p], rtol=1e-4, atol=1e-4)
        previous = drafter.layer.feedback(out)


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])  # each, whatever `auto` picks on this CPU
def test_an_mtp_layer_trained_for_one_step_is_kept_and_runs_in_both_engines(demo_family, small_prompts, tmp_path,
                                                                             capsys, precision):
    from specdesk.app.demo.export_gguf import export_gguf
    from specdesk.app.runtime.generation import run_once
    from specdesk.engines.llama.engine import LlamaEngine
    from specdesk.engines.torch.engine import TorchEngine
    from specdesk.engines.types import GenerationRequest, SamplingParams, SpecConfig

    core_gguf = export_gguf(Path(demo_family["core_hf"]), tmp_path / "core.gguf", "core")
    out = tmp_path / "run"
    argv = _common(demo_family, small_prompts, out) + ["--method", "mtp", "--steps", "1", "--precision", precision,
                                                        "--target-gguf", str(core_gguf)]
    argv[argv.index("--target") + 1] = demo_family["core_hf"]
    assert _run_cli(argv) == 0
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["training"]["precision"] == ("float32" if precision == "float32" else "bfloat16 autocast")
    assert provenance["adopted"] is False and provenance["reason"].startswith("trained MTP: ")
    assert provenance["measured"]["trained"]["identical_outputs"] is True
    prompt = "with open(path) as f:\n"
    plain, greedy = SpecConfig(), SamplingParams(temperature=0.0)
    torch_engine = TorchEngine(provenance["drafter"], device="cpu", dtype="float32")
    tokens = tuple(torch_engine.tokenize(prompt))
    runs = [run_once(torch_engine, GenerationRequest(tokens, max_tokens=32, sampling=greedy, spec=spec))
            for spec in (plain, SpecConfig(method="mtp", k=3))]
    llama = LlamaEngine(provenance["gguf"], n_ctx=256, n_threads=1)
    try:
        native = [run_once(llama, GenerationRequest(tokens, max_tokens=32, sampling=greedy, spec=spec))
                  for spec in (plain, SpecConfig(method="mtp", k=3))]
    finally:
        llama.close()
    assert runs[0].tokens == runs[1].tokens == native[0].tokens == native[1].tokens
    assert runs[1].stats.drafted > 0 and native[1].stats.drafted > 0
    assert abs(native[1].stats.acceptance_rate - runs[1].stats.acceptance_rate) <= 0.1

    # A target that has an MTP layer already is refused before anything is recorded.
    capsys.readouterr()
    argv[argv.index("--target") + 1] = demo_family["target_hf"]
    assert _run_cli(argv[:argv.index("--target-gguf")] + ["--out", str(tmp_path / "again")]) == 2
    assert "MTP layer(s) already" in capsys.readouterr().err


# --- train-drafter end to end --------------------------------------------------------------
def _common(demo_family, prompts: Path, out: Path) -> list[str]:
    return ["--target", demo_family["target_hf"], "--prompts", str(prompts), "--out", str(out), "--device", "cpu",
            "--threads", "1", "--max-tokens", "16", "--compare-prompts", "2", "--compare-tokens", "16",
            "--batch-size", "4"]


@pytest.mark.parametrize("method", ["eagle3", "dflash", "dspark"])
def test_a_drafter_trained_for_one_step_is_kept_but_not_adopted(method, demo_family, small_prompts, tmp_path, capsys):
    from specdesk.app.runtime.generation import run_once
    from specdesk.engines.torch.engine import TorchEngine
    from specdesk.engines.types import GenerationRequest, SamplingParams, SpecConfig

    started = time.perf_counter()
    out = tmp_path / "run"
    assert _run_cli(_common(demo_family, small_prompts, out) + ["--method", method, "--steps", "1", "--minutes", "1",
                                                                "--target-gguf", demo_family["target_gguf"]]) == 0
    assert time.perf_counter() - started < 60
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["trained_here"] and provenance["training"]["steps"] == 1
    assert provenance["training"]["cooldown"] == 0.2  # the default, recorded with the arithmetic trained in
    assert provenance["training"]["precision"] in ("float32", "bfloat16 autocast")
    assert provenance["adopted"] is False
    label = {"eagle3": "EAGLE-3", "dflash": "DFlash", "dspark": "DSpark"}[method]
    runs_as = methods_table.runs_as(method)  # a DSpark drafter runs as dflash
    assert provenance["method"] == method
    speedups = {"plain decoding": 1.0, **{name: m["speedup"] for name, m in provenance["measured"]["existing"].items()}}
    best = max(speedups, key=speedups.get)
    match = re.fullmatch(rf"trained {label}: (\d+\.\d\d)x, below (.+) (\d+\.\d\d)x", provenance["reason"])
    assert match, provenance["reason"]
    assert abs(float(match[1]) - provenance["speedup"]) <= 0.006 and provenance["speedup"] <= speedups[best]
    assert match[2] == best and abs(float(match[3]) - speedups[best]) <= 0.006
    assert provenance["measured"]["trained"]["identical_outputs"] is True
    assert len(provenance["held_out_acceptance_per_position"]) == DEPTH
    err = capsys.readouterr().err
    assert f"kept, not adopted: trained {label}" in err and "MiB" in err.split("\n")[1]

    # The exported folder is a drafter the PyTorch engine loads, and greedy output through it is the baseline's.
    engine = TorchEngine(demo_family["target_hf"], device="cpu", dtype="float32")
    tokens = tuple(engine.tokenize("with open(path) as f:\n"))
    runs = [run_once(engine, GenerationRequest(tokens, max_tokens=40, sampling=SamplingParams(temperature=0.0),
                                               spec=spec))
            for spec in (SpecConfig(), SpecConfig(method=runs_as, k=3, draft_path=str(out / method)))]
    assert runs[0].tokens == runs[1].tokens and len(runs[0].tokens) == 40
    assert runs[1].stats.drafted > 0

    # ... and so is the GGUF drafter in the llama.cpp engine, which drafts what the PyTorch one does.
    from specdesk.engines.llama.engine import LlamaEngine

    llama = LlamaEngine(demo_family["target_gguf"], n_ctx=256, n_threads=1)
    try:
        native = [run_once(llama, GenerationRequest(tokens, max_tokens=40, sampling=SamplingParams(temperature=0.0),
                                                    spec=spec))
                  for spec in (SpecConfig(), SpecConfig(method=runs_as, k=3, draft_path=provenance["gguf"]))]
    finally:
        llama.close()
    assert native[0].tokens == native[1].tokens == runs[0].tokens
    assert native[1].stats.drafted > 0
    assert abs(native[1].stats.acceptance_rate - runs[1].stats.acceptance_rate) <= 0.1
    print(method, runs[1].stats.acceptance_rate, native[1].stats.acceptance_rate)


def test_runs_reading_the_same_layers_share_one_recording_in_a_cache_folder(demo_family, small_prompts, tmp_path,
                                                                           capsys):
    """--cache: DFlash and DSpark read the same target layers, so the second run records nothing."""
    cache = tmp_path / "recordings"
    for method in ("dflash", "dspark"):
        assert _run_cli(_common(demo_family, small_prompts, tmp_path / method) +
                        ["--method", method, "--steps", "1", "--cache", str(cache)]) == 0
        err = capsys.readouterr().err
        assert f"into {cache}{os.sep}" in err
        assert ("recorded " in err) == (method == "dflash"), err
    assert len(list(cache.iterdir())) == 1 and not (tmp_path / "dspark" / "cache").exists()


def test_a_cache_folder_that_cannot_be_made_is_named_with_what_to_do(demo_family, small_prompts, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert _run_cli(_common(demo_family, small_prompts, tmp_path / "run") +
                    ["--method", "dflash", "--steps", "1", "--cache", str(blocker)]) == 2
    err = capsys.readouterr().err
    assert f"error: {blocker}{os.sep}" in err and "give --cache a folder you can write to" in err


def test_an_existing_run_is_not_overwritten_without_resume(demo_family, small_prompts, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "checkpoint.pt").write_bytes(b"")
    assert _run_cli(_common(demo_family, small_prompts, out) + ["--steps", "1"]) == 2
    assert "pass --resume" in capsys.readouterr().err


def test_bad_numbers_are_refused_with_a_message(demo_family, small_prompts, tmp_path, capsys):
    assert _run_cli(_common(demo_family, small_prompts, tmp_path / "r") + ["--minutes", "0"]) == 2
    assert "--minutes 0.0 is out of range" in capsys.readouterr().err
    assert _run_cli(_common(demo_family, small_prompts, tmp_path / "r") + ["--cooldown", "1"]) == 2
    assert "--cooldown 1: give a share of the budget from 0 up to (not including) 1" in capsys.readouterr().err


def _checkpoint_step(path: Path) -> int:
    try:
        return torch.load(path, weights_only=False)["state"].step
    except Exception:  # being replaced, or not there yet
        return -1


def test_a_killed_run_resumes_from_its_checkpoint(demo_family, small_prompts, tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "specdesk.app.training.cli", *_common(demo_family, small_prompts, out),
               "--eval-every", "2", "--minutes", "5", "--compare-prompts", "1"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 180  # a loaded machine records and steps slowly
        while time.time() < deadline and _checkpoint_step(out / "checkpoint.pt") < 4:
            time.sleep(0.2)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    killed_at = _checkpoint_step(out / "checkpoint.pt")
    assert killed_at >= 4, process.stderr.read()
    resumed = subprocess.run(command + ["--resume", "--steps", str(killed_at + 3)], capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from step {killed_at} " in resumed.stderr
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["training"]["steps"] == killed_at + 3
    steps = [entry["step"] for entry in provenance["training"]["history"]]
    assert steps[0] == 0 and steps == sorted(steps) and killed_at in steps  # one history, continued


def test_train_drafter_is_a_specdesk_subcommand(capsys):
    from specdesk.app.main import build_parser

    parser = build_parser()
    args = parser.parse_args(["train-drafter", "--target", "some-folder", "--method", "eagle3", "--minutes", "1"])
    assert args.func.__module__ == "specdesk.app.training.cli" and args.method == "eagle3"


# --- the app's "Train a drafter…" ----------------------------------------------------------
def test_the_window_trains_pauses_resumes_and_offers_the_drafter(demo_family, small_prompts, tmp_path, qtbot):
    """The dialog runs the command in a child process: progress over recording and the budget,
    a pause that checkpoints (Resume continues from that step, one history), the verdict, and
    "Use it" hands the target, the drafter and its method to the window. Saved chats are off
    by default."""
    from specdesk.app.training.job import TrainingRequest
    from specdesk.ui.train_dialog import TrainDrafterDialog

    out = tmp_path / "run"
    extra = ("--prompts", str(small_prompts), "--threads", "1", "--max-tokens", "16", "--compare-prompts", "1",
             "--compare-tokens", "16", "--batch-size", "4", "--eval-every", "4", "--steps", "40")
    default_out = TrainingRequest(demo_family["target_hf"]).out_folder()
    assert default_out == Path(demo_family["target_hf"]).parent / "target-hf-eagle3-trained"
    dialog = TrainDrafterDialog(demo_family["target_hf"], out=str(out), extra=extra)
    qtbot.addWidget(dialog)
    assert not dialog.from_history.isChecked()
    assert dialog.out_label.text() == str(out)
    assert dialog.start_button.isEnabled() and not dialog.pause_button.isEnabled()
    dialog.start()
    seen = []
    original = dialog.show_event

    def watch(event):
        seen.append(event)
        original(event)
        if event.get("phase") == "train" and dialog.job.running:  # the first: the untrained head's evaluation
            dialog.pause()
    dialog.show_event = watch
    qtbot.waitUntil(lambda: not dialog.job.running, timeout=300_000)
    assert dialog.job.exit_code == cli.PAUSED, [e.get("text") for e in seen if e["phase"] == "message"]
    assert any(e["phase"] == "record" for e in seen)
    paused_at = next(e for e in seen if e["phase"] == "paused")["where"]
    assert dialog.bar.text().startswith("paused at step"), dialog.bar.text()
    assert dialog.resume_button.isEnabled() and not dialog.start_button.isEnabled()
    step = _checkpoint_step(out / "checkpoint.pt")
    assert paused_at == f"at step {step}" and step < 40

    dialog.show_event = original
    dialog.resume_button.click()
    qtbot.waitUntil(lambda: not dialog.job.running, timeout=300_000)
    assert dialog.job.exit_code == 0
    provenance = json.loads((out / "provenance.json").read_text())
    history = [entry["step"] for entry in provenance["training"]["history"]]
    assert provenance["training"]["steps"] == 40 and history[0] == 0 and history == sorted(history)
    assert dialog.verdict.text().startswith("<b>Kept, not adopted:</b> trained EAGLE-3") or \
        dialog.verdict.text().startswith("<b>Adopted:</b> trained EAGLE-3")
    assert len(dialog.curve_accepted) >= 2  # the plot of held-out mean accepted tokens
    assert not dialog.start_button.isEnabled() and not dialog.resume_button.isEnabled()  # a finished run
    with qtbot.waitSignal(dialog.use_trained) as used:
        dialog.use_button.click()
    assert used.args == [demo_family["target_hf"], provenance["drafter"], "eagle3"]
    dialog.close()


def test_a_gguf_is_trained_from_the_librarys_folder_of_the_same_model():
    from specdesk.app.models.library import ModelEntry
    from specdesk.ui.train_dialog import hf_folder_for

    gguf = ModelEntry("m.gguf", "gguf", "user", "m", vocab_size=32000, parameters=1_000_000)
    drafter = ModelEntry("eagle", "hf", "user", "eagle", vocab_size=32000, parameters=1_020_000, drafter="eagle3")
    other = ModelEntry("big", "hf", "user", "big", vocab_size=32000, parameters=7_000_000)
    same = ModelEntry("m-hf", "hf", "user", "m", vocab_size=32000, parameters=1_050_000)
    assert hf_folder_for(gguf, [drafter, other]) is None
    assert hf_folder_for(gguf, [drafter, other, same]) == "m-hf"
    assert hf_folder_for(same, []) == "m-hf"



def test_the_dialog_trains_an_mtp_layer_from_a_gguf_alone(demo_family, qtbot):
    """Without the model's Hugging Face folder the dialog trains any method from the GGUF itself,
    an MTP layer too (written into a copy of the file)."""
    from specdesk.ui.train_dialog import TrainDrafterDialog

    dialog = TrainDrafterDialog(demo_family["target_gguf"])
    qtbot.addWidget(dialog)
    dialog.method.setCurrentIndex(dialog.method.findData("mtp"))
    assert dialog.folder_problem() is None and dialog.start_button.isEnabled()
    request = dialog.request()
    assert request.target == demo_family["target_gguf"] and request.method == "mtp" and request.target_gguf is None
    assert dialog.out_label.text().endswith("-mtp-trained")
    dialog.close()

# --- a GGUF target: llama.cpp records, PyTorch trains against the dequantized head ------------
def test_a_gguf_targets_shape_and_head_are_read_from_the_file(demo_family):
    from specdesk.app.training.gguf_target import heads_network, model_config
    from specdesk.engines.torch.context import TorchModel

    hf = TorchModel(demo_family["target_hf"], "cpu", torch.float32)
    try:
        import dataclasses

        ours = model_config(Path(demo_family["target_gguf"]))
        assert ours.rms_norm_eps == pytest.approx(hf.config.rms_norm_eps, rel=1e-6)  # GGUF keeps a float32
        assert dataclasses.replace(ours, rms_norm_eps=hf.config.rms_norm_eps) == hf.config
        network = heads_network(Path(demo_family["target_gguf"]), "cpu")
        for name in ("model.embed_tokens.weight", "model.norm.weight"):  # the GGUF stores them in F16 or F32
            ours, theirs = network.state_dict()[name], hf.network.state_dict()[name].float()
            torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-3 * float(theirs.abs().max()))
        assert network.model.layers[0].self_attn.q_proj.weight.is_meta  # llama.cpp runs the blocks
    finally:
        hf.close()


def test_a_gguf_of_another_architecture_is_refused_by_name(tmp_path):
    import numpy as np
    from gguf import GGUFWriter

    from specdesk.app.training.gguf_target import model_config

    path = tmp_path / "other.gguf"
    writer = GGUFWriter(str(path), "mamba")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(SpecDeskError, match=r"other\.gguf: .*architecture 'mamba'.*Hugging Face folder"):
        model_config(path)


@pytest.mark.parametrize("method", ["eagle3", "mtp"])
def test_llama_cpp_records_what_pytorch_records_on_the_same_weights(method, demo_family):
    """The same prompt and answer through the HF folder (PyTorch) and its GGUF export (llama.cpp):
    the same layer inputs (EAGLE-3), or for MTP the same last-layer rows after the target's final
    norm, which is how MTP reads them (llama.cpp hands them out only normed), and the same top-k
    distribution, up to llama.cpp's f16 keys and values."""
    import numpy as np

    from specdesk.app.training.gguf_target import LlamaPass
    from specdesk.app.training.methods import method_taps
    from specdesk.app.training.record import TorchPass
    from specdesk.engines.llama.engine import LlamaEngine
    from specdesk.engines.torch.engine import TorchEngine

    llama = LlamaEngine(demo_family["target_gguf"], n_ctx=512, n_threads=1)
    pytorch = TorchEngine(demo_family["target_hf"], device="cpu", dtype="float32", n_threads=1)
    try:
        network = pytorch.target.network
        taps = method_taps(method, network)
        tokens = llama.tokenize("import os\n\n\ndef main(argv):\n    for name in argv:\n") * 3
        assert len(tokens) > 40
        ours = LlamaPass(llama, taps, top_k=8, n_ctx=512)
        recorded = [ours(tokens), TorchPass(pytorch, taps, top_k=8)(tokens)]
        ours.close()
        if method == "mtp":
            assert taps == (network.config.num_hidden_layers,)
            with torch.no_grad():
                recorded = [(network.model.norm(torch.from_numpy(f.astype(np.float32))).numpy(), ids, logp)
                            for f, ids, logp in recorded]
    finally:
        llama.close(), pytorch.close()
    (features, ids, logp), (t_features, t_ids, t_logp) = recorded
    assert features.shape == t_features.shape == (len(tokens), len(taps) * pytorch_hidden(demo_family))
    scale = float(np.abs(t_features.astype(np.float32)).max())
    np.testing.assert_allclose(features.astype(np.float32), t_features.astype(np.float32), rtol=0, atol=2e-2 * scale)
    gap = t_logp[:, 0].astype(np.float32) - t_logp[:, 1].astype(np.float32)
    clear = gap > 0.05  # where the target's top two are not a near tie, the same top token
    assert clear.sum() > len(tokens) // 2 and (ids[clear, 0] == t_ids[clear, 0]).all()
    np.testing.assert_allclose(logp[:, 0].astype(np.float32), t_logp[:, 0].astype(np.float32), rtol=0, atol=0.05)


def test_the_last_layers_output_is_recorded_up_to_the_scale_the_final_norm_removes():
    """llama.cpp hands out the final-normed rows; `unnormed` turns them into rows whose final norm
    is those rows again (what MTP reads), with unit RMS even where the norm's weight is 0."""
    import numpy as np

    from specdesk.app.training.gguf_target import unnormed

    rng = np.random.default_rng(0)
    hidden = rng.standard_normal((5, 8)) * 7  # (n, d): the last layer's output
    weight = rng.uniform(0.5, 2.0, 8)

    def final_norm(x, eps=1e-6):
        return x / np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + eps) * weight

    rows = unnormed(final_norm(hidden), weight)
    np.testing.assert_allclose(rows, hidden / np.sqrt((hidden ** 2).mean(axis=-1, keepdims=True)), rtol=1e-5)
    weight[3] = 0.0
    rows = unnormed(final_norm(hidden), weight)
    np.testing.assert_allclose((rows ** 2).mean(axis=-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(final_norm(rows), final_norm(hidden), rtol=1e-5, atol=1e-6)


def pytorch_hidden(demo_family) -> int:
    return json.loads((Path(demo_family["target_hf"]) / "config.json").read_text())["hidden_size"]


@pytest.mark.parametrize("method", ["eagle3", "dflash", "dspark"])
def test_a_drafter_is_trained_from_a_gguf_target_alone(method, demo_family, small_prompts, tmp_path, capsys):
    """No Hugging Face folder: llama.cpp answers and records, the drafter trains against the
    head dequantized from the GGUF, and the GGUF drafter exported beside it runs in the
    llama.cpp engine with greedy output identical to the baseline."""
    import shutil

    target = tmp_path / "model.gguf"
    shutil.copyfile(demo_family["target_gguf"], target)
    assert _run_cli(_gguf_args(target, small_prompts) + ["--method", method, "--steps", "1"]) == 0
    out = tmp_path / f"model-{method}-trained"
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["target"] == str(target.resolve()) and provenance["training"]["steps"] == 1
    assert provenance["gguf"] == str((out / f"{method}-F16.gguf").resolve())
    assert (out / method / "config.json").is_file()
    assert provenance["measured"]["trained"]["identical_outputs"] is True  # measured on llama.cpp with the GGUF
    label = {"eagle3": "EAGLE-3", "dflash": "DFlash", "dspark": "DSpark"}[method]
    assert provenance["adopted"] is False and f"kept, not adopted: trained {label}" in capsys.readouterr().err


def test_a_block_drafter_trains_with_the_layers_asked_for_and_runs_in_llama_cpp(demo_family, small_prompts,
                                                                                 tmp_path, capsys):
    import shutil

    target = tmp_path / "model.gguf"
    shutil.copyfile(demo_family["target_gguf"], target)
    assert _run_cli(_gguf_args(target, small_prompts) + ["--method", "dflash", "--steps", "1",
                                                         "--draft-layers", "2"]) == 0
    out = tmp_path / "model-dflash-trained"
    assert json.loads((out / "dflash" / "config.json").read_text())["num_hidden_layers"] == 2
    assert json.loads((out / "provenance.json").read_text())["measured"]["trained"]["identical_outputs"] is True
    capsys.readouterr()
    assert _run_cli(_gguf_args(target, small_prompts) + ["--method", "dspark", "--draft-layers", "9",
                                                         "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "--draft-layers 9 is out of range for a block drafter: use 1 to 8" in err and "recording" not in err


def _gguf_args(target: Path, prompts: Path) -> list[str]:
    return ["--target", str(target), "--prompts", str(prompts), "--device", "cpu", "--threads", "1",
            "--max-tokens", "16", "--compare-prompts", "2", "--compare-tokens", "16", "--batch-size", "4",
            "--minutes", "1"]


def _greedy(path, prompt: str, specs, max_tokens: int = 40) -> list:
    """Greedy runs of `prompt` on the GGUF at `path` in the llama.cpp engine, one per SpecConfig."""
    from specdesk.app.runtime.generation import run_once
    from specdesk.engines.llama.engine import LlamaEngine
    from specdesk.engines.types import GenerationRequest, SamplingParams

    engine = LlamaEngine(str(path), n_ctx=256, n_threads=1)
    try:
        tokens = tuple(engine.tokenize(prompt))
        return [run_once(engine, GenerationRequest(tokens, max_tokens=max_tokens, stop_at_eos=False,
                                                   sampling=SamplingParams(temperature=0.0), spec=spec))
                for spec in specs]
    finally:
        engine.close()


def _same_tensors(source: Path, copy: Path) -> None:
    """Every tensor of the source GGUF is in the glm4moe copy under its name there, in its type
    and shape, byte for byte; a llama file's Q/K rows are in rotate-half order, which the llama
    converter's permutation (export_gguf.permute_rope_rows) takes back to the file's rows."""
    import numpy as np

    from specdesk.app.demo.export_gguf import permute_rope_rows
    from specdesk.app.demo.export_native_gguf import GGUF_BLOCK_TENSORS
    from specdesk.engines.llama.binding import gguf_header

    theirs, ours = gguf_header(source), gguf_header(copy)
    source_bytes, copy_bytes = (np.memmap(path, dtype=np.uint8, mode="r") for path in (source, copy))
    heads = {"attn_q.weight": theirs.arch_value("attention.head_count"),
             "attn_k.weight": theirs.arch_value("attention.head_count_kv")}
    for name, info in theirs.tensor_infos.items():
        parts = name.split(".", 2)
        kept = ours.tensor_infos[f"blk.{parts[1]}.{GGUF_BLOCK_TENSORS[parts[2]]}" if parts[0] == "blk" else name]
        assert (kept.ggml_type, kept.shape) == (info.ggml_type, info.shape), name
        rows = copy_bytes[kept.offset:kept.end].reshape(info.shape[-1] if len(info.shape) > 1 else 1, -1)
        if theirs.architecture == "llama" and parts[-1] in heads:
            rows = permute_rope_rows(rows, heads[parts[-1]])
        assert np.array_equal(rows.reshape(-1), source_bytes[info.offset:info.end]), name


def test_an_mtp_layer_is_trained_from_a_gguf_target_alone(demo_family, small_prompts, tmp_path, capsys):
    """No Hugging Face folder: llama.cpp answers and records the last layer's output, the layer
    trains against the embeddings, final norm and head dequantized from the GGUF, and a glm4moe
    copy of the GGUF carries it as its NextN layer. The copy loads in the llama.cpp engine, and
    greedy output through its MTP layer is the copy's baseline, which is the original file's."""
    import shutil

    target = tmp_path / "model.gguf"
    shutil.copyfile(demo_family["target_gguf"], target)
    assert _run_cli(_gguf_args(target, small_prompts) + ["--method", "mtp", "--steps", "40",
                                                          "--eval-every", "40"]) == 0
    out = tmp_path / "model-mtp-trained"
    copy = out / "model-mtp.gguf"
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["method"] == "mtp" and provenance["target"] == str(target.resolve())
    assert provenance["gguf"] == str(copy.resolve()) and provenance["drafter"] == str((out / "mtp").resolve())
    assert provenance["training"]["taps"] == [json.loads((Path(demo_family["target_hf"]) / "config.json")
                                                         .read_text())["num_hidden_layers"]]
    assert provenance["held_out_acceptance_per_position"][0] > 0.5  # it learned from what llama.cpp recorded
    assert provenance["measured"]["trained"]["identical_outputs"] is True  # measured on llama.cpp with the copy
    assert provenance["adopted"] is False and "kept, not adopted: trained MTP" in capsys.readouterr().err
    _same_tensors(target, copy)
    from specdesk.app.models.library import is_hf_folder, walk_models

    # the layer alone is not a model: the library lists the copy, not the layer's folder
    assert not is_hf_folder(out / "mtp")
    assert [p.name for p in walk_models(out) if p.suffix == ".gguf" or p.is_dir()] == ["model-mtp.gguf"]

    from specdesk.engines.types import SpecConfig

    prompt = "with open(path) as f:\n"
    (original,) = _greedy(target, prompt, [SpecConfig()])
    plain, with_mtp = _greedy(copy, prompt, [SpecConfig(), SpecConfig(method="mtp", k=3)])
    assert with_mtp.tokens == plain.tokens == original.tokens and len(original.tokens) == 40
    assert with_mtp.stats.drafted > 0 and with_mtp.stats.accepted > 0


@pytest.mark.parametrize("family", ["qwen2", "llama-bpe"])
def test_a_quantized_gguf_written_again_with_an_mtp_layer_computes_what_the_file_does(family, tmp_path):
    """The zoo's Q4_K_M targets (real vocabularies, random weights): Qwen2 with its q/k/v biases,
    Llama 3's with grouped keys and values and interleaved Q/K rows. Their glm4moe copies keep
    every tensor's bytes and type and give the same greedy tokens as the files, with or without
    the (seeded, untrained) MTP layer drafting."""
    from benchmarks import zoo
    from specdesk.app.demo.export_native_gguf import export_mtp_target_from_gguf
    from specdesk.app.training import mtp
    from specdesk.app.training.gguf_target import heads_network
    from specdesk.engines.types import SpecConfig

    torch.set_num_threads(1)
    source = Path(zoo.build(family, "Q4_K_M", small=True)["target_gguf"])
    layer = mtp.new_layer(heads_network(source, "cpu"), seed=1)
    folder = mtp.export_target_with_mtp(layer, source, tmp_path / "mtp")
    copy = export_mtp_target_from_gguf(folder, source, tmp_path / "copy.gguf")
    _same_tensors(source, copy)
    prompt = "def parse(text):\n    return text.split()\n"
    (original,) = _greedy(source, prompt, [SpecConfig()], max_tokens=24)
    plain, with_mtp = _greedy(copy, prompt, [SpecConfig(), SpecConfig(method="mtp", k=3)], max_tokens=24)
    assert with_mtp.tokens == plain.tokens == original.tokens and len(original.tokens) == 24
    assert with_mtp.stats.drafted > 0


def test_layer_inputs_of_a_qwen2_gguf_are_refused_rather_than_aborting_llama_cpp():
    """llama.cpp's qwen2 graph keeps no layer inputs (asking for them aborts the process), so
    EAGLE-3 and DFlash cannot be recorded from a qwen2 GGUF; its MTP tap can."""
    from benchmarks import zoo
    from specdesk.app.training.gguf_target import LlamaPass, model_config
    from specdesk.engines.llama.engine import LlamaEngine

    source = zoo.build("qwen2", "Q4_K_M", small=True)["target_gguf"]
    config = model_config(Path(source))
    engine = LlamaEngine(source, n_ctx=256, n_threads=1)
    try:
        with pytest.raises(SpecDeskError, match=r"target-Q4_K_M\.gguf: llama\.cpp hands out no layer inputs for "
                                                r"architecture 'qwen2'"):
            LlamaPass(engine, (1, 2), top_k=8, n_ctx=256)
        last = LlamaPass(engine, (config.num_hidden_layers,), top_k=8, n_ctx=256)
        features, ids, _ = last(engine.tokenize("def main():\n    return 1\n"))
        last.close()
    finally:
        engine.close()
    assert features.shape == (len(ids), config.hidden_size)

def test_a_gguf_whose_copy_would_drop_a_tensor_is_refused_before_recording(demo_family, small_prompts, tmp_path,
                                                                           capsys):
    """An MTP layer for a GGUF lives in a glm4moe copy of it; a tensor the copy has no place for
    (here Llama 3's rope_freqs) is refused by name, with the file, before anything is recorded."""
    import numpy as np
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(demo_family["target_gguf"])
    target = tmp_path / "rope-scaled.gguf"
    writer = GGUFWriter(str(target), "llama")
    for name, field in reader.fields.items():
        if not name.startswith("GGUF.") and name != "general.architecture":
            main_type = field.types[0]
            sub_type = field.types[-1] if main_type == GGUFValueType.ARRAY else None
            writer.add_key_value(name, field.contents(), main_type, sub_type=sub_type)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.asarray(tensor.data))
    writer.add_tensor("rope_freqs.weight", np.ones(16, np.float32))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file()
    writer.close()
    assert _run_cli(_gguf_args(target, small_prompts) + ["--method", "mtp", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{target}: cannot write it again with an MTP layer: tensor rope_freqs.weight has no place" in err
    assert "recording" not in err and not (tmp_path / "rope-scaled-mtp-trained" / "cache").exists()
