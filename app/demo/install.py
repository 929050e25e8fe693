"""Build the demo family's usable files: a widened target and the draft, as GGUF and HF.

Trained weights come from assets/demo/ (the full family) or assets/demo-small/ (the small
family the tests use), both shipped and verified by hash, so every machine runs identical
weights; `retrain` runs the recipe here instead. Everything else is derived in seconds and cached under
cache_dir()/demo/<recipe key>/, with a manifest of sha256 and size per file: a reused file
is checked first, and anything missing, truncated or corrupt is rebuilt, never loaded.

Deriving needs numpy only, so a shipped family installs without torch; training (retrain)
needs the optional `torch` extra.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Callable

from specdesk.engines.types import SpecDeskError

from ..storage.paths import assets_dir, building, cache_dir
from .export_hf import require_torch, write_json_atomic, write_text_atomic
from .files import NATIVE_DRAFTER_FILES, TRAINED_FILES, load_float32, sha256_file

EXPORT_VERSION = 2  # bump when derived files change for the same trained weights (2: numpy widening)
WIDEN_SEED = 0
MANIFEST = "manifest.json"

# Derived units, in build order; a unit is rebuilt when one of its files is bad or a unit it
# is derived from was rebuilt.
UNITS: dict[str, tuple[str, ...]] = {
    "card": (),
    "core_hf": (),
    "target_hf": (),
    "draft_hf": (),
    "target_gguf": ("target_hf",),
    "draft_gguf": ("draft_hf",),
    "dflash_hf": (),
    "eagle3_hf": ("target_hf",),  # its lm_head is the widened target's
    "dspark_hf": (),
}
UNIT_PATHS = {
    "card": "card.json",
    "core_hf": "core-hf",
    "target_hf": "target-hf",
    "draft_hf": "draft-hf",
    "target_gguf": "specdesk-demo-target-F16.gguf",
    "draft_gguf": "specdesk-demo-draft-F16.gguf",
    "dflash_hf": "dflash-hf",
    "eagle3_hf": "eagle3-hf",
    "dspark_hf": "dspark-hf",
}

Progress = Callable[[str], None]


def _quiet(message: str) -> None:
    pass


def shipped_folder(small: bool = False) -> Path:
    """Where the trained weights of the shipped full (or small) family live."""
    return assets_dir() / ("demo-small" if small else "demo")


def verify_trained(folder: Path, shipped: bool = False) -> dict:
    """Check a trained family folder against its card.json; returns the card."""
    if shipped:
        remedy = ("reinstall SpecDesk, or train the family here with `specdesk demo build --retrain` "
                  "(add `--small` for the small test family)")
    else:
        remedy = f"delete {folder} and build again"
    card_path = folder / "card.json"
    if not card_path.is_file():
        raise SpecDeskError(f"no trained demo family in {folder} (card.json is missing): {remedy}")
    try:
        card = json.loads(card_path.read_text(encoding="utf-8"))
        expected_hashes = card["files"]
        if not isinstance(expected_hashes, dict):
            raise TypeError("'files' is not a mapping")
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise SpecDeskError(f"{card_path} is not a valid demo family card ({e}): {remedy}") from e
    for name in trained_files(card):
        path = folder / name
        if not path.is_file():
            raise SpecDeskError(f"{path} is missing: {remedy}")
        actual = sha256_file(path)
        if actual != expected_hashes.get(name):
            raise SpecDeskError(f"{path} is damaged: its sha256 is {actual[:16]}…, card.json says "
                                f"{str(expected_hashes.get(name))[:16]}…; {remedy}")
    return card


def trained_files(card: dict) -> tuple[str, ...]:
    """The trained files a card vouches for: a family trained before the native drafters has none of theirs."""
    return tuple(n for n in TRAINED_FILES if n not in NATIVE_DRAFTER_FILES.values()
                 or any(card.get(role) and n == f for role, f in NATIVE_DRAFTER_FILES.items()))


def units_for(card: dict) -> list[str]:
    drafters = {f"{m}_hf": m for m in NATIVE_DRAFTER_FILES if f"{m}_hf" in UNIT_PATHS}  # present when the card has them
    return [u for u in UNITS if u not in drafters or card.get(drafters[u])]


def _train(small: bool, retrain: bool, progress: Progress) -> tuple[Path, dict]:
    require_torch("training the demo family")
    from .recipe import FULL, SMALL, train_family

    spec = SMALL if small else FULL
    workdir = cache_dir() / "demo-train" / spec.key()
    if (workdir / "card.json").exists():
        if not retrain:
            try:
                card = verify_trained(workdir)
                progress(f"reusing the {spec.name} family trained in {workdir}")
                return workdir, card
            except SpecDeskError as e:
                progress(f"training again: {e}")
        # A finished (or damaged) run starts over; an unfinished one has no card.json yet and
        # resumes from its checkpoints.
        for name in (*TRAINED_FILES, "card.json", "core.ckpt", "draft.ckpt"):
            (workdir / name).unlink(missing_ok=True)

    def report(stage: str, done: int, total: int, loss: float) -> None:
        if done == total or done % max(1, total // 10) == 0:
            progress(f"training {spec.name} {stage}: step {done}/{total}, loss {loss:.3f}")

    progress(f"training the {spec.name} demo family into {workdir}")
    train_family(spec, workdir, progress=report)
    return workdir, verify_trained(workdir)


def _file_ok(path: Path, record: dict) -> bool:
    return path.is_file() and path.stat().st_size == record.get("size") and sha256_file(path) == record.get("sha256")


def _records(out: Path, unit_path: Path) -> dict[str, dict]:
    files = sorted(p for p in unit_path.iterdir() if p.is_file()) if unit_path.is_dir() else [unit_path]
    return {p.relative_to(out).as_posix(): {"sha256": sha256_file(p), "size": p.stat().st_size} for p in files}


def _verified_units(out: Path, manifest: dict, progress: Progress) -> set[str]:
    good = set()
    for unit, files in manifest.get("units", {}).items():
        bad = [rel for rel, record in files.items() if not _file_ok(out / rel, record)]
        if bad or not files:
            progress(f"rebuilding {unit}: {', '.join(bad) or 'no files'} missing, truncated or corrupt")
        else:
            good.add(unit)
    return good


def _derive(trained: Path, card: dict, out: Path, progress: Progress) -> None:
    manifest_path = out / MANIFEST
    # The card itself is part of the identity: a retrained family with the same weights but
    # new figures (loss curve, timings) must not keep serving the old card.
    card_digest = hashlib.sha256(json.dumps(card, sort_keys=True).encode()).hexdigest()
    identity = {"export_version": EXPORT_VERSION, "recipe_key": card["recipe_key"], "sources": card["files"],
                "card_sha256": card_digest}
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        manifest = {}
    if not isinstance(manifest, dict):
        manifest = {}
    if manifest and all(manifest.get(k) == v for k, v in identity.items()):
        good = _verified_units(out, manifest, progress)
    else:
        if manifest:
            progress("the trained family or exporter changed: rebuilding all derived files")
        good = set()
    todo = [u for u in units_for(card) if u not in good]
    for unit in units_for(card):  # UNITS is in build order, so dependencies are decided first
        if unit not in todo and any(dep in todo for dep in UNITS[unit]):
            todo.append(unit)
    if not todo:
        progress(f"demo family ready in {out} (verified)")
        return

    # The manifest goes first: a crash mid-build must not leave one vouching for old files.
    manifest_path.unlink(missing_ok=True)
    for stale in out.rglob("*.tmp-*"):  # left by a killed build
        stale.unlink(missing_ok=True)
    units = {u: files for u, files in manifest.get("units", {}).items() if u in good}
    for unit in units_for(card):
        if unit in todo:
            progress(f"building {UNIT_PATHS[unit]}")
            _build_unit(unit, trained, card, out)
            units[unit] = _records(out, out / UNIT_PATHS[unit])
    write_json_atomic(manifest_path, {**identity, "units": units})
    progress(f"demo family ready in {out}")


def _build_unit(unit: str, trained: Path, card: dict, out: Path) -> None:
    from .config import from_card
    from .export_gguf import export_gguf
    from .export_hf import export_hf
    from .widen import widen

    target = out / UNIT_PATHS[unit]
    if unit == "card":
        write_text_atomic(target, json.dumps(card, indent=2) + "\n")
    elif unit == "dflash_hf":
        from .dflash import export_dflash_hf

        export_dflash_hf(trained, card, target)
    elif unit == "eagle3_hf":
        from .eagle3 import export_eagle3_hf

        export_eagle3_hf(trained, card, out / UNIT_PATHS["target_hf"], target)
    elif unit == "dspark_hf":
        from .dspark import export_dspark_hf

        export_dspark_hf(trained, card, target)
    elif unit.endswith("_gguf"):
        role = unit.removesuffix("_gguf")
        export_gguf(out / UNIT_PATHS[f"{role}_hf"], target, f"SpecDesk demo {role} ({card['family']})")
    else:
        role = "draft" if unit == "draft_hf" else "core"
        config = core_config = from_card(card[role]["config"])
        state = load_float32(trained / f"{role}.safetensors")
        if unit == "target_hf":
            wide = card["wide"]
            config, state = widen(config, state, wide["hidden_size"], wide["num_attention_heads"],
                                  wide["intermediate_size"], seed=WIDEN_SEED)
        if target.is_dir():
            shutil.rmtree(target)
        export_hf(config, state, trained / "tokenizer.json", card["chat_template"], target)
        if unit == "target_hf":  # the MTP layer lives inside the target's checkpoint, as real ones do
            from . import mtp

            if card.get(mtp.METHOD):
                mtp.add_mtp_shard(target, trained, card, core_config, config, seed=WIDEN_SEED)


def build_family(
    small: bool = False,
    retrain: bool = False,
    out: Path | None = None,
    progress: Progress | None = None,
) -> dict[str, str]:
    """Make the demo family usable; returns role -> absolute path.

    Roles: target_gguf, draft_gguf, target_hf (with an MTP layer), draft_hf, core_hf, dflash_hf, eagle3_hf, dspark_hf
    (HF folders; the last three where the family has them),
    tokenizer (tokenizer.json), card (card.json).
    Trained weights come from assets/ (the default, which takes seconds: the full family, or
    the small one the tests use) or from running the recipe here (`retrain`).
    """
    progress = progress or _quiet
    if small and not retrain and not (shipped_folder(small=True) / "card.json").is_file():
        # The installers leave the small (test) family out: train it here, as before it shipped.
        progress(f"no shipped small demo family in {shipped_folder(small=True)}: training it here")
        trained, card = _train(small, False, progress)
    elif retrain:
        trained, card = _train(small, retrain, progress)
    else:
        trained = shipped_folder(small)
        progress(f"verifying the shipped {'small ' if small else ''}demo family in {trained}")
        card = verify_trained(trained, shipped=True)
    out = Path(out) if out is not None else cache_dir() / "demo" / card["recipe_key"]
    with building(out):
        _derive(trained, card, out, progress)
    roles = {unit: out / UNIT_PATHS[unit] for unit in units_for(card)}
    roles["tokenizer"] = roles["target_hf"] / "tokenizer.json"
    return {role: str(path.resolve()) for role, path in roles.items()}


if __name__ == "__main__":
    import argparse
    import sys

    parser = argparse.ArgumentParser(description="Build the SpecDesk demo model family")
    parser.add_argument("--small", action="store_true", help="the small test family instead of the full one")
    parser.add_argument("--retrain", action="store_true", help="train the recipe here instead of using assets/")
    parser.add_argument("--out", type=Path, help="output folder (default: the cache)")
    args = parser.parse_args()
    try:
        paths = build_family(args.small, args.retrain, args.out, progress=lambda m: print(m, file=sys.stderr))
    except SpecDeskError as e:
        sys.exit(f"error: {e}")
    print(json.dumps(paths, indent=2))
