"""What this machine measured: each compare and k sweep appends its speedup and acceptance
per target, draft, method and k to one JSON-lines file, so pairing can rank drafts by
measured numbers and call the rest assumptions. A compare or sweep point runs several times
(app/runtime/compare.Repeats): its line keeps the median ("speedup"), the spread and each
run's speedup ("values"), and pairing takes the median over all the runs measured for a k. Each chat reply appends its acceptance and
tokens per second too (`record_chat`, "kind": "chat"): a reply has no baseline beside it, so
its line has no speedup ("speedup": null) and pairing's speedups never include it; a reply
of method auto also says what each method it chose drafted and had accepted.

The file never stops the app: a damaged line is skipped, an unwritable folder costs the
record, and only the newest MAX_RECORDS are read.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from specdesk.engines.methods import METHODS
from specdesk.engines.speculation.chooser import implausible_size

from .measure import Measure
from ..storage.paths import data_dir

FILE_NAME = "measurements.jsonl"
MAX_FILE_BYTES = 8 * 2**20
MAX_RECORDS = 20_000
MAX_POOLED_RUNS = 15  # the newest runs of a target, draft, method and k that its median is taken over


def measurements_file() -> Path:
    return data_dir() / FILE_NAME


def _real(path: Optional[str]) -> Optional[str]:
    return os.path.realpath(path) if path else None


def record(target: str, draft: Optional[str], engine: str, method: str, k: int, speedup: float,
           acceptance: float, tokens: int, temperature: float, path: Optional[Path] = None,
           placement: str = "CPU", values: tuple[float, ...] = ()) -> None:
    """Append one measurement (a no-op when the folder cannot be written): `speedup` is the
    median of the runs' `values` where it ran several times. `placement` is where the target
    sat (app/runtime/placement.placement_label): a speedup belongs to its placement."""
    line = {"target": _real(target), "draft": _real(draft), "engine": engine, "method": method, "k": k,
            "speedup": round(float(speedup), 4), "acceptance": round(float(acceptance), 4), "tokens": int(tokens),
            "temperature": temperature, "time": round(time.time()), "placement": placement}
    if len(values) > 1:
        line.update(runs=len(values), spread=round((max(values) - min(values)) / 2, 4),
                    values=[round(float(v), 4) for v in values])
    _append(line, path)


def _append(line: dict, path: Optional[Path]) -> None:
    path = path or measurements_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
    except OSError:
        pass


def record_compare(report, path: Optional[Path] = None, placement: str = "CPU") -> None:
    """One compare report (app/runtime/compare.CompareReport): its speedup and acceptance, on `placement`;
    with method auto, the pass costs it measured too."""
    spec = report.speculative
    if spec.tokens and report.baseline.tokens:
        speedup = report.speedup_measure
        record(report.target, report.draft, report.engine, report.method, report.k, speedup.median,
               spec.acceptance_rate, spec.tokens, report.temperature, path, placement, speedup.values)
    if report.method == "auto":
        record_pass_costs(report.target, report.engine, report.auto_report().get("costs"), path, placement)


def record_pass_costs(target: str, engine: str, costs: Optional[dict], path: Optional[Path] = None,
                      placement: str = "CPU") -> None:
    """What a pass over 1..K+1 tokens of `target` costs on this machine and placement (auto's
    cost model, CostModel.describe()), so pairing can say why speculation pays here or not."""
    pass_ms = (costs or {}).get("pass_ms")
    if not pass_ms or len(pass_ms) < 2 or not all(isinstance(t, (int, float)) and t > 0 for t in pass_ms):
        return
    if implausible_size(pass_ms) is not None:
        return  # a busy moment, not this machine's arithmetic: pairing would quote it as the machine's
    _append({"kind": "pass_cost", "target": _real(target), "engine": engine, "placement": placement,
             "pass_ms": [round(float(t), 4) for t in pass_ms], "time": round(time.time())}, path)


def pass_costs_for(target: str, placement: Optional[str] = None,
                   records: Optional[Iterable[dict]] = None) -> Optional[list[float]]:
    """The newest plausible pass costs (ms for 1..K+1 tokens) measured for `target` (on
    `placement`), or None."""
    target = _real(target)
    found = [item for item in (read(pass_costs=True) if records is None else records)
             if item.get("kind") == "pass_cost" and item.get("target") == target
             and (placement is None or item.get("placement", "CPU") == placement)
             and implausible_size(item.get("pass_ms") or [0]) is None]
    return list(found[-1]["pass_ms"]) if found else None


def record_sweep(target: str, engine: str, spec, points, temperature: float, path: Optional[Path] = None,
                 placement: str = "CPU") -> None:
    """The points of a k sweep (app/runtime/compare.SweepPoint, `spec` its SpecConfig): each k's
    median speedup over its runs, and the runs' speedups."""
    for point in points:
        if point.speedup is not None and point.speedup.runs and point.stats.tokens:
            record(target, spec.draft_path, engine, spec.method, point.k, point.speedup.median,
                   point.stats.acceptance_rate, point.stats.tokens, temperature, path, placement,
                   point.speedup.values)


