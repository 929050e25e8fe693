"""User settings: one JSON file under the platformdirs config dir.

A missing file means defaults; a damaged one is moved aside (``settings.json.bad``) and
defaults are used, so a bad file never stops the app from starting and is never silently
overwritten. Unknown keys are ignored and values of the wrong type fall back to their
default one by one, so a settings file from another version still loads.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .paths import config_dir

DEMO = "demo"  # target_path / draft_path value meaning "the embedded demo family's model"
DEMO_HF = "demo-hf"  # target_path: the demo target as a Hugging Face folder (PyTorch engine)
DEMO_DFLASH = "demo-dflash"  # draft_path: the demo target's DFlash drafter (PyTorch engine)
SETTINGS_FILE = "settings.json"


@dataclass
class Settings:
    target_path: str = DEMO  # DEMO, DEMO_HF, a GGUF file or a Hugging Face model folder
    draft_path: Optional[str] = DEMO  # DEMO, DEMO_DFLASH, a GGUF file, a folder, or None (no draft model)
    demo_size: str = "full"  # "full" (shipped) or "small" (trained here in ~30 s)
    method: str = "draft"
    k: int = 4
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    max_tokens: int = 256
    threads: int = 0  # 0 = automatic
    n_ctx: int = 0  # 0 = the model's own, at most 4096
    highlight_drafts: bool = True
    recent_targets: list = field(default_factory=list)
    recent_drafts: list = field(default_factory=list)
    compare_prompt: str = "def parse_args(argv):"
    last_chat_id: Optional[int] = None
    library_paths: list = field(default_factory=list)  # folders or files added to the model library
    model_sources: dict = field(default_factory=dict)  # other apps' model folders: name -> scanned (default on)

    @classmethod
    def from_dict(cls, data: dict) -> "Settings":
        defaults = cls()
        values = {}
        for f in dataclasses.fields(cls):
            if f.name not in data:
                continue
            value, default = data[f.name], getattr(defaults, f.name)
            if _same_kind(value, default, f.name):
                values[f.name] = value
        settings = cls(**values)
        if settings.demo_size not in ("full", "small"):
            settings.demo_size = "full"
        return settings

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def remember_target(self, path: str, limit: int = 8) -> None:
        self.recent_targets = _remember(self.recent_targets, path, limit)

    def remember_draft(self, path: str, limit: int = 8) -> None:
        self.recent_drafts = _remember(self.recent_drafts, path, limit)


_OPTIONAL = {"draft_path", "last_chat_id"}


def _same_kind(value, default, name: str) -> bool:
    if value is None:
        return name in _OPTIONAL
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if default is None:  # optional int / str fields
        return isinstance(value, (int, str))
    if isinstance(default, list):
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, type(default))


def _remember(items: list, path: str, limit: int) -> list:
    return [path] + [p for p in items if p != path][: limit - 1]


def settings_path() -> Path:
    return config_dir() / SETTINGS_FILE


def load_settings(path: Optional[Path] = None) -> Settings:
    path = Path(path) if path is not None else settings_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        return Settings()
    except (OSError, ValueError):
        try:
            os.replace(path, path.with_name(path.name + ".bad"))
        except OSError:
            pass
        return Settings()
    return Settings.from_dict(data)


def save_settings(settings: Settings, path: Optional[Path] = None) -> Path:
    """Write atomically (temp file + rename), so a crash never leaves half a file."""
    path = Path(path) if path is not None else settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    temporary.write_text(json.dumps(settings.to_dict(), indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, path)
    return path
