"""The model library on the demo family's real files, hand-made drafter and MTP files, other
apps' folders laid out as those apps lay them out, and damaged files."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from specdesk.app.models.library import (LibraryConfig, demo_family_paths, expand_location, load_sources, read_model,
                                  scan_library, source_locations)


def tiny_gguf(path: Path, arch: str, keys: dict) -> Path:
    """A minimal GGUF file with the given architecture and metadata (one small tensor)."""
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), arch)
    for key, value in keys.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, list):
            writer.add_array(key, value)
        else:
            writer.add_string(key, value)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def hf_folder(path: Path, config: dict) -> Path:
    from safetensors.numpy import save_file

    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file({"fc.weight": np.zeros((4, 12), dtype=np.float16)}, str(path / "model.safetensors"))
    return path


def no_apps(tmp_path) -> dict:
    return {"HOME": str(tmp_path / "empty-home")}


def test_demo_gguf_metadata_matches_llama_cpp(demo_family):
    from specdesk.engines.llama.binding import GgufModel

    entry = read_model(demo_family["target_gguf"], "demo")
    model = GgufModel(demo_family["target_gguf"])
    try:
        assert entry.ok and entry.format == "gguf" and entry.architecture == "llama"
        assert entry.parameters == model.n_params
        assert entry.weights_bytes == model.size_bytes
        assert entry.vocab_size == model.n_vocab and entry.vocab_type == model.vocab.vocab_type
        assert entry.context_length == model.n_ctx_train
        assert entry.chat_template == (model.chat_template() is not None)
        assert entry.shape.n_embd == model.n_embd
        assert entry.quantization == "F16" and entry.mtp_layers == 0 and entry.drafter is None
        assert entry.size_bytes == os.path.getsize(demo_family["target_gguf"])
    finally:
        model.close()


def test_demo_hf_folder_metadata(demo_family):
    entry = read_model(demo_family["draft_hf"], "demo")
    card = json.loads(Path(demo_family["card"]).read_text())
    assert entry.ok and entry.format == "hf" and entry.architecture == "LlamaForCausalLM"
    assert entry.vocab_size == card["draft"]["config"]["vocab_size"]
    assert entry.parameters == card["draft"]["parameters"]
    assert entry.chat_template and entry.shape.n_layer == card["draft"]["config"]["num_hidden_layers"]


def test_mtp_and_drafter_files_are_recognised(tmp_path):
    mtp = read_model(tiny_gguf(tmp_path / "glm-mtp.gguf", "glm4moe", {"glm4moe.nextn_predict_layers": 1}))
    assert mtp.mtp_layers == 1 and mtp.drafter is None
    assert "glm4moe.block_count is missing" in mtp.error  # recognised, but a header this bare is not usable
    dflash = read_model(tiny_gguf(tmp_path / "dflash.gguf", "dflash", {"dflash.block_size": 16}))
    assert dflash.drafter == "dflash" and dflash.drafter_config == {"block_size": 16}
    # the target layers a drafter reads are the one list kept: pairing checks them against a target
    eagle_gguf = read_model(tiny_gguf(tmp_path / "eagle3.gguf", "eagle3", {
        "eagle3.target_layers": [2, 4, 5], "eagle3.target_hidden_size": 768, "eagle3.extra_list": [1, 2]}))
    assert eagle_gguf.drafter_config == {"target_layers": [2, 4, 5], "target_hidden_size": 768}
    folder = hf_folder(tmp_path / "qwen3-dflash", {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16, "num_target_layers": 36,
        "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]}})
    entry = read_model(folder)
    assert entry.drafter == "dflash" and entry.parameters == 48
    assert entry.drafter_config == {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33],
                                    "block_size": 16, "num_target_layers": 36}
    dspark = read_model(hf_folder(tmp_path / "qwen3-dspark", {  # DeepSpec's keys sit at the top level
        "architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "block_size": 7, "num_target_layers": 36,
        "mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33], "markov_rank": 256,
        "markov_head_type": "vanilla", "enable_confidence_head": True}))
    assert dspark.drafter == "dflash"
    assert dspark.drafter_config == {"block_size": 7, "num_target_layers": 36, "mask_token_id": 151669,
                                     "target_layer_ids": [1, 9, 17, 25, 33], "markov_rank": 256}
    eagle = read_model(hf_folder(tmp_path / "eagle3", {"architectures": ["LlamaForCausalLMEagle3"],
                                                       "draft_vocab_size": 32000, "vocab_size": 128256}))
    assert eagle.drafter == "eagle3" and eagle.drafter_config == {"draft_vocab_size": 32000}
    qwen_next = read_model(hf_folder(tmp_path / "qwen35", {"architectures": ["Qwen3_5ForConditionalGeneration"],
                                                           "text_config": {"mtp_num_hidden_layers": 1,
                                                                           "vocab_size": 248320}}))
    assert qwen_next.mtp_layers == 1 and qwen_next.vocab_size == 248320
    deepseek = read_model(hf_folder(tmp_path / "dsv3", {"architectures": ["DeepseekV3ForCausalLM"],
                                                        "num_nextn_predict_layers": 1}))
    assert deepseek.mtp_layers == 1


def test_damaged_files_are_listed_with_their_error_and_the_scan_goes_on(demo_family, tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    good = folder / "good.gguf"
    shutil.copy(demo_family["draft_gguf"], good)
    data = good.read_bytes()
    (folder / "truncated.gguf").write_bytes(data[: len(data) // 3])
    (folder / "garbage.gguf").write_bytes(b"GGUF" + os.urandom(300))
    (folder / "not-gguf.gguf").write_bytes(b"PK\x03\x04 a zip file")
    (folder / "empty.gguf").write_bytes(b"")
    broken = folder / "broken-hf"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    (broken / "model.safetensors").write_bytes(b"\xff" * 16)
    entries = scan_library(LibraryConfig(include_hf_cache=False, include_demo=False, user_paths=[str(folder)],
                                         env=no_apps(tmp_path)))
    by_name = {Path(e.path).name: e for e in entries}
    assert set(by_name) == {"good.gguf", "truncated.gguf", "garbage.gguf", "not-gguf.gguf", "empty.gguf", "broken-hf"}
    assert by_name["good.gguf"].ok
    for name in ("truncated.gguf", "garbage.gguf", "not-gguf.gguf", "empty.gguf", "broken-hf"):
        error = by_name[name].error
        assert error and error.startswith(str(folder / name)), name
    assert "truncated" in by_name["truncated.gguf"].error
    assert "not a GGUF file" in by_name["not-gguf.gguf"].error


def make_other_apps(home: Path, demo_family) -> dict[str, Path]:
    """Each app's folder as that app lays it out, holding real GGUF files."""
    target, draft = demo_family["target_gguf"], demo_family["draft_gguf"]
    lmstudio = home / ".lmstudio" / "models" / "specdesk" / "demo-GGUF" / "demo-draft-F16.gguf"
    jan = home / ".local" / "share" / "Jan" / "data" / "llamacpp" / "models" / "demo" / "model.gguf"
    gpt4all = home / ".local" / "share" / "nomic.ai" / "GPT4All" / "demo-target.gguf"
    llamacpp = home / "llama-cache" / "specdesk_demo-GGUF_demo-draft-F16.gguf"
    for path, src in ((lmstudio, draft), (jan, draft), (gpt4all, target), (llamacpp, draft)):
        path.parent.mkdir(parents=True)
        shutil.copy(src, path)
    store = home / ".ollama" / "models"
    digest = "sha256:" + "ab" * 32
    blob = store / "blobs" / digest.replace(":", "-")
    blob.parent.mkdir(parents=True)
    shutil.copy(target, blob)
    manifest = store / "manifests" / "registry.ollama.ai" / "library" / "specdesk-demo" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.model", "digest": digest, "size": blob.stat().st_size},
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "cd" * 32, "size": 10}]}))
    return {"lmstudio": lmstudio, "jan": jan, "gpt4all": gpt4all, "llamacpp": llamacpp, "ollama": blob}


