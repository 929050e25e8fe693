"""Where SpecDesk keeps things: shipped assets beside the code, user data per platformdirs."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import platformdirs

APP_NAME = "specdesk"


def assets_dir() -> Path:
    """The repository's (or the frozen bundle's) assets/ folder; SPECDESK_ASSETS_DIR overrides it."""
    if os.environ.get("SPECDESK_ASSETS_DIR"):
        return Path(os.environ["SPECDESK_ASSETS_DIR"])
    if getattr(sys, "frozen", False):
        return Path(getattr(sys, "_MEIPASS", Path(sys.executable).parent)) / "assets"
    return Path(__file__).resolve().parents[2] / "assets"


def cache_dir() -> Path:
    from specdesk.engines.files import cache_dir as engines_cache_dir  # one definition for both layers

    return engines_cache_dir()


def config_dir() -> Path:
    override = os.environ.get("SPECDESK_CONFIG_DIR")
    return Path(override) if override else Path(platformdirs.user_config_dir(APP_NAME))


def data_dir() -> Path:
    override = os.environ.get("SPECDESK_DATA_DIR")
    return Path(override) if override else Path(platformdirs.user_data_dir(APP_NAME))


@contextmanager
def building(folder: str | os.PathLike) -> Iterator[None]:
    """Hold the build lock of a cache folder: another process building the same folder (the
    window and `specdesk serve` on a first run, two test workers) waits for this one, then finds
    the files built instead of reading them half-written."""
    from filelock import FileLock

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder.parent / f".{folder.name}.lock")):
        yield


def hf_cache_dir() -> Path:
    """The hub cache every HF tool uses, from the same variables (read now, not at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.path.expandvars(os.path.expanduser(os.environ["HF_HUB_CACHE"])))
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.path.expanduser(os.environ["HF_HOME"]))) / "hub"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "huggingface" / "hub"
