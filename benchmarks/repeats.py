"""Repeated compares summed up: each setting's median speedup and its spread over the runs.

The machine is shared and noisy, so a speedup is reported as the median of several runs with
their minimum and maximum beside it (the scripts in this folder import this module)."""

from __future__ import annotations

import statistics


def add_run(runs: dict[str, list[dict]], name: str, figures: dict) -> None:
    runs.setdefault(name, []).append(figures)


def summarize(runs: dict[str, list[dict]]) -> tuple[dict[str, dict], dict[str, str]]:
    """(per setting: median speedup, every run's speedup, spread, acceptance, identical in every run;
    per method: the setting with the best median)."""
    summary = {}
    for name, figures in runs.items():
        speedups = [f["speedup"] for f in figures]
        summary[name] = {**figures[0], "speedup": round(statistics.median(speedups), 4),
                         "speedups": speedups, "spread": [min(speedups), max(speedups)],
                         "identical_outputs": all(f["identical_outputs"] for f in figures)}
    best: dict[str, str] = {}
    for name, figures in summary.items():
        method = name.split(" k=")[0]
        if method not in best or figures["speedup"] > summary[best[method]]["speedup"]:
            best[method] = name
    return summary, best
