"""User settings: one JSON file under the platformdirs config dir.

A missing file means defaults. Whatever else the file holds, the app starts: a file that
cannot be read (not JSON, nested too deeply, not a regular file) gives all defaults; a value
of the wrong type or outside what its control accepts (an integer of 2^31 in a spin box, a
NaN temperature) gives that field's default. Either way the original is moved aside
(``settings.json.bad-<time>``), never overwritten, and `read_settings` says so in one line.
Unknown keys are ignored, so a settings file from a newer version still loads.

Presets are a name, a system prompt and sampling settings. A few are built in (BUILTIN_PRESETS);
the user's own (`Settings.presets`) are kept beside them, and one of the user's with a built-in
preset's name takes its place. Choosing a preset sets the sampling fields and the system
prompt a new chat starts with.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from specdesk.engines.llama.draft_copy import DRAFT_WEIGHTS
from specdesk.engines.types import MAX_DRAFT_TOKENS, METHODS, SpecDeskError

from .paths import config_dir

DEMO = "demo"  # target_path / draft_path value meaning "the embedded demo family's model"
DEMO_HF = "demo-hf"  # target_path: the demo target as a Hugging Face folder (PyTorch engine)
DEMO_DFLASH = "demo-dflash"  # draft_path: the demo target's DFlash drafter (a folder on PyTorch, a GGUF on llama.cpp)
DEMO_MTP = "demo-mtp"  # target_path: the demo target exported with its MTP layer (llama.cpp)
SETTINGS_FILE = "settings.json"
MAX_FILE_BYTES = 16 * 2**20  # settings are a few kB; a larger file is not ours
MAX_TEXT = 1_000_000  # characters in one string value (the compare prompt is the longest)
MAX_LIST = 256  # entries in one list (recent models, library folders)

# What each numeric field's control accepts (ui/controls.py sets its spin boxes from these).
RANGES: dict[str, tuple[float, float]] = {
    "k": (1, MAX_DRAFT_TOKENS),
    "temperature": (0.0, 10.0),
    "compare_temperature": (0.0, 10.0),
    "top_p": (0.01, 1.0),
    "top_k": (0, 100_000),
    "seed": (0, 2**31 - 1),
    "max_tokens": (1, 32_768),
    "threads": (0, 256),
    "n_ctx": (0, 131_072),
    "last_chat_id": (0, 2**63 - 1),  # an SQLite row id
    "font_scale": (0.5, 3.0),  # View > Zoom: the window's font size against the system's
}
THEMES = ("system", "light", "dark")  # View > Theme (ui/theme.py applies them)
CHOICES: dict[str, tuple] = {"demo_size": ("full", "small"), "method": METHODS, "theme": THEMES,
                             "draft_weights": DRAFT_WEIGHTS}
MAX_PRESET_NAME = 80  # characters


@dataclass(frozen=True)
class Preset:
    """A name, the system prompt a chat starts with, and sampling settings."""

    name: str
    system_prompt: str = ""
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256

    @classmethod
    def from_dict(cls, data: Any) -> "Preset":
        """A preset from its JSON object; SpecDeskError naming the first value that cannot be used."""
        if not isinstance(data, dict):
            raise SpecDeskError(f"a preset is a JSON object, not {_short(data)}")
        name = data.get("name")
        if not _is_text(name) or not name.strip() or len(name) > MAX_PRESET_NAME or "\n" in name:
            raise SpecDeskError(f"a preset's name is one line of 1 to {MAX_PRESET_NAME} characters, "
                                f"not {_short(name)}")
        values = {"name": name.strip()}
        for f in dataclasses.fields(cls)[1:]:
            if f.name not in data:
                continue
            value = data[f.name]
            if not _acceptable(f.name, value, f.default):
                raise SpecDeskError(f"preset {name!r}: {f.name} = {_short(value)} cannot be used"
                                    + (f" (it goes from {RANGES[f.name][0]:g} to {RANGES[f.name][1]:g})"
                                       if f.name in RANGES else ""))
            values[f.name] = value
        return cls(**values)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


BUILTIN_PRESETS: tuple[Preset, ...] = (
    Preset("Default"),
    Preset("Coding assistant",
           "You are a careful programming assistant. Answer with working code in fenced code blocks "
           "that name their language, and keep explanations short.", max_tokens=1024),
    Preset("Concise", "Answer in as few words as the question allows. No preamble.", max_tokens=256),
    Preset("Creative writing", "You are an imaginative writer. Vary your sentences and avoid clichés.",
           temperature=0.9, top_p=0.95, max_tokens=1024),
)


@dataclass
class Settings:
    target_path: str = DEMO  # DEMO, DEMO_HF, a GGUF file or a Hugging Face model folder
    draft_path: Optional[str] = DEMO  # DEMO, DEMO_DFLASH, a GGUF file, a folder, or None (no draft model)
    demo_size: str = "full"  # "full" (shipped) or "small" (trained here in ~30 s)
    method: str = "auto"
    k: int = 4
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    max_tokens: int = 256
    threads: int = 0  # 0 = automatic
    n_ctx: int = 0  # 0 = the model's own, at most 4096
    # Where a GGUF target's and draft's layers sit (engines/llama/placement.py): a device (auto,
    # CPU, or a name `specdesk devices` lists) and GPU layers (auto, all, or a number).
    device: str = "auto"
    gpu_layers: str = "auto"
    draft_device: str = "auto"
    draft_gpu_layers: str = "auto"
    rpc_servers: str = ""  # llama.cpp RPC servers, HOST:PORT[,HOST:PORT]: their devices can take layers
    draft_weights: str = "q8"  # a float GGUF draft model on the CPU: from a Q8_0 copy ("q8") or its own file ("file")
    highlight_drafts: bool = True
    theme: str = "system"  # View > Theme: system, light or dark
    font_scale: float = 1.0  # View > Zoom: 1.0 is the system's font size
    first_run_done: bool = False  # the first-run card was used or dismissed: it does not show again
    recent_targets: list = field(default_factory=list)
    recent_drafts: list = field(default_factory=list)
    compare_prompt: str = "def parse_args(argv):"
    compare_temperature: float = 0.0  # the Compare tab's own (greedy: it can show identical outputs), not the chat's
    last_chat_id: Optional[int] = None
    library_paths: list = field(default_factory=list)  # folders or files added to the model library
    model_sources: dict = field(default_factory=dict)  # other apps' model folders: name -> scanned (default on)
    preset: str = "Default"  # the chosen preset's name
    system_prompt: str = ""  # the system prompt a new chat starts with (the chosen preset's, unless edited)
    presets: list = field(default_factory=list)  # the user's own presets, as Preset.to_dict() objects

    @classmethod
    def from_dict(cls, data: dict) -> "Settings":
        return cls.checked(data)[0]

    @classmethod
    def checked(cls, data: dict) -> tuple["Settings", list[str]]:
        """Settings from `data`, and the names of the fields whose values were refused
        (those keep their defaults)."""
        values, refused = {}, []
        for f in dataclasses.fields(cls):
            if f.name not in data:
                continue
            if _acceptable(f.name, data[f.name], f.default if f.default is not dataclasses.MISSING
                           else f.default_factory()):
                values[f.name] = data[f.name]
            else:
                refused.append(f.name)
        return cls(**values), refused

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def placement(self) -> dict:
        """The engine process's placement options (app/runtime/engine_host.HostSpec) from these settings."""
        from specdesk.engines.llama.rpc import parse_endpoints

        return {"device": self.device, "gpu_layers": self.gpu_layers, "draft_device": self.draft_device,
                "draft_gpu_layers": self.draft_gpu_layers, "rpc": tuple(parse_endpoints(self.rpc_servers)),
                "draft_weights": self.draft_weights}

    def all_presets(self) -> list[Preset]:
        """The built-in presets, then the user's; a user's preset replaces a built-in one of its name."""
        own = [Preset.from_dict(data) for data in self.presets]
        names = {p.name for p in own}
        return [p for p in BUILTIN_PRESETS if p.name not in names] + own

    def find_preset(self, name: str) -> Optional[Preset]:
        return next((p for p in self.all_presets() if p.name == name), None)

    def use_preset(self, name: str) -> Preset:
        """Choose a preset: its sampling settings and system prompt become the current ones."""
        preset = self.find_preset(name)
        if preset is None:
            raise SpecDeskError(f"there is no preset named {name!r}")
        self.preset, self.system_prompt = preset.name, preset.system_prompt
        self.temperature, self.top_p, self.top_k = preset.temperature, preset.top_p, preset.top_k
        self.max_tokens = preset.max_tokens
        return preset

    def save_preset(self, preset: Preset) -> None:
        """Keep a preset of the user's (replacing one of the same name)."""
        checked = Preset.from_dict(preset.to_dict())
        own = [d for d in self.presets if d.get("name") != checked.name]
        if len(own) >= MAX_LIST:
            raise SpecDeskError(f"there can be at most {MAX_LIST} presets of your own")
        self.presets = own + [checked.to_dict()]

    def delete_preset(self, name: str) -> None:
        """Remove a preset of the user's; a built-in preset stays (one of the user's that replaced
        it goes, and the built-in one shows again)."""
        own = [d for d in self.presets if d.get("name") != name]
        if len(own) == len(self.presets):
            builtin = any(p.name == name for p in BUILTIN_PRESETS)
            raise SpecDeskError(f"{name!r} is a built-in preset: it cannot be deleted" if builtin
                                else f"there is no preset named {name!r}")
        self.presets = own

    def remember_target(self, path: str, limit: int = 8) -> None:
        self.recent_targets = _remember(self.recent_targets, path, limit)

    def remember_draft(self, path: str, limit: int = 8) -> None:
        self.recent_drafts = _remember(self.recent_drafts, path, limit)


