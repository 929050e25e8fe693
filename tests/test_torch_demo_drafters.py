"""The demo family's MTP layer and DFlash drafter: trained at the core's size, widened with
the target. Widening must not change what they compute, and the exported folders must be
what the engine's loaders read."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from safetensors.numpy import load_file, save_file  # noqa: E402

from specdesk.app.demo.dflash import DFlashSpec, dflash_hf_config  # noqa: E402
from specdesk.app.demo.config import from_card  # noqa: E402
from specdesk.app.demo.install import shipped_folder  # noqa: E402
from specdesk.engines.torch.context import TorchContext, TorchModel  # noqa: E402
from specdesk.engines.torch.dflash import DFlashDrafter  # noqa: E402
from specdesk.engines.torch.mtp import MtpDrafter  # noqa: E402

from test_torch_loader import write_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def trained(demo_family, demo_cache_dir) -> Path:
    return shipped_folder(small=True)


def _tokens(model: TorchModel) -> list[int]:
    return model.tokenize("def read_config(path):\n    options = {}\n    with open(path) as f:\n")


def _on_core_and_target(demo_family, core_folder: Path, wide_folder: Path, run) -> list:
    """run(model, drafter folder, tokens) on the core with its drafter, then on the widened
    target with the widened drafter."""
    results = []
    for target, folder in ((demo_family["core_hf"], core_folder), (demo_family["target_hf"], wide_folder)):
        model = TorchModel(target, "cpu", torch.float32)
        results.append(run(model, folder, _tokens(model)))
    return results


def test_card_reports_the_native_drafters(demo_family):
    card = json.loads(Path(demo_family["card"]).read_text())
    assert card["mtp"]["style"] == "mimo" and 0 < card["mtp"]["held_out_top1_agreement"] <= 1
    assert card["dflash"]["spec"]["block_size"] >= 2
    assert {"mtp.safetensors", "dflash.safetensors"} <= set(card["files"])


def test_widened_mtp_layer_computes_what_it_did_on_the_core(demo_family, trained, tmp_path):
    mtp = {k: v for k, v in load_file(str(trained / "mtp.safetensors")).items()}
    core_folder = write_checkpoint(Path(demo_family["core_hf"]), tmp_path / "core-mtp", edit=lambda t: {**t, **mtp},
                                   config_edit=lambda c: c.update(num_nextn_predict_layers=1))
    results = []
    for folder in (core_folder, Path(demo_family["target_hf"])):
        model = TorchModel(folder, "cpu", torch.float32)
        tokens = _tokens(model)
        hidden = TorchContext(model, 128).decode(tokens).hidden
        _, logits = MtpDrafter.from_target(model, 128).step(hidden[:-1], tokens[1:], 0)
        results.append(logits.numpy())
    core, wide = results
    np.testing.assert_allclose(wide, core, rtol=0, atol=2e-3 * np.abs(core).max())  # fp16 rounding of the rescaled norms
    assert wide.argmax() == core.argmax()


def test_widened_dflash_drafter_computes_what_it_did_on_the_core(demo_family, trained, tmp_path):
    card = json.loads(Path(demo_family["card"]).read_text())
    core = from_card(card["core"]["config"])
    spec = DFlashSpec(**{**card["dflash"]["spec"], "target_layer_ids": tuple(card["dflash"]["spec"]["target_layer_ids"])})
    folder = tmp_path / "dflash-core"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dflash_hf_config(spec, core, core.hidden_size, core.rms_norm_eps)))
    save_file(load_file(str(trained / "dflash.safetensors")), str(folder / "model.safetensors"))
    results = []
    for target, drafter_folder in ((demo_family["core_hf"], folder), (demo_family["target_hf"], demo_family["dflash_hf"])):
        model = TorchModel(target, "cpu", torch.float32)
        drafter = DFlashDrafter.from_folder(drafter_folder, model, 128)
        tokens = _tokens(model)
        out = TorchContext(model, 128).decode(tokens[:-1], taps=drafter.taps)
        features = torch.cat([out.taps[t] for t in drafter.taps], dim=-1)
        results.append(drafter.draft_logits(features, 0, tokens[-1]).numpy())
    core_logits, wide_logits = results
    np.testing.assert_allclose(wide_logits, core_logits, rtol=0, atol=2e-3 * np.abs(core_logits).max())
    assert (wide_logits.argmax(1) == core_logits.argmax(1)).mean() >= 0.8


def test_widened_eagle3_head_computes_what_it_did_on_the_core(demo_family, tmp_path):
    """Any head (here a seeded one with perturbed norms) drafts the same on the widened target as on the core."""
    from specdesk.app.demo.eagle3 import FILE, export_eagle3_hf
    from specdesk.app.training.eagle3 import default_taps, hf_config, new_head
    from specdesk.engines.torch.eagle3 import Eagle3Drafter

    card = json.loads(Path(demo_family["card"]).read_text())
    core = from_card(card["core"]["config"])
    taps = default_taps(core.num_hidden_layers)
    head = new_head(TorchModel(demo_family["core_hf"], "cpu", torch.float32).network, seed=3)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        head.fc.weight.add_(torch.randn(head.fc.weight.shape, generator=generator) * 0.05)
        for name, param in head.named_parameters():
            if name.endswith("norm.weight"):
                param.mul_(1 + 0.2 * torch.rand(param.shape, generator=generator))
    state = {name: t.detach().numpy() for name, t in head.state_dict().items()}
    core_head = tmp_path / "eagle3-core"
    core_head.mkdir()
    (core_head / "config.json").write_text(json.dumps(hf_config(core, taps)))
    save_file(state, str(core_head / "model.safetensors"))
    trained = tmp_path / "trained"
    trained.mkdir()
    save_file({k: v.astype(np.float16) for k, v in state.items() if k != "lm_head.weight"}, str(trained / FILE))
    wide_head = tmp_path / "eagle3-wide"
    export_eagle3_hf(trained, {**card, "eagle3": {"taps": list(taps), "settings": {"widen_seed": 0}}},
                     demo_family["target_hf"], wide_head)

    def head_logits(model, folder, tokens):
        drafter = Eagle3Drafter.from_folder(folder, model, 128)
        out = TorchContext(model, 128).decode(tokens[:-1], taps=drafter.taps)
        _, logits = drafter.step(drafter.rows_from(out, len(tokens) - 1), tokens[1:], 0)
        return logits.numpy()

    core_logits, wide_logits = _on_core_and_target(demo_family, core_head, wide_head, head_logits)
    np.testing.assert_allclose(wide_logits, core_logits, rtol=0, atol=5e-3 * np.abs(core_logits).max())
    assert wide_logits.argmax() == core_logits.argmax()


@pytest.mark.parametrize("method", ["dflash", "dspark"])
def test_the_trainers_block_drafter_widened_drafts_what_it_did_on_the_core(method, demo_family, tmp_path):
    """Any drafter the product's trainer makes for the core (here a seeded one with perturbed norms
    and, for DSpark, a Markov head that biases), taken into the family as the recipe does, drafts
    the same on the widened target as on the core: the backbone widened as DFlash's, the Markov
    head kept."""
    from specdesk.app.demo import dflash as demo_dflash, dspark as demo_dspark
    from specdesk.app.training import dflash as dflash_training, dspark as dspark_training

    demo, training = {"dflash": (demo_dflash, dflash_training), "dspark": (demo_dspark, dspark_training)}[method]
    card = json.loads(Path(demo_family["card"]).read_text())
    core = from_card(card["core"]["config"])
    network = TorchModel(demo_family["core_hf"], "cpu", torch.float32).network
    spec = dflash_training.spec_for(network.config, 2 if method == "dflash" else None)  # the shipped layer counts
    drafter = training.new_drafter(network, spec)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, param in drafter.named_parameters():
            if name.endswith("norm.weight"):
                param.mul_(1 + 0.2 * torch.rand(param.shape, generator=generator))
            elif name.endswith("markov_w2.weight"):
                param.copy_(torch.randn(param.shape, generator=generator))
    core_folder = training.export_drafter(drafter, spec, network.config, tmp_path / f"{method}-core")
    state, fields = demo.take(core_folder)
    assert tuple(fields["spec"]["target_layer_ids"]) == spec.target_layer_ids
    if method == "dspark":
        assert fields["markov_rank"] == min(256, core.hidden_size)
    trained = tmp_path / "trained"
    trained.mkdir()
    save_file({k: v.astype(np.float16) for k, v in state.items()}, str(trained / demo.FILE))
    wide_folder = tmp_path / f"{method}-wide"
    entry = {**fields, "settings": {"widen_seed": 0}}
    (demo_dflash.export_dflash_hf if method == "dflash" else demo_dspark.export_dspark_hf)(
        trained, {**card, method: entry}, wide_folder)
    if method == "dspark":
        config = json.loads((wide_folder / "config.json").read_text())
        assert config == json.loads(json.dumps(demo_dspark.dspark_hf_config(
            spec, core, card["wide"]["hidden_size"], config["rms_norm_eps"], fields["markov_rank"])))

    def block_drafts(model, folder, tokens):
        loaded = DFlashDrafter.from_folder(folder, model, 128)
        out = TorchContext(model, 128).decode(tokens[:-1], taps=loaded.taps)
        features = torch.cat([out.taps[t] for t in loaded.taps], dim=-1)
        drafts, logits = loaded.draft(loaded.draft_logits(features, 0, tokens[-1]), tokens[-1])
        return drafts.numpy(), logits.numpy()

    (core_drafts, core_logits), (wide_drafts, wide_logits) = _on_core_and_target(demo_family, core_folder,
                                                                                 wide_folder, block_drafts)
    np.testing.assert_allclose(wide_logits, core_logits, rtol=0, atol=5e-3 * np.abs(core_logits).max())
    assert (wide_drafts == core_drafts).mean() >= 0.8


def test_the_trainers_mtp_layer_is_taken_under_the_names_the_family_widens(demo_family, tmp_path):
    from specdesk.app.demo.mtp import PREFIX, take, widen_mtp
    from specdesk.app.training import mtp as mtp_training

    card = json.loads(Path(demo_family["card"]).read_text())
    core = from_card(card["core"]["config"])
    network = TorchModel(demo_family["core_hf"], "cpu", torch.float32).network
    folder = mtp_training.export_layer(mtp_training.new_layer(network), network.config, tmp_path / "mtp")
    state, fields = take(folder)
    shipped = load_file(str(shipped_folder(small=True) / "mtp.safetensors"))
    assert fields == {"style": "mimo"} and set(state) == set(shipped) and all(n.startswith(PREFIX) for n in state)
    wide = replace(core, hidden_size=card["wide"]["hidden_size"], num_attention_heads=card["wide"]["num_attention_heads"],
                   intermediate_size=card["wide"]["intermediate_size"])
    assert set(widen_mtp(state, core, wide, seed=0)) == set(state)
