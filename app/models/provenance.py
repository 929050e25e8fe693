"""What train-drafter says about a drafter trained here: the provenance.json beside it, with the
measured verdict (app/training/adopt.py decides it), which the library, pairing and choose read."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

PROVENANCE = "provenance.json"


def read_provenance(drafter_path) -> Optional[dict]:
    """What train-drafter wrote about a drafter trained here, or None for any other drafter: the
    provenance.json beside it (<out>/<method>, <out>/<method>-F16.gguf, <out>/target-mtp-F16.gguf;
    a draft model: <out>/draft, <out>/draft-F16.gguf) that names this very file or folder. A damaged
    record counts as none."""
    path = Path(drafter_path)
    try:
        record = json.loads((path.parent / PROVENANCE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("adopted"), bool):
        return None
    real = os.path.realpath(path)
    if not any(isinstance(named, str) and os.path.realpath(named) == real
               for named in (record.get("drafter"), record.get("gguf"))):
        return None
    return record


def provenance_line(record: dict) -> str:
    """One line for the library and pairing: when it was trained here, and the verdict with its figures."""
    when = str(record.get("trained_at", ""))[:10]
    verdict = "adopted" if record["adopted"] else "kept, not adopted"
    return f"trained here{' ' + when if when else ''}, {verdict}: {record.get('reason', '')}"


def write_provenance(folder: Path, record: dict) -> Path:
    path = folder / PROVENANCE
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path
