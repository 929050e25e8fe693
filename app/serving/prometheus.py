"""Prometheus text exposition, as servers answer /metrics, and counter deltas around a reply."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from .transport import EndpointError

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(\s+-?\d+)?\s*$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?\s*')


@dataclass(frozen=True)
class MetricSamples:
    """One scrape: (name, labels) -> value."""

    values: dict

    def total(self, name: str) -> Optional[float]:
        found = [v for (n, _), v in self.values.items() if n == name]
        return sum(found) if found else None

    def by_label(self, name: str, label: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for (n, labels), v in self.values.items():
            if n == name and label in dict(labels):
                key = dict(labels)[label]
                out[key] = out.get(key, 0.0) + v
        return out


def parse_metrics(text: str, source: str) -> MetricSamples:
    """Prometheus text exposition; a line that is not a sample or a comment is named."""
    values = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        value = None
        if match:
            try:
                value = float(match.group(3))
            except ValueError:
                value = None
        if value is None:
            raise EndpointError(f"{source}, line {number}: not Prometheus text ({line[:60]!r})")
        labels_text = (match.group(2) or "{}")[1:-1]
        labels = tuple(sorted((k, v) for k, v in LABEL.findall(labels_text)))
        values[(match.group(1), labels)] = values.get((match.group(1), labels), 0.0) + value
    return MetricSamples(values)


def delta(after: MetricSamples, before: MetricSamples, name: str) -> Optional[float]:
    now = after.total(name)
    return None if now is None else now - (before.total(name) or 0.0)
