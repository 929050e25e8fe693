"""The application layer: what the terminal and the desktop app do with models, written once
(docs/ARCHITECTURE.md, Layers).

Which engine a target runs on (llama.cpp for a GGUF file, PyTorch for a Hugging Face folder)
and opening it in its own process, the demo family's placeholders, chat prompts and the one
rule that cuts a conversation to the context, drafter detection and loading, what a loaded
engine can do, and the chat, compare and k-sweep jobs. `Session` holds one loaded target and
its drafter across jobs. Nothing here imports Qt: ui/worker.py runs a Session on its engine
thread, app/main.py's subcommands call the same functions in the terminal.

Every function takes an engine as the `Engine` protocol describes it (the in-process engines
or app/runtime/engine_client.EngineClient), and none asks which engine it is.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generator, Optional, Sequence

from specdesk.app.runtime.backend import ChatOutcome, ChatSettings
from specdesk.app.runtime.compare import CompareReport, SweepPoint, SweepResult, compare, sweep
from specdesk.app.runtime.generation import RunResult, stream_once
from specdesk.app.chat.prompting import chat_prompt, draft_prompt, fit_chat, text_tokens
from specdesk.app.storage.settings import DEMO, DEMO_DFLASH, DEMO_HF, DEMO_MTP
from specdesk.engines.methods import method_info
from specdesk.engines.types import GenerationRequest, SamplingParams, SpecConfig, SpecDeskError, StepEvent


# --- engines -------------------------------------------------------------------
def is_hf_target(target: str) -> bool:
    """A Hugging Face folder runs on the PyTorch engine; a GGUF file on llama.cpp."""
    return target == DEMO_HF or os.path.isdir(target)


def engine_kind(target: str) -> str:
    """The engine process's kind for a target: "torch" for a folder, "llama" for a GGUF file."""
    return "torch" if is_hf_target(target) else "llama"


def open_engine(target: str, n_ctx: int = 0, threads: Optional[int] = None, *, kind: Optional[str] = None,
                device: str = "auto", progress: Optional[Callable[[float], None]] = None,
                cancel: Optional[threading.Event] = None, watchdog: bool = False, **placement):
    """The engine in its own process (app/runtime/engine_host.py): a model that aborts or hangs there
    never takes the caller down. `kind` defaults to what the target's format runs on;
    `watchdog` ends a process that stops answering (see EngineClient); `placement` is where a
    GGUF's layers go (HostSpec: gpu_layers, draft_device, draft_gpu_layers, rpc)."""
    from specdesk.app.runtime.engine_client import EngineClient

    return EngineClient(target, kind=kind or engine_kind(target), n_ctx=n_ctx, n_threads=threads, device=device,
                        progress=progress, cancel=cancel, watchdog=watchdog, **placement)


def resolve_demo(target: str, draft: Optional[str], demo_size: str,
                 progress: Callable[[str], None]) -> tuple[str, Optional[str]]:
    """Replace the demo placeholders (settings.DEMO, DEMO_HF, DEMO_MTP, DEMO_DFLASH) by the demo
    family's files, building them if needed: for a PyTorch target the demo draft is its HF
    folder and DEMO_DFLASH its DFlash drafter folder; for llama.cpp DEMO_MTP is the target
    exported with its MTP layer and DEMO_DFLASH the drafter as GGUF."""
    demo_values = (DEMO, DEMO_HF, DEMO_DFLASH, DEMO_MTP)
    if target not in demo_values and draft not in demo_values:
        return target, draft
    from specdesk.app.demo.install import build_family

    family = build_family(small=demo_size == "small", progress=progress)
    hf = is_hf_target(target)
    if target == DEMO_MTP or (draft == DEMO_DFLASH and not hf):  # llama.cpp's native drafters: exported GGUFs
        from specdesk.app.demo.export_native_gguf import build_native

        family = {**family, **build_native(family)}
    targets = {DEMO: family["target_gguf"], DEMO_HF: family["target_hf"], DEMO_MTP: family.get("mtp_gguf")}
    drafts = {DEMO: family["draft_hf"] if hf else family["draft_gguf"],
              DEMO_DFLASH: family.get("dflash_hf" if hf else "dflash_gguf")}
    if draft == DEMO_DFLASH and not drafts[DEMO_DFLASH]:
        raise SpecDeskError("this demo family has no DFlash drafter: rebuild it with `specdesk demo build`")
    return targets.get(target, target), drafts.get(draft, draft)


