"""Pairing: which drafts in the library can serve a target, how much each should help,
which native drafters exist for it, and whether target + draft + caches fit in memory.

Compatibility is the engine's own rule set (engines/speculation/compat.py), applied to each
model's vocabulary as llama.cpp loads it (a vocab-only load: no weights are read), so a
verdict here is exactly the one the engine gives when the pair is loaded. The loads happen
in a child process (app/models/vocab_check.py): a vocabulary llama.cpp aborts on ends that process,
never the app's window or the CLI. The expected
benefit is what this machine measured for the pair (app/runtime/measurements.py) when it has, else
the standard speculative-decoding speedup model (Leviathan et al. 2023) with an assumed
acceptance rate and the draft/target cost ratio taken from their weight bytes.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Optional

from specdesk.engines.llama.fit import TargetShape, default_context, drafter_misfit, drafter_shape, kv_bytes
from specdesk.engines.memory import MemoryInfo, available_memory  # noqa: F401 - part of this module's API
from specdesk.engines.methods import in_target_method, method_info
from specdesk.engines.types import MAX_DRAFT_TOKENS, SpecDeskError

from .library import ModelEntry, Shape, find_entry, read_model, read_table
from ..storage.paths import assets_dir

log = logging.getLogger(__name__)

# Memory model of a llama.cpp process (CPU backend, f16 KV cache, n_ubatch 512, flash
# attention as llama.cpp chooses it by default). Measured on Linux x86-64 with
# llama-cpp-python 0.3.36 by loading models in a fresh process and reading VmRSS: the demo
# families (tests/test_pairing.py) and the zoo's qwen2 at Qwen2.5-0.5B's shapes in F16 and
# Q4_K_M (tests/test_memory_estimate.py) repeat that measurement against this estimate.
RUNTIME_OVERHEAD_BYTES = 14_500_000  # the first model: ggml CPU backend, threads, llama.cpp state
MODEL_OVERHEAD_BYTES = 1_000_000  # each model: tensor and graph metadata
# Each model: the vocabulary's strings, token maps and BPE merges. A vocabulary-only load grew
# VmRSS by 269 (phi-3, SentencePiece) to 453 (llama-bpe) bytes a token, 345 for qwen2's 151,936.
MODEL_OVERHEAD_PER_TOKEN = 400
N_UBATCH = 512
# Rows of logits one pass asks for: a verification pass [last, d1..dk] at the largest k; the
# prompt's chunks ask for their last row only (engines/llama/engine.py prefill).
OUTPUT_ROWS = MAX_DRAFT_TOKENS + 1
ACCEPTANCE_SAME_FAMILY = 0.7  # a-priori acceptance rate of a draft from the same family
ACCEPTANCE_OTHER = 0.5  # same vocabulary, different model family
MAX_K = 8


# --- memory ----------------------------------------------------------------------------
def kv_cache_bytes(shape: Shape, n_ctx: int) -> int:
    """The engine's KV cache (engines/llama/fit.kv_bytes) for a model of this shape."""
    return kv_bytes(n_ctx, [(shape.n_head_kv, shape.key_length, shape.value_length)] * shape.n_layer)


