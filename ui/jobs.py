"""What the worker thread does, without Qt: load models, chat, compare, sweep k.

Each job is a plain function of the engine and a cancel event; results and streamed
events go out through callbacks, which ui/worker.py turns into queued Qt signals. Keeping
Qt out of here keeps the jobs readable and testable on their own.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from specdesk.app.compare import CompareReport, RunResult, compare, run_once, warm_up
from specdesk.app.settings import DEMO, DEMO_DFLASH, DEMO_HF
from specdesk.engines.text import IncrementalDetokenizer
from specdesk.engines.types import GenerationRequest, RunStats, SamplingParams, SpecConfig, SpecDeskError, StepEvent

BATCH_INTERVAL_S = 1 / 60  # events are sent to the GUI at most this often per run (it repaints at ~30 Hz)


@dataclass(frozen=True)
class ModelInfo:
    """What is loaded on the worker after a load job."""

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


@dataclass(frozen=True)
class StreamBatch:
    """Consecutive StepEvents of one run, sent together (the GUI repaints at ~30 Hz anyway)."""

    job_id: int
    label: str  # "chat", "baseline", "speculative"
    k: int  # draft tokens per step of this run (0 for baseline)
    first: bool  # the first batch of this run: the GUI starts a new series
    events: tuple[StepEvent, ...]
    times: tuple[float, ...]  # (len(events),) time.perf_counter() when each event arrived
    pieces: tuple[str, ...]  # text of each committed token, in order, over all events
    from_draft: tuple[bool, ...]  # (len(pieces),) whether each token was an accepted draft token


@dataclass(frozen=True)
class ChatResult:
    result: RunResult
    prompt_tokens: int
    dropped_messages: int  # oldest messages left out because the conversation outgrew the context


@dataclass(frozen=True)
class SweepPoint:
    k: int  # 0 is the baseline
    stats: RunStats


@dataclass(frozen=True)
class SweepResult:
    method: str
    baseline: RunStats
    points: tuple[SweepPoint, ...]  # speculative runs, in the order of ks

    def best(self) -> Optional[SweepPoint]:
        return max(self.points, key=lambda p: p.stats.tok_per_s, default=None)


class Throttle:
    """Lets an action through at most once per `interval_s`, the first call always.

    The first call never compares the clock with a made-up start value: perf_counter() and
    monotonic() count from an arbitrary point (the machine's boot on Linux), so on a freshly
    booted machine "now - 0.0" is small and would hold the first event back.
    """

    def __init__(self, interval_s: float, clock: Optional[Callable[[], float]] = None) -> None:
        self.interval_s = interval_s
        self._clock = clock if clock is not None else time.perf_counter
        self._last: Optional[float] = None  # clock reading of the last call let through

    def due(self, now: Optional[float] = None) -> bool:
        """Whether the interval has passed since the last call let through (True the first time)."""
        now = self._clock() if now is None else now
        return self._last is None or now - self._last >= self.interval_s

    def mark(self, now: Optional[float] = None) -> None:
        self._last = self._clock() if now is None else now


class EventBatcher:
    """Turns one run's StepEvents into StreamBatches, one per BATCH_INTERVAL_S at most.

    It also splits each step's text into per-token pieces (so the GUI can tint exactly the
    tokens that came from an accepted draft), with its own incremental detokenizer, which
    attaches the bytes of a character split across tokens to the token that completes it.
    """

    def __init__(self, job_id: int, label: str, k: int, token_bytes: Callable[[int], bytes],
                 send: Callable[[StreamBatch], None], interval_s: float = BATCH_INTERVAL_S):
        self.job_id, self.label, self.k = job_id, label, k
        self._send = send
        self._throttle = Throttle(interval_s)
        self._detokenizer = IncrementalDetokenizer(token_bytes)
        self._first = True
        self._events: list[StepEvent] = []
        self._times: list[float] = []
        self._pieces: list[str] = []
        self._from_draft: list[bool] = []

    def __call__(self, event: StepEvent) -> None:
        now = time.perf_counter()
        self._events.append(event)
        self._times.append(now)
        for token, drafted in zip(event.tokens, event.from_draft):
            self._pieces.append(self._detokenizer.push([token]))
            self._from_draft.append(drafted)
        if event.finished:
            self._pieces[-1] += self._detokenizer.flush()
        if event.finished or self._throttle.due(now):
            self.flush()

    def flush(self) -> None:
        if not self._events:
            return
        batch = StreamBatch(self.job_id, self.label, self.k, self._first, tuple(self._events), tuple(self._times),
                            tuple(self._pieces), tuple(self._from_draft))
        self._first = False
        self._events, self._times, self._pieces, self._from_draft = [], [], [], []
        self._throttle.mark()
        self._send(batch)


# --- load ----------------------------------------------------------------------
def is_hf_target(target: str) -> bool:
    """A Hugging Face folder runs on the PyTorch engine; a GGUF file on llama.cpp."""
    return target == DEMO_HF or os.path.isdir(target)


def resolve_demo(target: str, draft: Optional[str], demo_size: str,
                 progress: Callable[[str], None]) -> tuple[str, Optional[str]]:
    """Replace the demo placeholders by the demo family's files (building them if needed):
    for a PyTorch target the demo draft is its HF folder, and DEMO_DFLASH its DFlash drafter."""
    demo_values = (DEMO, DEMO_HF, DEMO_DFLASH)
    if target not in demo_values and draft not in demo_values:
        return target, draft
    from specdesk.app.demo.install import build_family

    family = build_family(small=demo_size == "small", progress=progress)
    hf = is_hf_target(target)
    targets = {DEMO: family["target_gguf"], DEMO_HF: family["target_hf"]}
    drafts = {DEMO: family["draft_hf"] if hf else family["draft_gguf"], DEMO_DFLASH: family.get("dflash_hf")}
    if draft == DEMO_DFLASH and not hf:
        raise SpecDeskError("the demo DFlash drafter runs on the PyTorch engine: choose the demo target "
                            "(PyTorch) or a Hugging Face model folder as the target")
    if draft == DEMO_DFLASH and not drafts[DEMO_DFLASH]:
        raise SpecDeskError("this demo family has no DFlash drafter: rebuild it with `specdesk demo build`")
    return targets.get(target, target), drafts.get(draft, draft)


def open_engine(target: str, n_ctx: int, threads: int, progress: Callable[[float], None],
                cancel: Optional[threading.Event] = None):
    """The engine in its own process: a model that aborts or hangs there never takes the window down."""
    from specdesk.app.engine_client import EngineClient

    return EngineClient(target, kind="torch" if os.path.isdir(target) else "llama", n_ctx=n_ctx, n_threads=threads,
                        progress=progress, cancel=cancel)


def drafter_kind(path: str) -> str:
    """"dflash" or "eagle3" for a model-native drafter (a folder or GGUF), else "draft"."""
    if os.path.isdir(path):
        try:
            import json

            config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return "draft"
        architectures = config.get("architectures") or []
        if "DFlashDraftModel" in architectures:
            return "dflash"
        if any("Eagle3" in a for a in architectures):
            return "eagle3"
        return "draft"
    from specdesk.engines.llama.binding import gguf_header

    try:
        arch = gguf_header(path).fields.get("general.architecture")
    except (SpecDeskError, OSError):  # not readable here: the engine's own load gives the clear error
        return "draft"
    return arch if arch in ("dflash", "eagle3") else "draft"


def load_drafter(engine, path: str, progress: Callable[[float], None]) -> str:
    """Load a draft model or a native drafter for the engine; returns its kind."""
    kind = drafter_kind(path)
    if kind == "draft":
        if engine.name == "torch":
            engine.load_draft(path)
        else:
            engine.load_draft(path, progress=progress)
    else:
        engine.load_native(kind, path)
    return kind


def same_file(a, b) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


def describe_engine(engine, draft_path: Optional[str], verdict_paths: dict[str, str],
                    draft_kind: str = "draft") -> ModelInfo:
    """What is loaded, from the engine host's facts (app/engine_host.engine_facts); `verdict_paths`
    maps draft choices to the GGUF files whose fit with the target the host checks."""
    facts = engine.facts(draft_path, draft_kind, verdict_paths)
    availability = facts["availability"]
    supported = tuple(m for m, why in availability.items() if why is None)
    unavailable = tuple((m, why) for m, why in availability.items() if why is not None)
    return ModelInfo(str(engine.target.path), draft_path, engine.name, supported, engine.n_ctx, facts["threads"],
                     facts["n_params"], facts["size_bytes"], facts["has_chat_template"], unavailable,
                     tuple(facts["verdicts"]))


# --- chat ----------------------------------------------------------------------
def chat_tokens(engine, messages: list[dict], max_tokens: int) -> tuple[list[int], int]:
    """The prompt for a conversation; the oldest turns go first when it outgrows the context."""
    from specdesk.app.prompting import fit_chat

    return fit_chat(engine, messages, reserve=min(max_tokens, engine.n_ctx // 2))


def run_chat(engine, messages: list[dict], spec: SpecConfig, sampling: SamplingParams, max_tokens: int,
             cancel: threading.Event, on_event: Callable[[StepEvent], None]) -> ChatResult:
    tokens, dropped = chat_tokens(engine, messages, max_tokens)
    request = GenerationRequest(tuple(tokens), max_tokens=max_tokens, sampling=sampling, spec=spec)
    return ChatResult(run_once(engine, request, cancel, on_event), len(tokens), dropped)


# --- compare and sweep ---------------------------------------------------------
def prompt_tokenizer(engine, chat: bool) -> Callable[[str], list[int]]:
    """With `chat`, a prompt is one user message in the model's chat template (as in the
    chat tab); without, it is raw text to continue."""
    if not chat:
        from specdesk.app.prompting import text_tokens

        return lambda text: text_tokens(engine, text)
    from specdesk.app.main import chat_prompt

    return lambda text: chat_prompt(engine, [{"role": "user", "content": text}])


def run_compare(engine, prompt: str, spec: SpecConfig, sampling: SamplingParams, max_tokens: int,
                cancel: threading.Event, batcher_for: Callable[[str, int], EventBatcher],
                chat: bool = True) -> CompareReport:
    if spec.method == "none":
        raise SpecDeskError("compare needs a speculation method: choose ngram, ngram-pool or draft")
    batchers: dict[str, EventBatcher] = {}

    def on_event(label: str, index: int, event: StepEvent) -> None:
        if label not in batchers:
            batchers[label] = batcher_for(label, 0 if label == "baseline" else spec.k)
        batchers[label](event)

    report = compare(engine, [prompt], spec, sampling, max_tokens, prompt_tokenizer(engine, chat), on_event, cancel)
    for batcher in batchers.values():
        batcher.flush()
    return report


def run_sweep(engine, prompt: str, spec: SpecConfig, sampling: SamplingParams, max_tokens: int,
              ks: Sequence[int], cancel: threading.Event,
              on_point: Callable[[SweepPoint], None], chat: bool = True) -> SweepResult:
    """Baseline once, then the speculative method at each k, on the same prompt."""
    if spec.method == "none":
        raise SpecDeskError("the k sweep needs a speculation method: choose ngram, ngram-pool or draft")
    tokens = prompt_tokenizer(engine, chat)(prompt)
    warm_up(engine, tokens, spec, sampling)

    def once(config: SpecConfig) -> RunStats:
        request = GenerationRequest(tuple(tokens), max_tokens=max_tokens, sampling=sampling, spec=config)
        return run_once(engine, request, cancel).stats

    baseline = once(dataclasses.replace(spec, method="none"))
    on_point(SweepPoint(0, baseline))
    points = []
    for k in ks:
        if cancel.is_set():
            break
        if spec.method == "ngram-pool":
            engine.reset_chat()  # the pool learns from every run: each k starts from the same state
        point = SweepPoint(k, once(dataclasses.replace(spec, k=k)))
        points.append(point)
        on_point(point)
    return SweepResult(spec.method, baseline, tuple(points))


def file_label(path: Optional[str]) -> str:
    return Path(path).name if path else "none"
