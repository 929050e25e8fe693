"""Method auto's costs on this machine: measured by a probe of their own, kept in a cache,
and learned from every pass auto runs.

Costs are this machine's now: a target pass (with verification) over n = 1..K+1 tokens, and
each method's drafting time per token. A short probe per target, engine, device, threads and
method set seeds them (`measure_costs`); it is a job of its own, run through the proposer
factory's `prepare` before the first auto reply and never inside one, and what it measured is
kept in memory and, where the engine names a folder, in a JSON file there (`load_or_measure`).
Every pass auto then runs is a measurement that updates them (`CostModel`: medians over a
short window), so a machine that gets busier or quieter is followed within a few steps, and
the file keeps what the replies learned. engines/speculation/chooser.py reads them.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import deque
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np

from ..methods import method_info
from ..types import Draft, SamplingParams
from .chooser import Costs, implausible_size
from .protocols import target_observer
from .step import verified_step

PROBE_TEXT = ("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
              "for i in range(10):\n    print(i, fibonacci(i))\n")

WINDOW = 16  # recent measurements kept per pass size and per method
MIN_SAMPLES = 3  # a size's own median is trusted from this many measurements on
SAVE_EVERY = 64  # recorded passes between writes of the learned costs to the cost cache
# The probe is taken again (before the next reply) when the passes measured since moved this far
# from it, either way: it caught a busy moment (or the machine's state has changed since), and
# the sizes and drafting costs replies never measure would still be priced from it.
DRIFT = 1.5
# Drafting is timed over this many proposals (the fastest kept): replies do not correct it (see
# auto.LEARN_DRAFTING), and one slow proposal of a few milliseconds priced the draft model at
# twice its cost for a whole run.
DRAFT_REPEATS = 5
PROBE_ROUNDS = 3  # extra rounds of the pass probe when it caught a busy moment (chooser.implausible_size)
REPROBE_AFTER = 24  # passes recorded since the last probe before another may be taken (about one reply)
# A size not run for this many passes is priced again from the probe's shape (its window is
# emptied when it runs again): passes of a size measured in a busy moment priced it for that
# moment, and auto, shunning the size, would never run it again to learn that it got cheaper.
STALE_AFTER = 8 * WINDOW


def median(values) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else 0.5 * (ordered[middle - 1] + ordered[middle])


def _interpolate(count: int, sizes: Sequence[int], values: Sequence[float]) -> list[float]:
    """values (at the ascending sizes) at n = 1..count: linear between sizes, the nearest one's
    beyond them, 1 where there are none (numpy.interp's rule, in plain floats: the estimate is
    remade whenever a pass moves a median, and numpy's per-call cost there was most of it)."""
    if not sizes:
        return [1.0] * count
    out = []
    j = 0
    for n in range(1, count + 1):
        if n <= sizes[0]:
            out.append(values[0])
        elif n >= sizes[-1]:
            out.append(values[-1])
        else:
            while sizes[j + 1] < n:
                j += 1
            low, high = sizes[j], sizes[j + 1]
            out.append(values[j] + (values[j + 1] - values[j]) * (n - low) / (high - low))
    return out


class CostModel:
    """Pass and drafting costs learned from the passes auto runs, seeded by a probe.

    Every verified pass is a measurement: its size (tokens in it), its seconds, the chosen
    method's drafting seconds per token, and a fed hidden-state drafter's catch-up. Each is
    kept as the median of a short window, so a single slow pass (a scheduling hiccup) moves
    nothing while a lasting change of the machine (load, battery, throttling) shows within a
    few steps. A size not run lately (STALE_AFTER) is the probe's cost for it, scaled by how far
    the sizes around it that were run moved from the probe: the probe gives the shape, the
    passes the level."""

    def __init__(self, probe: Costs, on_update=None):
        self.probe = probe
        self.passes = [deque(maxlen=WINDOW) for _ in probe.pass_s]  # size n = index + 1
        self._medians = [0.0] * len(probe.pass_s)  # of each size's window, kept as it is recorded
        self.last_run = [0] * len(probe.pass_s)  # passes_seen when each size was last recorded
        self.drafting = {m: deque(maxlen=WINDOW) for m in probe.draft_token_s}
        self.observing = {m: deque(maxlen=WINDOW) for m in probe.observe_s}
        self.recorded = 0
        self.passes_seen = 0  # passes recorded in all
        self.since_probe = 0  # passes recorded since the probe (or the last one taken again)
        self.probes = 1
        self._costs: Optional[Costs] = probe
        self._last = probe  # the estimate last made (last_costs)
        self._estimated_from: tuple = ()  # the learned sizes' medians it was made from (_passes_key)
        self._on_update = on_update  # called with the learned Costs every SAVE_EVERY passes

    def record_pass(self, n_tokens: int, seconds: float) -> None:
        if 1 <= n_tokens <= len(self.passes) and seconds > 0:
            if self._stale(n_tokens):
                self.passes[n_tokens - 1].clear()
            self.passes[n_tokens - 1].append(seconds)
            self._medians[n_tokens - 1] = median(self.passes[n_tokens - 1])
            self.passes_seen += 1
            self.last_run[n_tokens - 1] = self.passes_seen
            self.since_probe += 1
            # The estimate reads only the learned sizes' medians: made again when they moved
            # (in a window of WINDOW passes, often they did not), not at every pass.
            self._changed(stale=self._passes_key() != self._estimated_from)

    def record_drafting(self, method: str, drafted: int, seconds: float) -> None:
        if method in self.drafting and drafted > 0 and seconds >= 0:
            self.drafting[method].append((drafted, seconds))
            self._changed()

    def record_observing(self, method: str, seconds: float) -> None:
        if method in self.observing and seconds >= 0:
            self.observing[method].append(seconds)
            self._changed()

    def _passes_key(self) -> tuple:
        return tuple((n, self._medians[n - 1]) for n in self.learned_sizes())

    def _changed(self, stale: bool = True) -> None:
        if stale:
            self._costs = None
        self.recorded += 1
        if self._on_update is not None and self.recorded % SAVE_EVERY == 0:
            self._on_update(self.costs())

    def drifted(self) -> bool:
        """Whether the passes measured since the probe moved more than DRIFT from it (the median
        over the sizes measured), after REPROBE_AFTER of them: a probe taken while the machine
        was busy prices the sizes and the drafting that replies never run for that busy moment."""
        if self.since_probe < REPROBE_AFTER:
            return False
        ratios = [self._medians[n - 1] / self.probe.pass_s[n - 1] for n in self.learned_sizes()]
        if not ratios:
            return False
        moved = median(ratios)
        return moved > DRIFT or moved < 1.0 / DRIFT

    def reseed(self, probe: Costs) -> None:
        """A new probe's costs as the prior; what passes measured is kept (it is recent)."""
        self.probe = probe
        self.drafting = {m: deque(self.drafting.get(m, ()), maxlen=WINDOW) for m in probe.draft_token_s}
        self.observing = {m: deque(self.observing.get(m, ()), maxlen=WINDOW) for m in probe.observe_s}
        self.since_probe = 0
        self.probes += 1
        self._costs = None

    def _stale(self, n: int) -> bool:
        return self.passes_seen - self.last_run[n - 1] >= STALE_AFTER

    def learned_sizes(self) -> list[int]:
        """The sizes priced from their own passes: run MIN_SAMPLES times, and lately."""
        return [n for n, window in enumerate(self.passes, start=1)
                if len(window) >= MIN_SAMPLES and not self._stale(n)]

    def costs(self) -> Costs:
        """The current estimate (cached until a measurement moves it: a learned size's median,
        the set of learned sizes, a drafting or observing window, a new probe)."""
        if self._costs is None:
            self._costs = self._last = self._estimate()
            self._estimated_from = self._passes_key()
        return self._costs

    def last_costs(self) -> Costs:
        """The estimate last made, without making a new one for the passes recorded since (a pass
        or so behind): enough to price what a step cost, where one pass in a median of WINDOW
        changes next to nothing, and free on a step that chose nothing."""
        return self._last

    def _estimate(self) -> Costs:
        probe = self.probe.pass_s
        learned = {n: self._medians[n - 1] for n in self.learned_sizes()}
        sizes = sorted(learned)
        # How far each measured size moved from the probe, interpolated between measured sizes
        # (the nearest one's beyond them): under load a long pass moves less than a short one.
        ratios = [learned[n] / probe[n - 1] for n in sizes]
        moved_by = _interpolate(len(probe), sizes, ratios)
        pass_s = [learned[n] if n in learned else probe[n - 1] * moved_by[n - 1] for n in range(1, len(probe) + 1)]
        # Larger passes never cost less: where noise says so, the smaller size takes the larger's time.
        for i in range(len(pass_s) - 2, -1, -1):
            pass_s[i] = min(pass_s[i], pass_s[i + 1])

        def level(windows, prior):
            return {m: (median(windows[m]) if len(windows[m]) >= MIN_SAMPLES else s) for m, s in prior.items()}

        # Drafting runs on the same machine as the passes: without measurements of its own it
        # moves as the passes moved from the probe (a probe taken while the machine was busy
        # overstates both, and the passes that follow correct both).
        moved = median(ratios) if ratios else 1.0
        per_token = {m: t * moved for m, t in self.probe.draft_token_s.items()}
        per_step = {m: t * moved for m, t in self.probe.draft_step_s.items()}
        for method, window in self.drafting.items():
            if len(window) >= MIN_SAMPLES:
                per_token[method], per_step[method] = self._drafting_line(window, self.probe.draft_token_s[method])
        return Costs(tuple(pass_s), per_token, level(self.observing, self.probe.observe_s), per_step)

    @staticmethod
    def _drafting_line(window, probe_per_token: float) -> tuple[float, float]:
        """(seconds per drafted token, seconds per step besides) from (drafted, seconds) steps: a
        line through them where steps drafted different lengths; else the probe's per-token
        cost, with what the steps took beyond it as the per-step part."""
        counts = np.array([n for n, _ in window], dtype=float)
        seconds = np.array([t for _, t in window], dtype=float)
        if len(set(counts)) >= 2:
            slope, intercept = np.polyfit(counts, seconds, 1)
            if slope >= 0 and intercept >= 0:
                return float(slope), float(intercept)
        per_step = median(list(seconds - probe_per_token * counts))
        return probe_per_token, max(0.0, per_step)

    def describe(self) -> dict:
        """What auto used: the pass costs (ms per size) and which sizes were measured in passes."""
        costs = self.costs()
        return {"pass_ms": [round(s * 1e3, 3) for s in costs.pass_s], "measured_sizes": self.learned_sizes(),
                "draft_token_ms": {m: round(s * 1e3, 3) for m, s in costs.draft_token_s.items()},
                "draft_step_ms": {m: round(s * 1e3, 3) for m, s in costs.draft_step_s.items()},
                "observe_ms": {m: round(s * 1e3, 3) for m, s in costs.observe_s.items()},
                "passes_recorded": sum(len(w) for w in self.passes), "probes": self.probes}


_models: dict[str, CostModel] = {}  # cost key -> the model every run on those models learns into


def cost_key(engine, methods: Sequence[str], max_k: int, draft_path: Optional[str]) -> str:
    """What the costs depend on: the target file, the engine, its device and threads, where the
    target's and the drafts' layers sit (the placement: a pass over k tokens costs ~2x one token
    on two CPU cores, a few percent more on a GPU), the methods measured (and the draft model's
    file), and K."""
    def file_id(path) -> str:
        p = Path(path)
        try:
            stat = p.stat()
            return f"{p.resolve()}:{stat.st_size}:{int(stat.st_mtime)}"
        except OSError:
            return str(p)

    parts = [engine.name, file_id(engine.target.path), getattr(engine, "device_description", "cpu"),
             str(getattr(engine, "n_threads", "")), getattr(engine, "placement_key", ""),
             ",".join(methods), str(max_k),
             file_id(draft_path) if draft_path else "-"]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


def load_or_measure(engine, proposers: Mapping[str, object], max_k: int, draft_path: Optional[str],
                    observer: Optional[str] = None) -> CostModel:
    """The cost model for this engine and method set (`proposers`: method -> its proposer,
    `observer`: the one that reads the target's hidden states): from memory, seeded from the
    engine's cost folder (`engine.cost_cache_dir`, when set), else from a short probe now.
    What the replies measure updates it, and the folder's copy every SAVE_EVERY passes; when
    they drifted far from the probe (CostModel.drifted), the probe is taken again now."""
    key = cost_key(engine, list(proposers), max_k, draft_path)
    folder = getattr(engine, "cost_cache_dir", None)
    path = Path(folder) / f"costs-{key}.json" if folder else None
    if key in _models:
        model = _models[key]
        if model.drifted():
            model.reseed(measure_costs(engine, proposers, max_k, observer))
            _store(path, model.costs())
        return model
    costs = None
    if path is not None and path.is_file():
        try:
            costs = Costs.from_json(json.loads(path.read_text(encoding="utf-8")))
            if len(costs.pass_s) != max_k + 1 or set(costs.draft_token_s) != set(proposers):
                costs = None
        except (OSError, ValueError, KeyError, TypeError):
            costs = None  # a damaged cache file is measured again
    if costs is None:
        costs = measure_costs(engine, proposers, max_k, observer)
        _store(path, costs)
    model = CostModel(costs, on_update=lambda learned: _store(path, learned))
    _models[key] = model
    return model


def measured(engine, methods: Sequence[str], max_k: int, draft_path: Optional[str]) -> Optional[CostModel]:
    """The cost model `load_or_measure` keeps for this engine and method set, None before it ran."""
    return _models.get(cost_key(engine, methods, max_k, draft_path))


def _store(path: Optional[Path], costs: Costs) -> None:
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(costs.to_json()), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache folder costs a measurement next time, nothing more


def measure_costs(engine, proposers: Mapping[str, object], max_k: int, observer: Optional[str] = None,
                  repeats: int = 2) -> Costs:
    """Time the target pass (with greedy verification) over 1..K+1 tokens on a probe prompt,
    the fastest of `repeats` (never more than a larger size's), and each proposer's drafting
    per token on the same prompt. A seed only: the passes auto then runs correct it
    (CostModel), so it is kept short rather than exact."""
    probe = list(engine.tokenize(PROBE_TEXT))
    while len(probe) < max_k + 8:
        probe = probe + probe
    best = _pass_times(engine, probe, max_k, repeats)
    draft_token_s, observe_s = {}, {}
    for method, proposer in proposers.items():
        if method == observer:
            draft_token_s[method], observe_s[method] = _observer_costs(engine, proposer, probe, max_k, best)
        else:
            draft_token_s[method] = _drafting_cost(method, proposer, probe, max_k, max(repeats, DRAFT_REPEATS))
    return Costs(tuple(best), draft_token_s, observe_s)


def _pass_times(engine, probe: list[int], max_k: int, repeats: int) -> list[float]:
    """Seconds for a verified pass over 1..K+1 tokens: the fastest of `repeats` rounds, and of
    up to PROBE_ROUNDS more when a size cost more than the physics allows (chooser.implausible_size:
    a busy moment, not the arithmetic). Still implausible after them, a size is priced at n
    passes over one token: no draft pays there until the replies' own passes say otherwise.
    Each timed pass follows an untimed one of its size: llama.cpp builds a pass's graph again
    when the size changes (up to a quarter of a one-token pass, benchmarks/pass_cost.py), and
    plain decoding, like a draft of steady length, runs passes of one size in a row."""
    prompt, tail = probe[:-(max_k + 1)], probe[-(max_k + 1):]
    engine.prefill(prompt, None)
    ctx = engine.context
    n_past = ctx.n_past
    rng = np.random.default_rng(0)
    best = [float("inf")] * (max_k + 1)
    for _attempt in range(1 + PROBE_ROUNDS):
        for _ in range(repeats):
            for n in range(1, max_k + 2):
                for timed in (False, True):
                    started = time.perf_counter()
                    output = engine.target_pass([prompt[-1], *tail[:n - 1]], None)
                    engine.verify_pass(Draft(tuple(tail[:n - 1])), output, SamplingParams(), rng)
                    if timed:
                        best[n - 1] = min(best[n - 1], time.perf_counter() - started)
                    ctx.rollback(n_past)
        # A pass over more tokens never costs less: a size measured above a larger one caught a
        # slower moment (noise only adds time), so it takes the larger size's time.
        for n in range(max_k - 1, -1, -1):
            best[n] = min(best[n], best[n + 1])
        if implausible_size(best) is None:
            return best
    return [min(t, n * best[0]) for n, t in enumerate(best, start=1)]


def _observer_costs(engine, proposer, probe: list[int], max_k: int, pass_s: list[float],
                    max_tokens: int = 36) -> tuple[float, float]:
    """A hidden-state drafter drafts only from the target's rows, so it is timed over a few
    verified steps of its own on the probe: seconds per drafted token, and the median time its
    steps' target passes took beyond a plain pass of the same size (its catch-up on the
    target's rows)."""
    k = min(2, max_k)  # the sizes at which a fed drafter pays or not; its catch-up does not depend on k
    context = list(probe[:-max_k])
    observer = target_observer(proposer)
    proposer.begin(context)
    engine.prefill(context, observer)
    rng = np.random.default_rng(0)
    costs = Costs(tuple(pass_s), {})
    drafted = seconds = 0.0
    beyond = []
    start = len(context)
    while len(context) - start < max_tokens and len(context) + k + 1 < engine.n_ctx:
        step = verified_step(engine, proposer, observer, context, k, SamplingParams(), rng)
        drafted += len(step.draft.tokens)
        seconds += step.draft_s
        beyond.append(max(0.0, step.pass_s + step.observe_s - costs.pass_cost(1 + len(step.draft.tokens))))
        proposer.accept(step.accepted, step.kept)
        context.extend(step.kept)
    observe = float(np.median(beyond[1:] or beyond)) if beyond else 0.0
    return (seconds / drafted if drafted else 0.0), observe


def _drafting_cost(method: str, proposer, probe: list[int], max_k: int, repeats: int) -> float:
    """Seconds per drafted token, proposing on the probe (the n-gram pool through a fresh
    pool, so the engine's learns nothing from the probe)."""
    if method_info(method).learns:
        proposer = type(proposer)()  # a fresh one of its kind
    proposer.begin(probe)
    proposer.propose(probe, max_k)  # the first call catches up on the probe: not a step's cost
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        draft = proposer.propose(probe, max_k)
        elapsed = time.perf_counter() - started
        if draft.tokens:
            best = min(best, elapsed / len(draft.tokens))
        else:
            best = min(best, elapsed)
    return best if best != float("inf") else 0.0