def compute_buffer_bytes(shape: Shape, vocab_size: int, n_ctx: int) -> int:
    """The compute memory llama.cpp touches: the larger of a full ubatch's layer pass
    (feed-forward activations and residuals) and the output pass of the rows whose logits the
    engine asks for, plus the host buffer those logits are copied to. llama.cpp reserves its
    compute buffer for n_ubatch rows of logits (n_vocab x 512 floats, 311 MB at 151,936
    tokens) but only the pages a pass writes become resident, and no pass here asks for more
    than OUTPUT_ROWS rows of logits."""
    rows = min(N_UBATCH, n_ctx)
    layers = rows * 4 * (4 * shape.n_ff + 3 * shape.n_embd // 2)
    out_rows = min(OUTPUT_ROWS, n_ctx)
    output = out_rows * 4 * (vocab_size + 2 * shape.n_embd)
    return max(layers, output) + out_rows * 4 * vocab_size


@dataclass(frozen=True)
class MemoryEstimate:
    n_ctx: int
    weights_bytes: int
    kv_cache_bytes: int
    compute_bytes: int
    overhead_bytes: int
    draft_weights_bytes: int
    draft_kv_cache_bytes: int
    draft_compute_bytes: int
    draft_overhead_bytes: int
    required_bytes: int
    available_bytes: int
    total_bytes: int
    vram_free_bytes: Optional[int]
    fits: bool

    def to_json(self) -> dict:
        return asdict(self)


def model_bytes(entry: ModelEntry, n_ctx: int) -> tuple[int, int, int, int]:
    """(weights, KV cache, compute buffer, per-model overhead) of one loaded model."""
    vocab = int(entry.vocab_size or 0)
    return (entry.weights_bytes, kv_cache_bytes(entry.shape, n_ctx), compute_buffer_bytes(entry.shape, vocab, n_ctx),
            MODEL_OVERHEAD_BYTES + MODEL_OVERHEAD_PER_TOKEN * vocab)


def estimate_memory(target: ModelEntry, draft: Optional[ModelEntry] = None, n_ctx: int = 0,
                    memory: Optional[MemoryInfo] = None) -> MemoryEstimate:
    """Resident memory the engine needs for target (+ draft) at n_ctx, against free RAM."""
    n_ctx = default_context(target.context_length, n_ctx)
    weights, kv, compute, overhead = model_bytes(target, n_ctx)
    d = model_bytes(draft, n_ctx) if draft is not None else (0, 0, 0, 0)
    required = RUNTIME_OVERHEAD_BYTES + weights + kv + compute + overhead + sum(d)
    memory = memory or available_memory()
    return MemoryEstimate(n_ctx, weights, kv, compute, overhead, *d, required, memory.ram_available,
                          memory.ram_total, memory.vram_free, required <= memory.ram_available)


@dataclass(frozen=True)
class DeviceUse:
    """What the loaded models would take on one device."""

    device: str  # ggml's name ("CUDA0", "RPC0", ...), or "RAM"
    description: str
    required_bytes: int
    free_bytes: int

    @property
    def fits(self) -> bool:
        return self.required_bytes <= self.free_bytes

    def to_json(self) -> dict:
        return {**asdict(self), "fits": self.fits}


@dataclass(frozen=True)
class PlacementEstimate:
    """Where the target and the draft would sit (engines/llama/placement.py) and what each
    device, and the RAM, would hold."""

    target: dict  # ResolvedPlacement.as_dict()
    draft: Optional[dict]
    devices: tuple[DeviceUse, ...]  # RAM first

    @property
    def fits(self) -> bool:
        return all(d.fits for d in self.devices)

    def describe(self) -> str:
        """"target 9/9 layers on CUDA0 (…) · draft CPU; CUDA0 needs 1.2 GB of 8.0 GB free: fits"."""
        from specdesk.engines.llama.placement import ResolvedPlacement

        where = [f"target {ResolvedPlacement(**self.target).describe()}"]
        if self.draft is not None:
            where.append(f"draft {ResolvedPlacement(**self.draft).describe()}")
        needs = [f"{d.device} needs {human_size(d.required_bytes)} of {human_size(d.free_bytes)} free"
                 for d in self.devices]
        return f"{' · '.join(where)}; {', '.join(needs)}: {'fits' if self.fits else 'does NOT fit'}"

    def to_json(self) -> dict:
        return {"target": self.target, "draft": self.draft, "devices": [d.to_json() for d in self.devices],
                "fits": self.fits}


def measured_on_placement(records: list, target_path: str, n_ctx: int, placement=None) -> list:
    """The measurements taken where the target would sit now (a speedup measured on a CPU says
    little about a GPU placement, app/runtime/placement.placement_label)."""
    from specdesk.app.runtime.measurements import on_placement
    from specdesk.app.runtime.placement import placement_label
    from specdesk.engines.llama.binding import validated_header
    from specdesk.engines.llama.devices import llama_devices
    from specdesk.engines.llama.placement import Placement, resolve

    try:
        header = validated_header(target_path)
        where = resolve(placement or Placement(), header, n_ctx or 512, llama_devices())
    except SpecDeskError:
        return on_placement(records, "CPU")
    return on_placement(records, placement_label({"target": where.as_dict()}))


def human_size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def estimate_placement(memory: MemoryEstimate, target_path: str, draft_path: Optional[str] = None,
                       devices: Optional[list] = None, placement=None, draft_placement=None) -> PlacementEstimate:
    """Per device: the layers engines/llama/placement.resolve would put on a device (its weights,
    their KV cache and the device's compute buffer: placement.offload_bytes), and what stays in
    RAM (`memory`, the CPU-only estimate, less what moved to a device)."""
    from specdesk.engines.llama.binding import validated_header
    from specdesk.engines.llama.placement import Placement, model_layout, offload_bytes, resolve

    if devices is None:
        from specdesk.engines.llama.devices import llama_devices

        devices = llama_devices()
    by_name = {d.name: d for d in devices}
    use: dict[str, int] = {}
    moved = 0
    placed = []
    for path, asked in ((target_path, placement), (draft_path, draft_placement)):
        if path is None:
            placed.append(None)
            continue
        header = validated_header(path)
        where = resolve(asked or Placement(), header, memory.n_ctx, devices)
        placed.append(where.as_dict())
        if not where.on_cpu:
            on_device = offload_bytes(model_layout(header), memory.n_ctx, where.n_gpu_layers)
            use[where.device] = use.get(where.device, 0) + on_device.total
            moved += on_device.weights + on_device.kv_cache
    rows = [DeviceUse("RAM", "system memory", max(0, memory.required_bytes - moved), memory.available_bytes)]
    rows += [DeviceUse(name, by_name[name].description, need, by_name[name].free_bytes) for name, need in use.items()]
    return PlacementEstimate(placed[0], placed[1], tuple(rows))


# --- expected benefit ------------------------------------------------------------------
def expected_speedup(acceptance: float, cost_ratio: float, k: int) -> float:
    """Tokens per unit of target time with k drafts (Leviathan et al. 2023, eq. for E[tokens]
    over the cost of k draft passes plus one verification)."""
    tokens = (1 - acceptance ** (k + 1)) / (1 - acceptance)
    return tokens / (1 + k * cost_ratio)


_NOT_FAMILY = re.compile(r"i?q\d(_[a-z0-9]+)*|b?f\d\d|\d+(\.\d+)?[bmk]|draft|target|assistant|gguf|low|high|mtp")


def _name_key(name: str) -> str:
    """A name's words less sizes, quantizations and role words; a quantization keeps its
    underscores (Q4_K_M), any other word is split at them (the zoo's draft_low)."""
    words = []
    for token in re.split(r"[-\s]+", re.sub(r"\.gguf$", "", name.lower())):
        if not token or _NOT_FAMILY.fullmatch(token):
            continue
        words += [w for w in token.split("_") if w and not _NOT_FAMILY.fullmatch(w)]
    return " ".join(words)


def family_key(entry: ModelEntry) -> str:
    """A file name with sizes, quantization and role words stripped: one family's models share it.
    A file name that is nothing but those (the zoo's target-F16.gguf, draft_low-F16.gguf) is
    keyed by its folder; "" when that says nothing either, and "" never matches (same_family)."""
    path = Path(entry.path)
    name = path.name
    if name.lower().startswith("sha256-") or entry.format == "hf":  # Ollama blobs and checkpoint folders
        return _name_key((entry.repo_id or entry.name).split("/")[-1])
    return _name_key(name) or (_name_key(path.parent.name) if path.parent.name else "")


def same_family(a: ModelEntry, b: ModelEntry) -> bool:
    """Same architecture and the same non-empty family key."""
    key = family_key(a)
    return bool(key) and a.architecture == b.architecture and key == family_key(b)


@dataclass(frozen=True)
class DraftVerdict:
    path: str
    name: str
    compatible: bool
    score: float = 0.0  # expected speedup at the best k (1.0 = no gain)
    k: int = 0
    reasons: tuple[str, ...] = ()  # why not (incompatible), or what the score rests on
    basis: str = "assumed"  # "measured": the score is this machine's compare runs; "assumed": a model's guess

    def to_json(self) -> dict:
        if self.compatible:
            return {"path": self.path, "name": self.name, "score": self.score, "k": self.k, "basis": self.basis,
                    "notes": list(self.reasons)}
        return {"path": self.path, "name": self.name, "reasons": list(self.reasons)}


def score_draft(target: ModelEntry, draft: ModelEntry, records: Optional[list] = None) -> DraftVerdict:
    """Measured numbers when this machine has compared the pair (app/runtime/measurements.py), else
    the speedup model on an assumed acceptance, labelled as such."""
    from ..runtime.measurements import measured_for

    measured = measured_for(target.path, draft.path, "draft", records)
    if measured is not None:
        note = (f"measured on this machine: {measured.measure.ranged()} at k = {measured.k}, acceptance "
                f"{measured.acceptance:.0%}")
        return DraftVerdict(draft.path, draft.name, True, round(measured.speedup, 2), measured.k, (note,), "measured")
    family = same_family(target, draft)
    acceptance = ACCEPTANCE_SAME_FAMILY if family else ACCEPTANCE_OTHER
    cost = draft.weights_bytes / max(1, target.weights_bytes)
    notes = [f"assumed, not measured: {'same family' if family else 'same vocabulary, other family'}, "
             f"acceptance assumed {acceptance:.0%}",
             f"draft is {1 / cost:.1f}x smaller than the target" if cost < 1 else
             "draft is not smaller than the target: no gain expected"]
    scale = 1.0
    reference = _measured_sibling(target, draft, records)
    if reference is not None:  # another draft measured for this target: what this machine does
        name, measured, model = reference
        if _name_key(name) and _name_key(name) == _name_key(Path(draft.path).name):
            acceptance = measured.acceptance
            notes[0] = (f"assumed, not measured: acceptance {acceptance:.0%} as measured for {name} "
                        "(the same draft in another file)")
        scale = measured.speedup / model
        notes.append(f"scaled by {scale:.2f}: this machine measured {measured.speedup:.2f}x for {name} where "
                     f"the model expects {model:.2f}x")
    best_k = max(range(1, MAX_K + 1), key=lambda k: expected_speedup(acceptance, cost, k))
    speedup = expected_speedup(acceptance, cost, best_k) * scale
    if speedup <= 1.0:
        best_k, speedup = 0, 1.0
    return DraftVerdict(draft.path, draft.name, True, round(speedup, 2), best_k, tuple(notes))


def _measured_sibling(target: ModelEntry, draft: ModelEntry, records: Optional[list]):
    """(file name, Measured, the speedup model's figure for it) of another draft this machine
    measured for `target`, the most measured runs first; None when there is none."""
    from ..runtime.measurements import measured_for

    if records is None:
        from ..runtime.measurements import read

        records = read()
    here, found = os.path.realpath(draft.path), None
    for other in {r.get("draft") for r in records if r.get("kind") != "chat" and r.get("method") == "draft"
                  and r.get("target") == os.path.realpath(target.path) and r.get("draft")}:
        if other == here or not os.path.isfile(other):
            continue
        measured = measured_for(target.path, other, "draft", records)
        if measured is None or (found is not None and measured.runs <= found[1].runs):
            continue
        cost = os.path.getsize(other) / max(1, target.weights_bytes)
        model = expected_speedup(measured.acceptance, cost, measured.k)
        if model > 1.0:
            found = (Path(other).name, measured, model)
    return found


def needs_vocab_check(draft: ModelEntry) -> bool:
    """Whether only the vocabularies can still tell (check_draft decides the rest from the entry)."""
    return draft.ok and not draft.drafter and draft.format == "gguf"


def check_draft(target: ModelEntry, draft: ModelEntry, vocab_reasons: Optional[tuple[str, ...]] = None,
                records: Optional[list] = None) -> DraftVerdict:
    """The engine's verdict on one pair; every refusal names what differs. `vocab_reasons`:
    the vocabularies' verdict (vocab_check.vocab_verdicts) when the caller has it already."""
    if not draft.ok:
        return DraftVerdict(draft.path, draft.name, False, reasons=(draft.error,))
    if draft.drafter:
        drafter = method_info(draft.drafter).drafter
        misfit = gguf_drafter_misfit(target, draft) if draft.format == "gguf" and target.format == "gguf" else None
        return DraftVerdict(draft.path, draft.name, False, reasons=(
            f"{drafter}: {misfit}" if misfit else
            f"{drafter} checkpoint, not a draft model: see the native drafters",))
    if draft.format != "gguf":
        return DraftVerdict(draft.path, draft.name, False, reasons=(
            "an HF checkpoint: the llama.cpp engine runs GGUF drafts (use a GGUF conversion of it)",))
    if vocab_reasons is None:
        from .vocab_check import vocab_verdicts

        try:
            vocab_reasons = vocab_verdicts(target.path, [draft.path])[draft.path]
        except SpecDeskError as e:  # the target's own vocabulary
            return DraftVerdict(draft.path, draft.name, False, reasons=(str(e),))
    if vocab_reasons:
        return DraftVerdict(draft.path, draft.name, False, reasons=tuple(vocab_reasons))
    return score_draft(target, draft, records)


# --- native drafters ---------------------------------------------------------------------
def load_drafter_table(path: Optional[Path] = None) -> list[dict]:
    """Known targets and their drafter repositories; empty when the table is missing or broken."""
    path = Path(path) if path is not None else assets_dir() / "native_drafters.json"
    return read_table(path, "targets", list, "native drafters") or []


def known_target(entry: ModelEntry, table: Optional[list] = None) -> Optional[dict]:
    """The table row whose name fragments appear in the model's repo id, name or file name."""
    table = table if table is not None else load_drafter_table()
    haystack = " ".join(filter(None, [entry.repo_id, entry.name, Path(entry.path).name])).lower().replace("_", "-")
    for row in table:
        if any(m in haystack for m in row["match"]) and not any(x in haystack for x in row.get("exclude", [])):
            return row
    return None


def trunk_layers(entry: ModelEntry) -> int:
    """The layers a target runs per token: its blocks less the MTP (nextn) ones llama.cpp counts among them."""
    return entry.shape.n_layer - (entry.mtp_layers if entry.format == "gguf" else 0)


def gguf_drafter_misfit(target: ModelEntry, drafter: ModelEntry) -> Optional[str]:
    """Why a drafter GGUF cannot run on this target, or None when it fits: the vocabularies'
    sizes, then the engine's own rule (engines/llama/fit.drafter_misfit) on the two headers."""
    if drafter.vocab_size != target.vocab_size:
        return f"vocab size {target.vocab_size} vs {drafter.vocab_size} (target vs drafter)"
    return drafter_misfit(drafter_shape(drafter.drafter, drafter.drafter_config),
                          TargetShape(Path(target.path).name, target.architecture or "", trunk_layers(target),
                                      target.shape.n_embd))


def mtp_twin(target: ModelEntry, other: ModelEntry) -> bool:
    """`other` is this target exported with its MTP (nextn) layers: the same trunk shape and
    vocabulary, plus MTP layers the target lacks."""
    if not (other.ok and other.format == "gguf" and other.mtp_layers and not other.drafter) or target.mtp_layers:
        return False
    a, b = target.shape, other.shape
    return (target.vocab_size is not None and other.vocab_size == target.vocab_size and a.n_layer > 0
            and trunk_layers(other) == a.n_layer and (a.n_embd, a.n_head, a.n_head_kv, a.key_length, a.value_length)
            == (b.n_embd, b.n_head, b.n_head_kv, b.key_length, b.value_length))


def _with_provenance(found: list[dict]) -> None:
    """Drafters trained here carry their measured verdict (app/models/provenance.read_provenance):
    the why says it, and the local ones are ordered adopted first (by measured speedup), then
    drafters from elsewhere, then trained ones that did not pay, which are kept, never chosen."""
    from .provenance import provenance_line, read_provenance

    for d in found:
        if d["source"] != "local" or not d.get("path"):
            continue
        record = read_provenance(d["path"])
        if record is not None:
            d["trained"] = {"adopted": record["adopted"], "speedup": record.get("speedup"),
                            "reason": record.get("reason", ""), "at": record.get("trained_at")}
            d["why"] = f"{d['why']}; {provenance_line(record)}"

    def rank(d: dict) -> tuple:
        trained = d.get("trained")
        if trained is None:
            return (1, 0.0)
        return (0, -(trained["speedup"] or 0.0)) if trained["adopted"] else (2, 0.0)
    order = {id(d): i for i, d in enumerate(found)}
    found.sort(key=lambda d: (rank(d) if d["source"] == "local" else (-1, 0.0), order[id(d)]))


def native_drafters(target: ModelEntry, entries: Iterable[ModelEntry], table: Optional[list] = None) -> list[dict]:
    """MTP layers in the file, this target exported with MTP layers, drafter checkpoints found
    locally (HF folders by their config, GGUF files by their header), and ones known by name."""
    found: list[dict] = []
    in_file = in_target_method()  # MTP: layers inside the target's own file
    if target.mtp_layers:
        found.append({"method": in_file, "source": "in-file", "path": target.path, "layers": target.mtp_layers})
    row = known_target(target, table)
    known_repos = {d.get("repo"): d for d in (row or {}).get("drafters", []) if d.get("repo")}
    local_repos = set()
    target_real = os.path.realpath(target.path)
    for e in entries:
        if not e.ok or os.path.realpath(e.path) == target_real:
            continue
        if target.format == "gguf" and mtp_twin(target, e):
            found.append({"method": in_file, "source": "local", "path": e.path, "layers": e.mtp_layers,
                          "why": f"the same model with {e.mtp_layers} MTP layer{'s' if e.mtp_layers != 1 else ''}: "
                                 f"load it as the target and use method {in_file}"})
            continue
        if not e.drafter:
            continue
        listed = e.repo_id is not None and e.repo_id in known_repos
        if e.format == "gguf" and target.format == "gguf":
            fits = gguf_drafter_misfit(target, e) is None
            if listed or fits:
                local_repos.add(e.repo_id)
                layers = ", ".join(str(i) for i in e.drafter_config.get("target_layers") or [])
                found.append({"method": e.drafter, "source": "local", "path": e.path, "repo": e.repo_id,
                              "why": "published for this target" if listed and not fits else
                              f"{method_info(e.drafter).short} drafter for this {trunk_layers(target)}-layer, "
                              f"{target.shape.n_embd}-wide target and its vocabulary (reads layers {layers}): "
                              f"use it as the draft with method {e.drafter}"})
            continue
        target_layers = e.drafter_config.get("num_target_layers")
        shape_match = target_layers is not None and int(target_layers) == target.shape.n_layer and (
            e.vocab_size in (None, target.vocab_size))
        if listed or shape_match:
            local_repos.add(e.repo_id)
            found.append({"method": e.drafter, "source": "local", "path": e.path, "repo": e.repo_id,
                          "why": "published for this target" if listed else
                          f"built for a {target_layers}-layer target with this vocabulary"})
    _with_provenance(found)
    for repo, d in known_repos.items():
        if repo not in local_repos:
            found.append({"method": d["method"], "source": "hub", "repo": repo,
                          "why": f"published for {row['target']}: download it with `specdesk models download {repo}`"})
    if row and any(d.get("in_file") for d in row["drafters"]) and not target.mtp_layers:
        found.append({"method": in_file, "source": "hub", "repo": row["target"],
                      "why": f"{row['target']} has MTP layers; this file has none (its conversion dropped them)"})
    return found


# --- the report ----------------------------------------------------------------------------
@dataclass(frozen=True)
class PairingReport:
    target: ModelEntry
    compatible: tuple[DraftVerdict, ...]  # best first
    incompatible: tuple[DraftVerdict, ...]
    native: tuple[dict, ...]
    memory: MemoryEstimate
    memory_draft: Optional[str] = None  # the draft counted in the memory estimate
    placement: Optional[PlacementEstimate] = None  # where the target and that draft would sit
    economics: Optional[str] = None  # why speculation pays here or not (app/models/economics.py), once measured

    def to_json(self) -> dict:
        memory = self.memory.to_json()
        memory["draft"] = self.memory_draft
        if self.placement is not None:
            memory["placement"] = self.placement.to_json()
        return {"target": self.target.path, "compatible": [v.to_json() for v in self.compatible],
                "incompatible": [v.to_json() for v in self.incompatible], "native": list(self.native),
                "memory": memory, "economics": self.economics}


def pair(target_path: str | os.PathLike, entries: Iterable[ModelEntry], n_ctx: int = 0,
         draft_path: Optional[str] = None, memory: Optional[MemoryInfo] = None,
         table: Optional[list] = None, records: Optional[list] = None,
         placement=None, draft_placement=None) -> PairingReport:
    """Rank the library's drafts for a target, by this machine's measurements where it has
    them (`records`: app/runtime/measurements.read() by default); the memory estimate counts the
    chosen draft (draft_path), else the best compatible one, and says per device where each
    would sit (`placement`, `draft_placement`: engines/llama/placement.Placement; default auto)."""
    from ..runtime.measurements import read

    entries = list(entries)
    records = read() if records is None else records
    target = find_entry(entries, target_path) or read_model(target_path)
    if not target.ok:
        raise SpecDeskError(target.error)
    if target.format != "gguf":
        raise SpecDeskError(f"{target.path}: draft pairing needs a GGUF target (the llama.cpp engine)")
    records = measured_on_placement(records, target.path, n_ctx, placement)
    candidates = [e for e in entries if os.path.realpath(e.path) != os.path.realpath(target.path)]
    if draft_path and not find_entry(candidates, draft_path):
        candidates.append(read_model(draft_path))
    native = native_drafters(target, entries, table)
    # Native drafters found here (a DFlash or EAGLE-3 drafter for this target, the target with its
    # MTP layers) are listed as such, not ranked as drafts, unless asked for as the draft.
    chosen_real = os.path.realpath(draft_path) if draft_path else None
    native_real = {os.path.realpath(d["path"]) for d in native if d["source"] == "local" and d.get("path")}
    compatible, incompatible = [], []
    from .vocab_check import vocab_verdicts

    vocab = vocab_verdicts(target.path, [e.path for e in candidates if needs_vocab_check(e)])
    for entry in candidates:
        verdict = check_draft(target, entry, vocab.get(str(entry.path), ()), records)
        real = os.path.realpath(entry.path)
        if real in native_real and real != chosen_real:
            if verdict.compatible or entry.drafter:
                continue
            native = [d for d in native if os.path.realpath(d.get("path") or "") != real]  # the engine refuses it
        (compatible if verdict.compatible else incompatible).append(verdict)
    compatible.sort(key=lambda v: (-v.score, v.path))
    chosen = draft_path or (compatible[0].path if compatible else None)
    draft_entry = None
    if chosen:
        draft_entry = find_entry(candidates, chosen)
        if draft_path and not any(os.path.realpath(v.path) == os.path.realpath(draft_path) for v in compatible):
            raise SpecDeskError(f"{draft_path}: not a compatible draft for {target.path}: "
                                + "; ".join(next((v.reasons for v in incompatible
                                                  if os.path.realpath(v.path) == os.path.realpath(draft_path)), ())))
    estimate = estimate_memory(target, draft_entry, n_ctx, memory)
    try:
        placed = estimate_placement(estimate, target.path, draft_entry.path if draft_entry else None,
                                    placement=placement, draft_placement=draft_placement)
    except SpecDeskError as e:  # a placement that cannot be (a device that is not here): said, not fatal
        log.info("no placement estimate: %s", e)
        placed = None
    from .economics import pass_economics

    return PairingReport(target, tuple(compatible), tuple(incompatible), tuple(native),
                         estimate, draft_entry.path if draft_entry else None, placed,
                         pass_economics(target, entries))
