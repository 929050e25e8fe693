"""Adopt only what pays: a trained drafter against the best method the target already has.

Both are measured with the compare runner (app/runtime/compare.py) on held-out prompts,
greedy; the drafter is adopted when its speedup beats every existing method and plain
decoding, and its output is the baseline's. The decision and its figures are written as
provenance beside the drafter (app/models/provenance.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from specdesk.engines.methods import method_info, rivals
from specdesk.engines.types import SamplingParams, SpecConfig

PLAIN = "plain decoding"


@dataclass(frozen=True)
class Measured:
    label: str
    speedup: float
    identical: Optional[bool]
    acceptance_rate: Optional[float]
    per_position: tuple[float, ...] = ()
    spread: float = 0.0  # half the range of the repeated runs' speedups
    beyond_noise: bool = True  # 1.0x lies outside the spread (compare.beyond_noise)

    def to_json(self) -> dict:
        return {"speedup": round(self.speedup, 3), "spread": round(self.spread, 3), "beyond_noise": self.beyond_noise,
                "identical_outputs": self.identical,
                "acceptance_rate": None if self.acceptance_rate is None else round(self.acceptance_rate, 4),
                "acceptance_per_position": [round(a, 4) for a in self.per_position]}


def decide(trained: Measured, existing: Sequence[Measured]) -> tuple[bool, str]:
    """(adopted, reason): adopted only above the best existing method and plain decoding (1.00x),
    by more than the noise of its own runs, and only with output identical to the baseline."""
    best = max([Measured(PLAIN, 1.0, True, None), *existing], key=lambda m: m.speedup)
    figure = f"{trained.label}: {trained.speedup:.2f}x"
    if trained.identical is False:
        return False, f"{figure}, but its greedy output differs from the baseline's"
    if trained.speedup > best.speedup and not trained.beyond_noise:
        return False, f"{figure}, within the noise of plain decoding (± {trained.spread:.2f})"
    if trained.speedup > best.speedup:
        return True, f"{figure}, above {best.label} {best.speedup:.2f}x"
    return False, f"{figure}, below {best.label} {best.speedup:.2f}x"


def existing_methods(engine, k: int, draft: Optional[str] = None) -> list[tuple[str, SpecConfig]]:
    """What the target can already do without the trained drafter (the table's rivals): those
    that need no file where it can run them (n-gram, its own MTP layers), a draft model when one
    is named. Each is labelled with its row's short name ("n-gram", "MTP", "draft model")."""
    availability = engine.method_availability()
    methods = []
    for name in sorted(rivals(), key=lambda name: method_info(name).uses_file):  # a named file's last
        info = method_info(name)
        if info.uses_file and draft:
            methods.append((info.short, SpecConfig(method=name, k=k, draft_path=str(draft))))
        elif not info.uses_file and availability.get(name) is None:
            methods.append((info.short, SpecConfig(method=name, k=k)))
    return methods


def measure(engine, label: str, spec: SpecConfig, prompts: Sequence[str], tokenize: Callable[[str], list[int]],
            max_tokens: int) -> Measured:
    from specdesk.app.runtime.compare import compare

    report = compare(engine, list(prompts), spec, SamplingParams(temperature=0.0), max_tokens, tokenize)
    stats = report.speculative
    return Measured(label, report.speedup, report.identical_outputs, stats.acceptance_rate,
                    tuple(stats.per_position_acceptance), report.speedup_measure.spread, report.beyond_noise)
