"""The first-run suggestion: a real target and draft pair sized to this machine (assets/curated_models.json)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from specdesk.engines.types import SpecDeskError

from ..storage.paths import assets_dir


@dataclass(frozen=True)
class HubFile:
    repo: str
    file: str
    bytes: int


@dataclass(frozen=True)
class SuggestedPair:
    name: str
    target: HubFile
    draft: HubFile
    good_for: str
    overhead_bytes: int

    @property
    def total_bytes(self) -> int:
        """What the pair needs to run: both files, the context and the app."""
        return self.target.bytes + self.draft.bytes + self.overhead_bytes

    @property
    def download_bytes(self) -> int:
        return self.target.bytes + self.draft.bytes


def load_pairs(path: Optional[Path] = None) -> list[SuggestedPair]:
    path = Path(path) if path is not None else assets_dir() / "curated_models.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        overhead = int(data["overhead_bytes"])
        return [SuggestedPair(p["name"], HubFile(**p["target"]), HubFile(**p["draft"]), p["good_for"], overhead)
                for p in data["pairs"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SpecDeskError(f"{path}: not a valid list of suggested models ({e})") from e


def suggest(memory_bytes: int, pairs: Optional[list[SuggestedPair]] = None) -> Optional[SuggestedPair]:
    """The largest pair that fits in `memory_bytes` (the RAM or GPU memory it would run from), or None."""
    pairs = load_pairs() if pairs is None else pairs
    fitting = [p for p in pairs if p.total_bytes <= memory_bytes]
    return max(fitting, key=lambda p: p.target.bytes) if fitting else None


def run_memory() -> tuple[int, str]:
    """Where a suggested pair would run and how much memory it may take there: the largest GPU
    llama.cpp can use, else half this machine's RAM (the rest stays with the system and other
    programs, and a model twice the size would answer too slowly on a CPU to be a good first chat)."""
    from specdesk.engines.llama.devices import llama_devices
    from specdesk.engines.memory import available_memory

    try:
        gpus = [d for d in llama_devices() if d.kind in ("gpu", "igpu") and d.total_bytes]
    except Exception:  # a llama.cpp that cannot list devices: plan on the RAM
        gpus = []
    if gpus:
        best = max(gpus, key=lambda d: d.total_bytes)
        return int(best.total_bytes), best.description or best.name
    return int(available_memory().ram_total) // 2, "RAM"
