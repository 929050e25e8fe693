"""Why speculation pays on this machine or not, per model file and weight type, in words.

Everything rests on one measured ratio: what a pass over n tokens costs against a pass over
one, t(n)/t(1), on this machine and placement (auto's cost probe measures it; compare and chat
replies of method auto record it: app/runtime/measurements.record_pass_costs). A draft pays only
if its accepted tokens outnumber what checking them costs, so where a pass over 2 tokens costs
2.1x one, no draft of any length pays at the acceptance real methods reach. Pairing, compare
and auto say it the same way (engines/speculation/chooser.economics, cannot_pay).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Optional

from specdesk.engines.methods import lookup_methods
from specdesk.engines.speculation.chooser import Costs, cannot_pay, economics, pass_ratio

from .hub import quantization_of
from .library import ModelEntry
from ..runtime.measurements import pass_costs_for

def file_stem(path: str) -> str:
    """A GGUF file's name without its weight type: the same model in another type has the same stem."""
    name = Path(path).name
    quant = quantization_of(name)
    stem = Path(name).stem
    if quant:
        stem = re.sub(re.escape(quant), "", stem, flags=re.IGNORECASE)
    return re.sub(r"[-_.]+$", "", stem).lower()


def weight_type(entry: ModelEntry) -> str:
    return entry.quantization or quantization_of(Path(entry.path).name) or "its"


def pass_economics(target: ModelEntry, entries: Iterable[ModelEntry] = (),
                   records: Optional[list] = None, placement: Optional[str] = None) -> Optional[str]:
    """One or two sentences, where this machine measured the target's passes: "a pass over 2
    tokens costs 2.1x one here with Q4_1 weights, over 3 tokens 2.7x, so no draft can pay; the
    F16 file of this model costs 1.9x". None before any measurement."""
    measured = pass_costs_for(target.path, placement, records)
    if measured is None:
        return None
    priced = lookup_methods()  # their drafting costs nothing, so only the passes decide
    costs = Costs(tuple(t / 1e3 for t in measured), {m: 0.0 for m in priced})
    text = economics(costs).replace(" one here", f" one here with {weight_type(target)} weights", 1)
    if cannot_pay(costs, priced, len(measured) - 1) is not None:
        text += ", so no draft can pay"
    stem = file_stem(target.path)
    for other in entries:
        if other.path == target.path or other.format != "gguf" or file_stem(other.path) != stem:
            continue
        theirs = pass_costs_for(other.path, placement, records)
        if theirs is not None and len(theirs) >= 2:
            text += (f"; the {weight_type(other)} file of this model costs "
                     f"{pass_ratio(Costs(tuple(theirs), {}), 2):.1f}x")
    return text