def same_file(a, b) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


def file_label(path: Optional[str]) -> str:
    return Path(path).name if path else "none"


# --- drafters ------------------------------------------------------------------
def drafter_kind(path: str) -> str:
    """The method of a drafter made for one target (a folder or GGUF; engines/methods.py's
    drafter_methods), else "draft" (a draft model)."""
    from specdesk.engines.methods import drafter_for_config, drafter_methods

    if os.path.isdir(path):
        try:
            config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return "draft"
        return (drafter_for_config(config) if isinstance(config, dict) else None) or "draft"
    from specdesk.engines.llama.binding import gguf_header

    try:
        arch = gguf_header(path).fields.get("general.architecture")
    except (SpecDeskError, OSError):  # not readable here: the engine's own load gives the clear error
        return "draft"
    return arch if arch in drafter_methods() else "draft"


def load_drafter(engine, path: str, progress: Optional[Callable[[float], None]] = None) -> str:
    """Load a draft model or a native drafter for the engine; returns its kind. `progress`
    follows a draft model's load where the engine reports one (the engine process does, for
    either engine)."""
    kind = drafter_kind(path)
    if kind != "draft":
        engine.load_native(kind, path)
    elif progress is None:
        engine.load_draft(path)
    else:
        engine.load_draft(path, progress=progress)
    return kind


def verdict_choices(target: str, choices: Sequence[str]) -> list[str]:
    """The draft choices whose fit with `target` is checked on load: vocabulary checks read
    GGUF files, so only GGUF drafts for a GGUF target."""
    if is_hf_target(target):
        return []
    return [c for c in choices if c and (c == DEMO or not os.path.isdir(c))]


# --- what is loaded ------------------------------------------------------------
@dataclass(frozen=True)
class ModelInfo:
    """What is loaded after a load job."""

    target_path: str
    draft_path: Optional[str]  # None: no draft model loaded
    engine: str
    supported_methods: tuple[str, ...]  # what this target can run now
    n_ctx: int
    threads: int
    n_params: int
    size_bytes: int
    chat_template: bool  # whether the model file has its own chat template
    unavailable: tuple[tuple[str, str], ...] = ()  # (method, why not) for the engine's other methods
    draft_verdicts: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (draft choice, why it cannot serve; () fits)
    placement: str = ""  # where the target and the draft sit, in words (PyTorch: device and dtype)
    placement_report: Optional[dict] = None  # each model's device, layers and allocated bytes per device
    notes: tuple[str, ...] = ()  # one line each: what loaded otherwise than the file asks (a bad template)


def describe_engine(engine, draft_path: Optional[str], verdict_paths: dict[str, str],
                    draft_kind: str = "draft") -> ModelInfo:
    """What is loaded, from the engine host's facts (app/runtime/engine_host.engine_facts); `verdict_paths`
    maps draft choices to the GGUF files whose fit with the target the host checks."""
    facts = engine.facts(draft_path, draft_kind, verdict_paths)
    availability = facts["availability"]
    supported = tuple(m for m, why in availability.items() if why is None)
    unavailable = tuple((m, why) for m, why in availability.items() if why is not None)
    from specdesk.app.runtime.placement import describe_placement

    report = facts.get("placement") or None
    return ModelInfo(str(engine.target.path), draft_path, engine.name, supported, engine.n_ctx, facts["threads"],
                     facts["n_params"], facts["size_bytes"], facts["has_chat_template"], unavailable,
                     tuple(facts["verdicts"]),
                     # llama.cpp: layers per device; PyTorch: its device and dtype ("CPU · float32")
                     describe_placement(report) if report else engine.device_description, report,
                     tuple(getattr(engine, "notes", ())))


