"""The first-run suggestion: a real target and draft pair sized to this machine (assets/curated_models.json).

Memory says what fits; speed says what is worth it. Decoding one token on a CPU reads every
weight of the target once, so its pace is about the memory's read speed over the model's size:
`read_speed` measures that speed here (a few hundred milliseconds, on as many threads as
llama.cpp would use), and `suggest` takes the largest pair that fits and is expected to answer
at least MIN_TOKENS_PER_S; where none would, the smallest that fits, with its estimate said.
On a GPU the memory is the limit (its reads are an order of magnitude faster) and no speed is
estimated.
"""

from __future__ import annotations

import json
import os
import threading
import time
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


MIN_TOKENS_PER_S = 8.0  # a first chat that streams faster than one reads
# The share of the memory's read speed a CPU decode reaches: llama.cpp's quantized kernels and
# its threads' sync keep it below what a plain sum over an array gets.
DECODE_EFFICIENCY = 0.75
READ_TEST_BYTES = 256 * 2**20  # larger than any CPU cache, so the test reads memory


def estimated_tokens_per_s(pair: SuggestedPair, read_bytes_per_s: float) -> float:
    """Tokens a second the pair's target would decode here without speculation: its weights
    read once per token at the share of the read speed a decode reaches."""
    return DECODE_EFFICIENCY * read_bytes_per_s / max(1, pair.target.bytes)


def suggest(memory_bytes: int, pairs: Optional[list[SuggestedPair]] = None,
            read_bytes_per_s: Optional[float] = None) -> Optional[SuggestedPair]:
    """The largest pair that fits in `memory_bytes` (the RAM or GPU memory it would run from)
    and, with `read_bytes_per_s` (a CPU's measured read speed), is expected to decode at least
    MIN_TOKENS_PER_S; if none is that quick, the smallest that fits; None when none fits."""
    pairs = load_pairs() if pairs is None else pairs
    fitting = [p for p in pairs if p.total_bytes <= memory_bytes]
    if not fitting:
        return None
    if read_bytes_per_s is None:
        return max(fitting, key=lambda p: p.target.bytes)
    quick = [p for p in fitting if estimated_tokens_per_s(p, read_bytes_per_s) >= MIN_TOKENS_PER_S]
    if quick:
        return max(quick, key=lambda p: p.target.bytes)
    return min(fitting, key=lambda p: p.target.bytes)


def read_speed(threads: Optional[int] = None, total_bytes: int = READ_TEST_BYTES, repeats: int = 3) -> float:
    """Bytes a second this machine reads from memory on `threads` threads at once (default:
    as many as llama.cpp uses, the cores up to 8): the best of `repeats` sums over arrays
    larger than the caches (numpy releases the GIL while it sums)."""
    import numpy as np

    threads = threads or max(1, min(os.cpu_count() or 1, 8))
    count = max(1, total_bytes // threads // 8)
    arrays = [np.ones(count) for _ in range(threads)]
    best = 0.0
    for _ in range(repeats):
        start = threading.Barrier(threads + 1)

        def read(array) -> None:
            start.wait()
            array.sum()

        workers = [threading.Thread(target=read, args=(a,), daemon=True) for a in arrays]
        for worker in workers:
            worker.start()
        start.wait()
        began = time.perf_counter()
        for worker in workers:
            worker.join()
        best = max(best, count * 8 * threads / max(1e-9, time.perf_counter() - began))
    return best


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