def test_other_apps_models_are_found_and_read_in_place(demo_family, tmp_path):
    home = tmp_path / "home"
    files = make_other_apps(home, demo_family)
    env = {"HOME": str(home), "LLAMA_CACHE": str(home / "llama-cache")}
    before = sorted(p for p in tmp_path.rglob("*"))
    entries = scan_library(LibraryConfig(include_hf_cache=False, include_demo=False, env=env, platform="linux"))
    assert sorted(p for p in tmp_path.rglob("*")) == before  # nothing copied, nothing written
    found = {e.source: e for e in entries}
    assert set(found) == set(files)
    for source, path in files.items():
        assert found[source].path == str(path) and found[source].ok, source
    assert found["ollama"].name == "specdesk-demo:latest (Ollama)"
    assert found["ollama"].architecture == "llama"
    # Each source can be switched off.
    fewer = scan_library(LibraryConfig(include_hf_cache=False, include_demo=False, env=env, platform="linux",
                                       sources={"ollama": False, "jan": False}))
    assert {e.source for e in fewer} == {"lmstudio", "gpt4all", "llamacpp"}


def test_every_source_has_locations_for_every_os():
    sources = load_sources()
    assert set(sources) == {"lmstudio", "ollama", "jan", "gpt4all", "llamacpp"}
    env = {"HOME": "/home/u", "USERPROFILE": "C:/Users/u", "APPDATA": "C:/Users/u/AppData/Roaming",
           "LOCALAPPDATA": "C:/Users/u/AppData/Local"}
    for name in sources:
        for platform in ("linux", "macos", "windows"):
            assert source_locations(name, sources, platform, env), (name, platform)
    assert source_locations("ollama", sources, "linux", {"HOME": "/h", "OLLAMA_MODELS": "/models"})[0] == Path("/models")
    assert expand_location("$UNSET_VARIABLE/models", {}) is None


