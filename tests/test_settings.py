"""Settings: JSON under the config dir; bad files never stop the app and are never overwritten blindly."""

from __future__ import annotations

import json

import pytest

from specdesk.app.storage.settings import (BUILTIN_PRESETS, DEMO, Preset, Settings, load_settings, save_settings,
                                           settings_path)
from specdesk.engines.types import SpecDeskError


def test_defaults_when_there_is_no_file(tmp_path):
    settings = load_settings(tmp_path / "settings.json")
    assert settings == Settings(temperature=0.7, top_p=0.95)  # sampled: the first chat should not loop
    assert settings.target_path == DEMO and settings.draft_path == DEMO and settings.method == "auto"


def test_round_trip(tmp_path):
    path = tmp_path / "deep" / "settings.json"
    settings = Settings(method="ngram", k=7, temperature=0.7, top_k=40, threads=2, draft_path=None, last_chat_id=3)
    settings.remember_target("/models/a.gguf")
    settings.remember_target("/models/b.gguf")
    settings.remember_target("/models/a.gguf")
    save_settings(settings, path)
    loaded = load_settings(path)
    assert loaded == settings
    assert loaded.recent_targets == ["/models/a.gguf", "/models/b.gguf"]
    assert not list(path.parent.glob("*.tmp-*"))


def test_the_config_dir_comes_from_platformdirs_or_the_override(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDESK_CONFIG_DIR", str(tmp_path))
    assert settings_path() == tmp_path / "settings.json"
    save_settings(Settings(k=2))
    assert load_settings().k == 2


def test_a_damaged_file_is_moved_aside(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text("{ not json")
    assert load_settings(path) == Settings()
    [aside] = tmp_path.glob("settings.json.bad-*")
    assert aside.read_text() == "{ not json"
    assert not path.exists()


def test_wrong_types_and_unknown_keys_fall_back_one_by_one(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"k": "seven", "temperature": 1, "top_p": True, "method": "ngram",
                                "recent_targets": [1, 2], "demo_size": "huge", "from_the_future": 1,
                                "draft_path": None, "max_tokens": 64}))
    settings = load_settings(path)
    assert settings.k == Settings().k and settings.top_p == Settings().top_p
    assert settings.temperature == 1 and settings.method == "ngram" and settings.max_tokens == 64
    assert settings.recent_targets == [] and settings.demo_size == "full" and settings.draft_path is None


# --- presets ---------------------------------------------------------------------------------
def test_built_in_presets_set_sampling_and_the_system_prompt():
    settings = Settings()
    assert [p.name for p in settings.all_presets()][:1] == ["Default"] and len(BUILTIN_PRESETS) >= 3
    chosen = settings.use_preset("Creative writing")
    assert (settings.preset, settings.temperature, settings.top_p) == ("Creative writing", 0.9, 0.95)
    assert settings.system_prompt == chosen.system_prompt != ""
    settings.use_preset("Default")
    assert (settings.temperature, settings.system_prompt) == (0.0, "")
    with pytest.raises(SpecDeskError, match="there is no preset named 'Nope'"):
        settings.use_preset("Nope")


def test_own_presets_round_trip_and_replace_a_built_in_one_of_their_name(tmp_path):
    path = tmp_path / "settings.json"
    settings = Settings()
    settings.save_preset(Preset("Reviewer", "Review the code you are given.", temperature=0.2, top_k=40))
    settings.save_preset(Preset("Concise", "One sentence.", max_tokens=64))
    save_settings(settings, path)
    loaded = load_settings(path)
    names = [p.name for p in loaded.all_presets()]
    assert names.count("Concise") == 1 and names[-2:] == ["Reviewer", "Concise"]
    assert loaded.find_preset("Concise").max_tokens == 64
    loaded.use_preset("Reviewer")
    assert (loaded.temperature, loaded.top_k, loaded.system_prompt) == (0.2, 40, "Review the code you are given.")
    loaded.delete_preset("Concise")  # the built-in one shows again
    assert loaded.find_preset("Concise") == next(p for p in BUILTIN_PRESETS if p.name == "Concise")
    with pytest.raises(SpecDeskError, match="'Default' is a built-in preset: it cannot be deleted"):
        loaded.delete_preset("Default")


def test_a_preset_with_a_value_out_of_range_is_refused_by_name():
    with pytest.raises(SpecDeskError, match="preset 'hot': temperature = 99 cannot be used \\(it goes from 0 to 10\\)"):
        Settings().save_preset(Preset("hot", temperature=99))
    with pytest.raises(SpecDeskError, match="a preset's name is one line"):
        Preset.from_dict({"name": "  "})


def test_a_settings_file_with_a_bad_preset_keeps_the_default_presets(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"presets": [{"name": "ok"}, {"name": "bad", "top_p": "high"}], "k": 3}))
    settings = load_settings(path)
    assert settings.presets == [] and settings.k == 3
    assert [p.name for p in settings.all_presets()] == [p.name for p in BUILTIN_PRESETS]


def test_a_new_user_starts_sampled_and_saved_settings_keep_theirs(tmp_path):
    """No settings file yet: sampled decoding (greedy sends the small demo model into loops); a saved
    choice, greedy included, is kept."""
    from specdesk.app.storage.settings import read_settings

    fresh, notice = read_settings(tmp_path / "settings.json")
    assert notice is None and fresh.temperature > 0 and fresh.top_p < 1
    save_settings(Settings(temperature=0.0), tmp_path / "settings.json")
    assert load_settings(tmp_path / "settings.json").temperature == 0.0