def on_placement(records: Iterable[dict], placement: str) -> list[dict]:
    """The records measured on `placement` (older records, written before placements, are "CPU")."""
    return [r for r in records if r.get("placement", "CPU") == placement]


def drafts_from_file(method: str) -> bool:
    """The method's drafts come from the draft file (engines/methods.py): a chat with any other
    method is not the draft's. A name no longer in the table (an older record) is not."""
    info = METHODS.get(method)
    return info is not None and info.uses_file


class MethodTally:
    """Per method, what one reply's steps drafted: an on_event callback over its StepEvents.
    A step of method auto names the method it chose (StepEvent.method); any other step counts
    under the run's own method."""

    def __init__(self, method: str):
        self.method = method
        self.by_method: dict[str, dict[str, int]] = {}

    def __call__(self, event) -> None:
        method = event.method or self.method
        counts = self.by_method.setdefault(method, {"passes": 0, "drafted": 0, "accepted": 0, "tokens": 0})
        counts["passes"] += 1
        counts["drafted"] += event.drafted
        counts["accepted"] += event.accepted
        counts["tokens"] += len(event.tokens)


def record_chat(target: str, draft: Optional[str], engine: str, method: str, k: int, stats, temperature: float,
                tally: Optional[MethodTally] = None, path: Optional[Path] = None) -> None:
    """One chat reply (`stats`: its RunStats): acceptance and tokens per second as measured,
    no speedup (nothing ran beside it to compare with). With method auto, `tally` adds what
    each chosen method drafted and had accepted ("methods"). A reply without tokens is not
    recorded."""
    if not stats.tokens:
        return
    line = {"kind": "chat", "target": _real(target),
            "draft": _real(draft) if drafts_from_file(method) else None, "engine": engine,
            "method": method, "k": int(k) if method != "none" else 0, "speedup": None,
            "acceptance": round(float(stats.acceptance_rate), 4), "drafted": int(stats.drafted),
            "tok_per_s": round(float(stats.tok_per_s), 3), "tokens": int(stats.tokens), "passes": int(stats.passes),
            "temperature": temperature, "time": round(time.time())}
    if method == "auto" and tally is not None:
        line["methods"] = {m: {**c, "acceptance": round(c["accepted"] / c["drafted"], 4) if c["drafted"] else None}
                           for m, c in sorted(tally.by_method.items())}
    _append(line, path)


def _usable(item) -> bool:
    """A measured speedup (compare, sweep), or a chat reply's tokens per second."""
    if isinstance(item, dict) and item.get("kind") == "pass_cost":
        return isinstance(item.get("pass_ms"), list) and len(item["pass_ms"]) >= 2 and all(
            isinstance(t, (int, float)) and t > 0 for t in item["pass_ms"])
    if not isinstance(item, dict) or not isinstance(item.get("k"), int):
        return False
    if item.get("kind") == "chat":
        return isinstance(item.get("tok_per_s"), (int, float)) and isinstance(item.get("acceptance"), (int, float))
    return isinstance(item.get("speedup"), (int, float))


