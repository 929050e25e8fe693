"""What this machine measured: each compare and k sweep appends its speedup and acceptance
per target, draft, method and k to one JSON-lines file, so pairing can rank drafts by
measured numbers and call the rest assumptions.

The file never stops the app: a damaged line is skipped, an unwritable folder costs the
record, and only the newest MAX_RECORDS are read.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from .paths import data_dir

FILE_NAME = "measurements.jsonl"
MAX_FILE_BYTES = 8 * 2**20
MAX_RECORDS = 20_000


def measurements_file() -> Path:
    return data_dir() / FILE_NAME


def _real(path: Optional[str]) -> Optional[str]:
    return os.path.realpath(path) if path else None


def record(target: str, draft: Optional[str], engine: str, method: str, k: int, speedup: float,
           acceptance: float, tokens: int, temperature: float, path: Optional[Path] = None) -> None:
    """Append one measurement (a no-op when the folder cannot be written)."""
    line = {"target": _real(target), "draft": _real(draft), "engine": engine, "method": method, "k": k,
            "speedup": round(float(speedup), 4), "acceptance": round(float(acceptance), 4), "tokens": int(tokens),
            "temperature": temperature, "time": round(time.time())}
    path = path or measurements_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
    except OSError:
        pass


def record_compare(report, path: Optional[Path] = None) -> None:
    """One compare report (app/compare.CompareReport): its speedup and acceptance."""
    spec = report.speculative
    if spec.tokens and report.baseline.tokens:
        record(report.target, report.draft, report.engine, report.method, report.k, report.speedup,
               spec.acceptance_rate, spec.tokens, report.temperature, path)


def read(path: Optional[Path] = None) -> list[dict]:
    path = path or measurements_file()
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            with path.open("rb") as f:
                f.seek(-MAX_FILE_BYTES, os.SEEK_END)
                data = f.read().decode("utf-8", "replace").split("\n", 1)[-1]
        else:
            data = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    records = []
    for line in data.splitlines()[-MAX_RECORDS:]:
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and isinstance(item.get("speedup"), (int, float)) and isinstance(item.get("k"), int):
            records.append(item)
    return records


@dataclass(frozen=True)
class Measured:
    k: int
    speedup: float  # mean over the runs
    acceptance: float
    runs: int


def measured_for(target: str, draft: Optional[str], method: str = "draft",
                 records: Optional[Iterable[dict]] = None) -> Optional[Measured]:
    """The best k this machine measured for a target and draft (and method), or None."""
    by_k: dict[int, list[dict]] = defaultdict(list)
    target, draft = _real(target), _real(draft)
    for item in read() if records is None else records:
        if item.get("target") == target and item.get("draft") == draft and item.get("method") == method:
            by_k[item["k"]].append(item)
    if not by_k:
        return None
    summaries = [Measured(k, sum(i["speedup"] for i in items) / len(items),
                          sum(float(i.get("acceptance", 0.0)) for i in items) / len(items), len(items))
                 for k, items in by_k.items()]
    return max(summaries, key=lambda m: (m.speedup, -m.k))