def test_demo_family_and_settings_feed_the_scan(demo_family, tmp_path):
    from specdesk.app.storage.settings import Settings

    root = Path(demo_family["target_gguf"]).parent.parent
    assert Path(demo_family["target_gguf"]) in demo_family_paths(root)
    extra = tmp_path / "extra.gguf"
    shutil.copy(demo_family["draft_gguf"], extra)
    settings = Settings(library_paths=[str(extra)], model_sources={"ollama": False})
    config = LibraryConfig.from_settings(settings)
    assert config.sources == {"ollama": False}
    config.include_hf_cache, config.demo_root, config.env = False, root, no_apps(tmp_path)
    entries = scan_library(config)
    paths = {e.path for e in entries}
    assert {demo_family["target_gguf"], demo_family["draft_gguf"], str(extra)} <= paths
    assert len(paths) == len(entries)  # each file once
    payload = entries[0].to_json()
    assert {"path", "format", "architecture", "parameters", "vocab_size", "size_bytes"} <= set(payload)


def test_models_list_json(demo_family, tmp_path, monkeypatch, capsys):
    from specdesk.app.main import main

    monkeypatch.setenv("SPECDESK_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("HOME", str(tmp_path / "empty-home"))
    folder = Path(demo_family["target_gguf"]).parent
    (tmp_path / "bad.gguf").write_bytes(b"GGUF\x03\x00\x00\x00 broken")
    assert main(["models", "list", "--json", "--no-hf-cache", "--path", str(folder),
                 "--path", str(tmp_path / "bad.gguf")]) == 0
    listed = {e["path"]: e for e in json.loads(capsys.readouterr().out)}
    target = listed[demo_family["target_gguf"]]
    for key in ("path", "format", "architecture", "parameters", "vocab_size", "size_bytes", "native_drafters"):
        assert key in target, key
    assert target["format"] == "gguf" and target["architecture"] == "llama" and target["parameters"] > 0
    assert listed[str(tmp_path / "bad.gguf")]["error"]
    assert main(["models", "list", "--no-hf-cache", "--path", str(folder)]) == 0
    assert demo_family["draft_gguf"] in capsys.readouterr().out


def test_a_missing_sources_table_still_lists_the_rest(demo_family, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDESK_ASSETS_DIR", str(tmp_path / "no-assets"))
    assert load_sources() == {}
    entries = scan_library(LibraryConfig(include_hf_cache=False, include_demo=False,
                                         user_paths=[demo_family["draft_gguf"]], env=no_apps(tmp_path)))
    assert [e.path for e in entries] == [demo_family["draft_gguf"]]


@pytest.mark.parametrize("size", [218 * 10**6, 2 * 2**30], ids=["218MB", "2GB"])
def test_a_tokenizer_the_engine_refuses_is_listed_with_its_reason(tmp_path, monkeypatch, capsys, size):
    """Issue 48, 4: folders whose tokenizer.json is 218 MB, or a 2 GB sparse file, were listed as
    usable while compare refused them: the library applies the engine's limit, in its words."""
    from specdesk.app.main import main
    from specdesk.engines.torch.tokenizer import HfTokenizer
    from specdesk.engines.types import SpecDeskError

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000}
    fine = hf_folder(tmp_path / "fine", config)
    (fine / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {}, "merges": []}}')
    bomb = hf_folder(tmp_path / "bomb", config)
    with open(bomb / "tokenizer.json", "wb") as f:
        f.truncate(size)  # sparse: no disk used, and nothing of it may be read
    with pytest.raises(SpecDeskError) as refused:
        HfTokenizer(bomb)  # what compare and chat say of it
    assert read_model(fine).ok
    entry = read_model(bomb)
    assert not entry.ok and entry.error == str(refused.value)
    assert f"{size} bytes is not a plausible tokenizer.json file" in entry.error
    assert entry.architecture == "LlamaForCausalLM" and entry.vocab_size == 32000  # the rest is still read

    monkeypatch.setenv("SPECDESK_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("HOME", str(tmp_path / "empty-home"))
    assert main(["models", "list", "--no-hf-cache", "--no-apps", "--path", str(bomb)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].strip() == f"error: {refused.value}", lines
    assert main(["models", "list", "--json", "--no-hf-cache", "--no-apps", "--path", str(bomb)]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert listed["error"] == str(refused.value)