def read(path: Optional[Path] = None, pass_costs: bool = False) -> list[dict]:
    """The usable records: speedups and chat replies, or (`pass_costs`) the pass costs alone."""
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
        if _usable(item) and (item.get("kind") == "pass_cost") == pass_costs:
            records.append(item)
    return records


@dataclass(frozen=True)
class Measured:
    k: int
    speedup: float  # the median over the runs
    acceptance: float
    runs: int
    spread: float = 0.0  # half the range of the runs' speedups
    values: tuple[float, ...] = ()  # each run's speedup

    @property
    def measure(self) -> Measure:
        return Measure(self.speedup, self.spread, self.runs, self.values)


def run_speedups(item: dict) -> list[float]:
    """Each run's speedup in one record: its "values", or its one speedup (a single run, or a
    record written before runs were repeated)."""
    values = item.get("values")
    if isinstance(values, list) and values and all(isinstance(v, (int, float)) for v in values):
        return [float(v) for v in values]
    return [float(item["speedup"])]


def measured_for(target: str, draft: Optional[str], method: str = "draft",
                 records: Optional[Iterable[dict]] = None) -> Optional[Measured]:
    """The best k this machine measured for a target and draft (and method), or None: per k,
    the median of the newest MAX_POOLED_RUNS runs; chat replies measured no speedup and do not count."""
    by_k: dict[int, list[dict]] = defaultdict(list)
    target, draft = _real(target), _real(draft)
    for item in read() if records is None else records:
        if (item.get("target") == target and item.get("draft") == draft and item.get("method") == method
                and isinstance(item.get("speedup"), (int, float))):
            by_k[item["k"]].append(item)
    if not by_k:
        return None
    summaries = []
    for k, items in by_k.items():
        runs = [v for item in items for v in run_speedups(item)][-MAX_POOLED_RUNS:]
        summaries.append(Measured(k, statistics.median(runs),
                                  sum(float(i.get("acceptance", 0.0)) for i in items) / len(items), len(runs),
                                  (max(runs) - min(runs)) / 2, tuple(runs)))
    return max(summaries, key=lambda m: (m.speedup, -m.k))


@dataclass(frozen=True)
class ChatMeasured:
    replies: int
    tokens: int
    tok_per_s: float  # over all the replies' tokens (tokens / decode seconds)
    acceptance: Optional[float]  # accepted / drafted over the replies; None when nothing was drafted


def chat_measured_for(target: str, draft: Optional[str], method: str,
                      records: Optional[Iterable[dict]] = None) -> Optional[ChatMeasured]:
    """What chat replies measured for a target, draft and method on this machine, or None."""
    target, draft = _real(target), _real(draft)
    if not drafts_from_file(method):
        draft = None
    items = [i for i in (read() if records is None else records)
             if i.get("kind") == "chat" and i.get("target") == target and i.get("draft") == draft
             and i.get("method") == method]
    if not items:
        return None
    tokens = sum(int(i.get("tokens", 0)) for i in items)
    timed = [i for i in items if i["tok_per_s"] > 0]  # the rate counts only replies that were timed
    seconds = sum(int(i.get("tokens", 0)) / i["tok_per_s"] for i in timed)
    timed_tokens = sum(int(i.get("tokens", 0)) for i in timed)
    drafted = sum(int(i.get("drafted", 0)) for i in items)
    accepted = sum(float(i["acceptance"]) * int(i.get("drafted", 0)) for i in items)
    return ChatMeasured(len(items), tokens, timed_tokens / seconds if seconds > 0 else 0.0,
                        accepted / drafted if drafted else None)