_OPTIONAL = {"draft_path", "last_chat_id"}


def _layers(value: str) -> None:
    from specdesk.engines.llama.placement import parse_gpu_layers

    parse_gpu_layers(value)


def _servers(value: str) -> None:
    from specdesk.engines.llama.rpc import parse_endpoints

    parse_endpoints(value)


PLACEMENT_CHECKS = {"gpu_layers": _layers, "draft_gpu_layers": _layers, "rpc_servers": _servers}


def _acceptable(name: str, value: Any, default: Any) -> bool:
    if value is None:
        return name in _OPTIONAL
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if name in RANGES:
        low, high = RANGES[name]
        number_types = (int, float) if isinstance(default, float) else (int,)
        # NaN fails both comparisons: refused, never clamped to a bound.
        return isinstance(value, number_types) and not (isinstance(value, float) and math.isnan(value)) \
            and low <= value <= high
    if name in CHOICES:
        return value in CHOICES[name]
    if name in PLACEMENT_CHECKS:
        if not _is_text(value) or len(value) > 1000:
            return False
        try:
            PLACEMENT_CHECKS[name](value)
        except SpecDeskError:
            return False
        return True
    if name == "presets":
        return isinstance(value, list) and len(value) <= MAX_LIST and all(_is_preset(v) for v in value)
    if isinstance(default, list):
        return isinstance(value, list) and len(value) <= MAX_LIST and all(_is_text(v) for v in value)
    if isinstance(default, dict):
        return isinstance(value, dict) and len(value) <= MAX_LIST and \
            all(_is_text(k) and isinstance(v, bool) for k, v in value.items())
    if isinstance(default, str) or default is None:  # paths, the compare prompt
        return _is_text(value)
    return isinstance(value, type(default))