# --- prompts -------------------------------------------------------------------
def chat_tokens(engine, messages: list[dict], max_tokens: int) -> tuple[list[int], int]:
    """The prompt for a conversation, with room for the reply; the oldest turns go first when
    it outgrows the context. The room kept is max_tokens, at most half the context (a longer
    reply stops at the context's end). Returns (tokens, turns dropped)."""
    return fit_chat(engine, messages, reserve=min(max_tokens, engine.n_ctx // 2))


def prompt_tokenizer(engine, chat: bool) -> Callable[[str], list[int]]:
    """With `chat`, a prompt is one user message in the model's chat template (as in a chat);
    without, it is raw text to continue."""
    if not chat:
        return lambda text: text_tokens(engine, text)
    return lambda text: chat_prompt(engine, [{"role": "user", "content": text}])


# --- jobs ----------------------------------------------------------------------
def stream_chat(engine, messages: list[dict], settings: ChatSettings, cancel: threading.Event
                ) -> Generator[StepEvent, None, ChatOutcome]:
    """The reply to a conversation, step by step: with `settings.fit` its oldest turns are cut
    to fit the context, else a conversation too long for it is refused; without max_tokens the
    reply may run to the context's end."""
    if settings.fit:
        tokens, dropped = chat_tokens(engine, messages, settings.max_tokens)
    else:
        tokens, dropped = chat_prompt(engine, messages), 0
    max_tokens = settings.max_tokens if settings.max_tokens is not None else max(1, engine.n_ctx - len(tokens))
    kept = messages[:1] + messages[1 + dropped:] if dropped and messages[0].get("role") == "system" \
        else messages[dropped:]  # what fit_chat kept
    spec = dataclasses.replace(settings.spec, draft_prompt=draft_prompt(engine, settings.spec, kept))
    request = GenerationRequest(tuple(tokens), max_tokens=max_tokens, sampling=settings.sampling, spec=spec)
    result = yield from stream_once(engine, request, cancel)
    return ChatOutcome(result, len(tokens), dropped)


def record_chat_reply(engine, spec: SpecConfig, sampling: SamplingParams, result: RunResult, tally=None) -> None:
    """A chat reply's measured acceptance and tokens per second, per target, draft, method and k."""
    from specdesk.app.runtime.measurements import record_chat, record_pass_costs

    record_chat(str(engine.target.path), spec.draft_path, engine.name, spec.method, spec.draft_tokens, result.stats,
                sampling.temperature, tally)
    if result.auto_report:  # what auto's passes cost: pairing says from it whether speculation pays here
        record_pass_costs(str(engine.target.path), engine.name, result.auto_report.get("costs"))


def run_compare(engine, prompts: Sequence[str], spec: SpecConfig, sampling: SamplingParams, max_tokens: int,
                cancel: threading.Event, on_event: Optional[Callable[[str, int, StepEvent], None]] = None,
                chat: bool = True) -> CompareReport:
    """Baseline and speculative on the same prompts; `on_event(label, prompt index, event)` gets
    each run's events. What was measured is kept, with where the models sat, for pairing's
    ranking."""
    if spec.method == "none":
        raise SpecDeskError("compare needs a speculation method: choose ngram, ngram-pool or draft")
    from specdesk.app.runtime.measurements import record_compare
    from specdesk.app.runtime.placement import engine_placement_label

    report = compare(engine, list(prompts), spec, sampling, max_tokens, prompt_tokenizer(engine, chat),
                     on_event, cancel)
    # pairing ranks drafts by what this machine measured, on this placement
    record_compare(report, placement=engine_placement_label(engine))
    return report


def run_sweep(engine, prompt: str, spec: SpecConfig, sampling: SamplingParams, max_tokens: int,
              ks: Sequence[int], cancel: threading.Event,
              on_point: Callable[[SweepPoint], None], chat: bool = True) -> SweepResult:
    """The baseline, then the speculative method at each k, on the same prompt, each repeated
    until steady (app/runtime/compare.sweep); each k's median speedup is kept for pairing."""
    if spec.method == "none":
        raise SpecDeskError("the k sweep needs a speculation method: choose ngram, ngram-pool or draft")
    from specdesk.app.runtime.measurements import record_sweep
    from specdesk.app.runtime.placement import engine_placement_label

    result = sweep(engine, prompt_tokenizer(engine, chat)(prompt), spec, sampling, max_tokens, ks, cancel, on_point,
                   learns=method_info(spec.method).learns)
    # a point cut by Stop is no measurement: the ones before it are kept
    record_sweep(str(engine.target.path), engine.name, spec, result.points[:-1] if cancel.is_set() else result.points,
                 sampling.temperature, placement=engine_placement_label(engine))
    return result


# --- one loaded target across jobs -----------------------------------------------
@dataclass(frozen=True)
class LoadOutcome:
    info: ModelInfo
    draft_error: Optional[str] = None  # the target loaded, its draft was refused (the previous one stays)


class Session:
    """One loaded target and its drafter, kept across jobs; a new load reuses the engine when
    the target and context are the same, and a bad file keeps what was loaded before."""

    def __init__(self, *, device: str = "auto", watchdog: bool = False) -> None:
        self.device = device  # the PyTorch engine's device, or llama.cpp's for its layers (see open_engine)
        self.watchdog = watchdog  # end an engine process that stops answering (a terminal has no Stop)
        self.engine = None
        self.draft_path: Optional[str] = None
        self.draft_kind = "draft"  # or a drafter-file method's name (DFlash, EAGLE-3): a model-native drafter
        self.info: Optional[ModelInfo] = None  # what the last load loaded
        self._demo_drafts: dict[str, str] = {}  # demo size -> the demo draft's GGUF, once the family was in use
        self._n_ctx: Optional[int] = None
        self._placement: dict = {}  # where the loaded GGUF's layers were asked to go

    def need_engine(self):
        if self.engine is None:
            raise SpecDeskError("no model is loaded: pick a target model (a GGUF file) first")
        return self.engine

    def load(self, target: str, draft: Optional[str], *, demo_size: str = "full", n_ctx: int = 0,
             threads: int = 0, drafts: Sequence[str] = (), progress: Callable[[str], None] = lambda message: None,
             fraction: Optional[Callable[[float], None]] = None,
             cancel: Optional[threading.Event] = None, placement: Optional[dict] = None,
             kind: Optional[str] = None) -> LoadOutcome:
        """Load a target (a path or a demo placeholder) and optionally a draft; check which of
        `drafts` (paths or DEMO) could serve the target. A refused draft is reported in the
        outcome, not raised: the target stays usable. `placement` (Settings.placement) says
        where a GGUF target's and draft's layers go; a new placement loads the target again.
        `kind` is the engine ("llama" or "torch"; default: what the target's format runs on)."""
        from specdesk.app.runtime.engine_client import EngineHostDied
        from specdesk.engines.llama.engine import default_threads

        requested_target, requested_draft = target, draft
        target, draft = resolve_demo(target, draft, demo_size, progress)
        threads = threads or default_threads()
        engine = self.engine
        kept_target = True
        if engine is not None and not engine.alive:  # its process ended: load afresh
            self.close()
            engine = None
        kind = kind or engine_kind(target)
        placement = dict(placement or {}) if kind == "llama" else {}
        if engine is None or not same_file(engine.target.path, target) or n_ctx != self._n_ctx \
                or placement != self._placement:
            kept_target = False
            progress(f"loading {file_label(target)}")
            where = {"device": self.device, **placement}  # the app's placement names its device
            new_engine = open_engine(target, n_ctx, threads, kind=kind, progress=fraction, cancel=cancel,
                                     watchdog=self.watchdog, **where)
            self.close()  # only once the new one loaded: a bad file keeps the old model
            self.engine, self._n_ctx, self._placement, engine = new_engine, n_ctx, placement, new_engine
        elif engine.n_threads != threads:
            engine.set_threads(threads)
        # A refused draft leaves the previous one in use if this engine still has it loaded.
        previous = (self.draft_path, self.draft_kind) if kept_target else (None, "draft")
        self.draft_path, self.draft_kind = None, "draft"
        draft_error = None
        if draft:
            progress(f"loading draft {file_label(draft)}")
            try:
                self.draft_kind = load_drafter(engine, draft, fraction)
                self.draft_path = draft
            except EngineHostDied:
                raise  # not a refused draft: the target went with the process
            except SpecDeskError as e:
                draft_error = str(e)
                self.draft_path, self.draft_kind = previous

        def resolve(choice: str) -> str:
            if choice != DEMO:
                return choice
            if demo_size not in self._demo_drafts:
                self._demo_drafts[demo_size] = resolve_demo(DEMO, DEMO, demo_size, progress)[1]
            return self._demo_drafts[demo_size]

        # The demo draft is checked only when the demo family is in use or was earlier in this
        # session (so, built): a check must never start a build. Checked, it is offered only for
        # targets it fits, however the target was opened.
        demo_known = DEMO in (requested_target, requested_draft) or demo_size in self._demo_drafts
        choices = [c for c in verdict_choices(target, drafts) if c != DEMO or demo_known]
        info = describe_engine(engine, self.draft_path, {choice: resolve(choice) for choice in choices},
                               self.draft_kind)
        self.info = info
        return LoadOutcome(info, draft_error)

    # --- ChatBackend (app/runtime/backend.py) ---------------------------------------
    def chat(self, messages: list[dict], settings: ChatSettings, cancel: threading.Event
             ) -> Generator[StepEvent, None, ChatOutcome]:
        engine = self.need_engine()
        with engine.watching(cancel):  # Stop also ends a chat template that never finishes rendering
            return (yield from stream_chat(engine, messages, settings, cancel))

    def record(self, settings: ChatSettings, outcome: ChatOutcome, tally) -> None:
        if settings.record:
            record_chat_reply(self.need_engine(), settings.spec, settings.sampling, outcome.result, tally)

    def compare(self, prompts: Sequence[str], settings: ChatSettings, cancel: threading.Event,
                on_event: Optional[Callable[[str, int, StepEvent], None]] = None,
                chat: bool = True) -> CompareReport:
        engine = self.need_engine()
        with engine.watching(cancel):
            return run_compare(engine, prompts, settings.spec, settings.sampling, settings.max_tokens, cancel,
                               on_event, chat)

    def chart_k(self, settings: ChatSettings) -> int:
        return settings.spec.draft_tokens

    def token_bytes(self) -> Callable[[int], bytes]:
        return self.need_engine().target.token_bytes

    # what answers, as the window and the chat history describe it
    local = True
    label = "the local models"

    def stream_unit(self) -> str:
        return "tokens"

    def answered_by(self, spec: SpecConfig, last_choice: Optional[str] = None) -> str:
        if last_choice:
            return f"auto (last: {last_choice})"
        return spec.method if spec.method == "none" else f"{spec.method}, k = {spec.k}"

    def origin(self, spec: SpecConfig) -> dict:
        return {"method": spec.method, "k": spec.k}

    def compare_refusal(self, spec: SpecConfig) -> Optional[str]:
        if spec.method == "none":
            return "compare needs a speculation method: choose ngram, ngram-pool or draft in the left panel"
        return None

    def arm_titles(self, spec: SpecConfig) -> tuple[str, str]:
        if spec.method == "auto":  # k is a bound there: auto picks the method and k each step
            return "no speculation", f"auto picks the method and k ≤ {spec.k}"
        return "no speculation", f"{spec.method}, k = {spec.k}"

    def compare_json(self, report: CompareReport) -> dict:
        """The compare's JSON report, with where each model sat and what llama.cpp allocated."""
        payload = report.to_json()
        engine = self.need_engine()
        placement = engine.placement_report() if hasattr(engine, "placement_report") else {}
        if placement:
            payload["placement"] = placement
        return payload

    def sweep(self, prompt: str, spec: SpecConfig, sampling: SamplingParams, max_tokens: int, ks: Sequence[int],
              cancel: threading.Event, on_point: Callable[[SweepPoint], None], chat: bool = True) -> SweepResult:
        engine = self.need_engine()
        with engine.watching(cancel):
            return run_sweep(engine, prompt, spec, sampling, max_tokens, ks, cancel, on_point, chat)

    def prepare(self, spec: SpecConfig, cancel: Optional[threading.Event] = None) -> None:
        """Auto's costs measured (or read from cache) before its first reply rather than during it."""
        engine = self.need_engine()
        with engine.watching(cancel or threading.Event()):
            engine.prepare(spec)

    def new_chat(self) -> None:
        """The engine forgets what the n-gram pool learned from the previous chat."""
        if self.engine is not None:
            self.engine.reset_chat()

    def reopen(self, cancel: Optional[threading.Event] = None) -> None:
        """After the engine process ended (it died, or was ended for not answering), the same
        target and drafter in a fresh one; nothing when it runs."""
        engine = self.engine
        if engine is None or engine.alive:
            return
        target, draft, kind = engine.spec.target, self.draft_path, engine.spec.kind
        self.close()
        outcome = self.load(target, draft, n_ctx=self._n_ctx or 0, threads=engine.spec.n_threads or 0,
                            cancel=cancel, placement=self._placement, kind=kind)
        if outcome.draft_error is not None:
            raise SpecDeskError(outcome.draft_error)

    def engine_lost(self) -> bool:
        """Whether the loaded engine's process has ended (it is then closed and forgotten)."""
        lost = self.engine is not None and not self.engine.alive
        if lost:
            self.close()
        return lost

    def kill(self) -> None:
        """End the engine process now (a step that does not return holds its thread)."""
        if self.engine is not None:
            self.engine.kill()

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None
            self.draft_path = None
            self.info = None
