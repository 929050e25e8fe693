"""Settings: JSON under the config dir; bad files never stop the app and are never overwritten blindly."""

from __future__ import annotations

import json

from specdesk.app.storage.settings import DEMO, Settings, load_settings, save_settings, settings_path


def test_defaults_when_there_is_no_file(tmp_path):
    settings = load_settings(tmp_path / "settings.json")
    assert settings == Settings()
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
