""""Use this model": the draft that goes with a target, chosen as pairing ranks them, so that
loading a model never starts with an incompatible draft left over from the one before."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Iterable, Optional

from specdesk.engines.methods import is_in_target
from specdesk.engines.types import SpecDeskError

from .library import ModelEntry, find_entry, read_model

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UseChoice:
    target: str
    draft: Optional[str]  # a draft model or a drafter file; None: Auto drafts without one
    why: str  # one line for the status bar: what goes with the target and on what grounds


def _same(a: Optional[str], b: Optional[str]) -> bool:
    return bool(a and b) and os.path.realpath(a) == os.path.realpath(b)


def _may_default(drafter: dict) -> bool:
    """A drafter trained here that did not beat what the target had is kept, never the default."""
    return (drafter.get("trained") or {}).get("adopted", True)


def _noun(drafter: dict) -> str:
    return "draft model" if drafter["method"] == "draft" else f"{drafter['method']} drafter"


def _drafter_words(drafter: dict) -> str:
    """"dflash drafter made for it (dflash)" or "... trained here (1.62x measured)"."""
    trained = drafter.get("trained")
    origin = (f"trained here ({trained['speedup']:.2f}x measured)" if trained and trained.get("speedup")
              else "made for it")
    return f"{_noun(drafter)} {origin} ({os.path.basename(drafter['path'])})"


def _not_adopted(drafters) -> str:
    """"; the eagle3 drafter trained here is kept, not used (trained EAGLE-3: 0.47x, below n-gram 1.24x)"."""
    kept = [d for d in drafters if d.get("trained") and not d["trained"]["adopted"]]
    return "".join(f"; the {_noun(d)} trained here is kept, not used ({d['trained']['reason']})"
                   for d in kept[:1])


def _rank(drafter: dict) -> tuple:
    """As pairing orders native drafters: adopted ones trained here (by measured speedup), then
    drafters from elsewhere, then trained ones that did not pay."""
    trained = drafter.get("trained")
    if trained is None:
        return (1, 0.0)
    return (0, -(trained["speedup"] or 0.0)) if trained["adopted"] else (2, 0.0)


def trained_drafts(target: ModelEntry, candidates: Iterable[ModelEntry]) -> list[dict]:
    """Draft models that `train-drafter --method draft` trained (app/training/draft.py), among
    `candidates`, in the shape of pairing's native drafters with their verdict: for a PyTorch
    target the ones trained for it, for a GGUF target any of them (the caller passes the drafts
    pairing found compatible, which a draft trained from the model's Hugging Face folder is)."""
    from specdesk.app.models.provenance import read_provenance

    found = []
    for entry in candidates:
        if not entry.ok or entry.drafter or _same(entry.path, target.path):
            continue
        record = read_provenance(entry.path)
        if record is None or record.get("method") != "draft":
            continue
        if target.format != "gguf" and not _same(record.get("target"), target.path):
            continue
        found.append({"method": "draft", "source": "local", "path": entry.path,
                      "trained": {"adopted": record["adopted"], "speedup": record.get("speedup"),
                                  "reason": record.get("reason", ""), "at": record.get("trained_at")}})
    return found


def choose_for(target_path: str, entries: Iterable[ModelEntry], current_draft: Optional[str] = None,
               records: Optional[list] = None) -> UseChoice:
    """The draft for `target_path`: the current one if it still fits, else a local drafter file made
    for this target (DFlash, EAGLE-3, or a draft model trained here and adopted), else the best
    compatible draft model that pairing expects to pay (measured on this machine first), else none. Refuses only a target that cannot load."""
    from .pairing import native_drafters, pair

    entries = list(entries)
    target = find_entry(entries, target_path) or read_model(target_path)
    if not target.ok:
        raise SpecDeskError(target.error)
    name = target.name or os.path.basename(target.path)
    if target.format != "gguf":  # a PyTorch target: its own drafter folders and draft models trained for it
        found = [d for d in native_drafters(target, entries) if d["source"] == "local" and d.get("path")
                 and not is_in_target(d["method"])] + trained_drafts(target, entries)
        found.sort(key=_rank)  # stable: pairing's order within a rank
        local = [d for d in found if _may_default(d)]
        if current_draft and any(_same(d["path"], current_draft) for d in local):
            return UseChoice(target.path, current_draft, f"{name}: kept the current drafter")
        if local:
            return UseChoice(target.path, local[0]["path"], f"{name}: with its {_drafter_words(local[0])}")
        return UseChoice(target.path, None, f"{name}: no drafter for it here{_not_adopted(found)}; Auto drafts "
                                            "from the text itself")
    report = pair(target.path, entries, records=records)
    compatible = {os.path.realpath(v.path): v for v in report.compatible}
    trained = trained_drafts(target, [e for e in entries if os.path.realpath(e.path) in compatible])
    kept = {os.path.realpath(d["path"]) for d in trained if not _may_default(d)}
    drafters = [d for d in report.native if d["source"] == "local" and d.get("path") and not is_in_target(d["method"])
                and not _same(d["path"], target.path) and _may_default(d)]
    drafters = sorted(drafters + [d for d in trained if _may_default(d)], key=_rank)
    if current_draft and (os.path.realpath(current_draft) in compatible
                          or any(_same(d["path"], current_draft) for d in drafters)):
        return UseChoice(target.path, current_draft, f"{name}: kept the current draft")
    if drafters:
        return UseChoice(target.path, drafters[0]["path"], f"{name}: with the {_drafter_words(drafters[0])}")
    paying = [v for v in report.compatible if v.score > 1.0 and os.path.realpath(v.path) not in kept]
    if paying:
        best = paying[0]
        basis = "measured here" if best.basis == "measured" else "expected"
        return UseChoice(target.path, best.path, f"{name}: with the draft {best.name} "
                                                 f"({best.score:.2f}x {basis} at k = {best.k})")
    why = ("no draft here fits its vocabulary" if not report.compatible else "no draft here is expected to pay")
    why += _not_adopted(list(report.native) + trained)
    if any(is_in_target(d["method"]) and d["source"] == "in-file" for d in report.native):
        why += "; its own MTP layers draft"
    return UseChoice(target.path, None, f"{name}: {why}; Auto drafts without one")


def draft_misfit(target_path: str, draft_path: str, entries: Iterable[ModelEntry]) -> Optional[str]:
    """Why `draft_path` cannot draft for `target_path` (None: it can): the "Use as draft" check."""
    from .pairing import check_draft, native_drafters

    entries = list(entries)
    target = find_entry(entries, target_path) or read_model(target_path)
    draft = find_entry(entries, draft_path) or read_model(draft_path)
    if not target.ok:
        return target.error
    if draft.drafter:
        if any(d["source"] == "local" and _same(d.get("path"), draft.path) for d in native_drafters(target, [draft])):
            return None
    verdict = check_draft(target, draft)
    return None if verdict.compatible else "; ".join(verdict.reasons)