def _is_preset(value: Any) -> bool:
    try:
        Preset.from_dict(value)
    except SpecDeskError:
        return False
    return True


def _is_text(value: Any) -> bool:
    """A string that can be a path or a prompt: bounded, no NUL, valid Unicode."""
    if not isinstance(value, str) or len(value) > MAX_TEXT or "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a \ud800 escape
        return False
    return True


def _remember(items: list, path: str, limit: int) -> list:
    return [path] + [p for p in items if p != path][: limit - 1]


def settings_path() -> Path:
    return config_dir() / SETTINGS_FILE


# A new user's first settings: sampled, as LM Studio's and llama-server's defaults are. Greedy
# decoding sends small models (the demo model first of all) into a line repeated thirty times;
# greedy stays a click away, and speculation is lossless either way.
FIRST_SAMPLING = {"temperature": 0.7, "top_p": 0.95}


def first_settings() -> Settings:
    return Settings(**FIRST_SAMPLING)


def load_settings(path: Optional[Path] = None) -> Settings:
    return read_settings(path)[0]


def read_settings(path: Optional[Path] = None) -> tuple[Settings, Optional[str]]:
    """The settings, and a one-line notice when the file was not used as it was (None if it was)."""
    path = Path(path) if path is not None else settings_path()
    try:
        data = _read_object(path)
    except FileNotFoundError:
        return first_settings(), None
    except _Unreadable as e:
        return Settings(), f"{path} {e}: SpecDesk starts with default settings; {_move_aside(path)}"
    settings, refused = Settings.checked(data)
    if not refused:
        return settings, None
    shown = ", ".join(f"{name} = {_short(data[name])}" for name in refused[:6]) + \
        (f", and {', '.join(refused[6:])}" if len(refused) > 6 else "")
    return settings, (f"{path} has values SpecDesk cannot use ({shown}): their defaults are used; "
                      f"{_move_aside(path)}")


class _Unreadable(Exception):
    """Why the settings file cannot be used at all (completes "<path> ...")."""


def _read_object(path: Path) -> dict:
    status = os.stat(path)  # stat first: a FIFO would block open() forever
    if not stat.S_ISREG(status.st_mode):
        raise _Unreadable("is not a regular file")
    if status.st_size > MAX_FILE_BYTES:
        raise _Unreadable(f"is larger than {MAX_FILE_BYTES // 2**20} MB")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise _Unreadable(f"cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise _Unreadable("is not UTF-8 text") from None
    except RecursionError:
        raise _Unreadable("is JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, and integers too long to convert
        raise _Unreadable(f"is not valid JSON ({getattr(e, 'msg', e)})") from None
    if not isinstance(data, dict):
        raise _Unreadable("is not a JSON object")
    return data


def _move_aside(path: Path) -> str:
    """Rename the file to a free `<name>.bad-<time>` name, so saving never overwrites it."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for attempt in range(100):
        aside = path.with_name(f"{path.name}.bad-{stamp}" + (f"-{attempt}" if attempt else ""))
        if aside.exists() or aside.is_symlink():
            continue
        try:
            os.rename(path, aside)
        except OSError as e:
            return f"it could not be moved aside ({e.strerror or e}) and will be replaced when settings are saved"
        return f"the file was kept as {aside.name}"
    return "it could not be moved aside and will be replaced when settings are saved"


def _short(value: Any, limit: int = 40) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def save_settings(settings: Settings, path: Optional[Path] = None) -> Path:
    """Write atomically (temp file + rename), so a crash never leaves half a file."""
    path = Path(path) if path is not None else settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    temporary.write_text(json.dumps(settings.to_dict(), indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, path)
    return path
