"""The `auto` method: each step, the method and k with the highest expected tokens per second.

Costs are this machine's now: a target pass (with verification) over n = 1..K+1 tokens, and
each method's drafting time per token. A short probe per target, engine, device, threads and
method set seeds them (`measure_costs`, kept in memory and, where the engine names a folder,
in a JSON file there); every pass auto then runs is a measurement that updates them
(`CostModel`: medians over a short window), so a machine that gets busier or quieter is
followed within a few steps, and the file keeps what the replies learned. Acceptance is each method's running estimate per draft position from the
steps it drafted (`AcceptanceEstimate`). `choose` is a pure function of the two.

Lossless like every method: a step's choice depends only on the costs and on what earlier
steps committed, never on that step's target pass, and each step verifies its draft exactly
as the chosen method would alone. Deterministic for the same costs, inputs and seed.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np

from ..types import Draft, SamplingParams
from .stats import ProposerCounters

AUTO_METHODS = ("ngram", "ngram-pool", "draft", "mtp")  # the order ties are broken in
PRIOR_ACCEPTANCE = 0.6  # per-position acceptance assumed before a method has drafted
PRIOR_WEIGHT = 2.0  # how many observed steps the prior is worth
DECAY = 0.97  # older steps count less, so a change of text shows within a few dozen steps
REPROBE_EVERY = 8  # a method unused for this many steps drafts once, so it can come back
# A hidden-state drafter (MTP) costs a catch-up on every target pass even when it does not
# draft: not chosen on its merits for this many steps, it is let go for the rest of the run;
# one that could not win even at this acceptance is not fed at all.
RETIRE_AFTER = 6
OPTIMISTIC_ACCEPTANCE = 0.8
PROBE_TEXT = ("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
              "for i in range(10):\n    print(i, fibonacci(i))\n")


@dataclass(frozen=True)
class Costs:
    """Measured seconds on this machine."""

    pass_s: tuple[float, ...]  # (K+1,) a target pass over n = 1..K+1 tokens, verification included
    draft_token_s: Mapping[str, float]  # method -> seconds drafting per drafted token
    # method -> seconds a hidden-state drafter adds to every target pass while it is fed (its catch-up)
    observe_s: Mapping[str, float] = field(default_factory=dict)
    # method -> seconds a drafting step costs besides its tokens (a draft model's catch-up on the
    # tokens committed since its last step, the chooser itself)
    draft_step_s: Mapping[str, float] = field(default_factory=dict)

    def drafting_cost(self, method: str, drafted: float) -> float:
        return self.draft_step_s.get(method, 0.0) + self.draft_token_s.get(method, 0.0) * drafted

    def pass_cost(self, n: float) -> float:
        """A pass over n tokens (fractional n: linear between measured sizes, the last size's
        cost beyond them). Plain floats: the chooser calls this K x methods times a step."""
        last = len(self.pass_s)
        if n >= last:
            return self.pass_s[-1]
        low = max(int(n), 1)
        fraction = n - low
        return self.pass_s[low - 1] + fraction * (self.pass_s[low] - self.pass_s[low - 1])

    def to_json(self) -> dict:
        return {"pass_s": list(self.pass_s), "draft_token_s": dict(self.draft_token_s),
                "observe_s": dict(self.observe_s), "draft_step_s": dict(self.draft_step_s)}

    @classmethod
    def from_json(cls, data: dict) -> "Costs":
        return cls(tuple(float(x) for x in data["pass_s"]),
                   {str(m): float(s) for m, s in data["draft_token_s"].items()},
                   {str(m): float(s) for m, s in data.get("observe_s", {}).items()},
                   {str(m): float(s) for m, s in data.get("draft_step_s", {}).items()})


@dataclass
class AcceptanceEstimate:
    """One method's running acceptance per draft position: of the steps where it drafted and
    that reached position i (every earlier draft token accepted), the share whose token i was
    drafted and accepted (a draft shorter than asked counts as a rejection there); and how
    often it drafted at all (an n-gram lookup often finds nothing: a miss). Older steps decay."""

    max_k: int
    reached: np.ndarray = field(init=False)  # (max_k,)
    accepted: np.ndarray = field(init=False)  # (max_k,)
    asked: float = 0.0
    drafted: float = 0.0
    tries: float = 0.0
    misses: float = 0.0

    def __post_init__(self) -> None:
        self.reached = np.zeros(self.max_k)
        self.accepted = np.zeros(self.max_k)
        self._summary: Optional[tuple[list[float], float]] = None

    def record(self, k: int, drafted: int, accepted: int) -> None:
        self._summary = None
        self.reached *= DECAY
        self.accepted *= DECAY
        self.tries, self.misses = self.tries * DECAY + 1, self.misses * DECAY + (drafted == 0)
        self.asked, self.drafted = self.asked * DECAY, self.drafted * DECAY
        if drafted == 0:
            return
        self.asked, self.drafted = self.asked + k, self.drafted + drafted
        reached = min(k, accepted + 1)
        self.reached[:reached] += 1
        self.accepted[:accepted] += 1

    def per_position(self) -> np.ndarray:
        """(max_k,) conditional acceptance of position i given positions < i were accepted."""
        return (self.accepted + PRIOR_WEIGHT * PRIOR_ACCEPTANCE) / (self.reached + PRIOR_WEIGHT)

    def draft_share(self) -> float:
        """Drafted tokens per token asked for, when it drafted (n-gram methods often find fewer)."""
        return (self.drafted + PRIOR_WEIGHT) / (self.asked + PRIOR_WEIGHT)

    def hit_rate(self) -> float:
        """The share of steps it drafted anything (the prior: it does)."""
        return (self.tries - self.misses + PRIOR_WEIGHT) / (self.tries + PRIOR_WEIGHT)

    def summary(self) -> tuple[list[float], float, float]:
        """(per_position() as floats, draft_share(), hit_rate()), computed once per recorded step."""
        if self._summary is None:
            self._summary = ([float(a) for a in self.per_position()], self.draft_share(), self.hit_rate())
        return self._summary


@dataclass(frozen=True)
class Choice:
    method: str  # "none" or a method
    k: int
    expected_speedup: float  # over a plain pass per token, from the costs and estimates
    reason: str
    fallback: Optional[tuple[str, int]] = None  # (method, k) that drafts when this one finds nothing


WINDOW = 16  # recent measurements kept per pass size and per method
# Drafting costs from the steps themselves: off, as measured on held-out prompts. A step's
# drafting includes the draft model catching up on what was committed since, which in a run
# that mixes methods grows with how rarely it drafts; learned, it made auto shun the draft
# model (0.88-0.91x of the best fixed setting, against 0.99x with the probe's costs).
LEARN_DRAFTING = False
MIN_SAMPLES = 3  # a size's own median is trusted from this many measurements on
SAVE_EVERY = 64  # recorded passes between writes of the learned costs to the cost cache


def _median(values) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else 0.5 * (ordered[middle - 1] + ordered[middle])


class CostModel:
    """Pass and drafting costs learned from the passes auto runs, seeded by a probe.

    Every verified pass is a measurement: its size (tokens in it), its seconds, the chosen
    method's drafting seconds per token, and a fed hidden-state drafter's catch-up. Each is
    kept as the median of a short window, so a single slow pass (a scheduling hiccup) moves
    nothing while a lasting change of the machine (load, battery, throttling) shows within a
    few steps. A size not run lately is the probe's cost for it, scaled by how far the sizes
    around it that were run moved from the probe: the probe gives the shape, the passes the level."""

    def __init__(self, probe: Costs, on_update=None):
        self.probe = probe
        self.passes = [deque(maxlen=WINDOW) for _ in probe.pass_s]  # size n = index + 1
        self.drafting = {m: deque(maxlen=WINDOW) for m in probe.draft_token_s}
        self.observing = {m: deque(maxlen=WINDOW) for m in probe.observe_s}
        self.recorded = 0
        self._costs: Optional[Costs] = probe
        self._on_update = on_update  # called with the learned Costs every SAVE_EVERY passes

    def record_pass(self, n_tokens: int, seconds: float) -> None:
        if 1 <= n_tokens <= len(self.passes) and seconds > 0:
            self.passes[n_tokens - 1].append(seconds)
            self._changed()

    def record_drafting(self, method: str, drafted: int, seconds: float) -> None:
        if method in self.drafting and drafted > 0 and seconds >= 0:
            self.drafting[method].append((drafted, seconds))
            self._changed()

    def record_observing(self, method: str, seconds: float) -> None:
        if method in self.observing and seconds >= 0:
            self.observing[method].append(seconds)
            self._changed()

    def _changed(self) -> None:
        self._costs = None
        self.recorded += 1
        if self._on_update is not None and self.recorded % SAVE_EVERY == 0:
            self._on_update(self.costs())

    def learned_sizes(self) -> list[int]:
        return [n for n, window in enumerate(self.passes, start=1) if len(window) >= MIN_SAMPLES]

    def costs(self) -> Costs:
        """The current estimate (cached until the next measurement)."""
        if self._costs is None:
            self._costs = self._estimate()
        return self._costs

    def _estimate(self) -> Costs:
        probe = self.probe.pass_s
        learned = {n: _median(self.passes[n - 1]) for n in self.learned_sizes()}
        sizes = sorted(learned)
        # How far each measured size moved from the probe, interpolated between measured sizes
        # (the nearest one's beyond them): under load a long pass moves less than a short one.
        ratios = [learned[n] / probe[n - 1] for n in sizes]
        pass_s = [learned[n] if n in learned else
                  probe[n - 1] * (float(np.interp(n, sizes, ratios)) if sizes else 1.0)
                  for n in range(1, len(probe) + 1)]
        # Larger passes never cost less: where noise says so, the smaller size takes the larger's time.
        for i in range(len(pass_s) - 2, -1, -1):
            pass_s[i] = min(pass_s[i], pass_s[i + 1])

        def level(windows, prior):
            return {m: (_median(windows[m]) if len(windows[m]) >= MIN_SAMPLES else s) for m, s in prior.items()}

        # Drafting runs on the same machine as the passes: without measurements of its own it
        # moves as the passes moved from the probe (a probe taken while the machine was busy
        # overstates both, and the passes that follow correct both).
        moved = _median(ratios) if ratios else 1.0
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
        per_step = _median(list(seconds - probe_per_token * counts))
        return probe_per_token, max(0.0, per_step)

    def describe(self) -> dict:
        """What auto used: the pass costs (ms per size) and which sizes were measured in passes."""
        costs = self.costs()
        return {"pass_ms": [round(s * 1e3, 3) for s in costs.pass_s], "measured_sizes": self.learned_sizes(),
                "draft_token_ms": {m: round(s * 1e3, 3) for m, s in costs.draft_token_s.items()},
                "draft_step_ms": {m: round(s * 1e3, 3) for m, s in costs.draft_step_s.items()},
                "observe_ms": {m: round(s * 1e3, 3) for m, s in costs.observe_s.items()},
                "passes_recorded": sum(len(w) for w in self.passes)}


def expected_tokens(per_position: Sequence[float], k: int) -> float:
    """Tokens one step commits: the target's own plus each draft position reached and accepted."""
    tokens, reach = 1.0, 1.0
    for rate in per_position[:k]:
        reach *= rate
        tokens += reach
    return tokens


def expected_speedup(costs: Costs, method: str, per_position: Sequence[float], draft_share: float, k: int,
                     extra_s: float = 0.0) -> float:
    """The speedup of a step where `method` drafts (up to k tokens), over a plain pass per token."""
    return _speedups(costs, method, per_position, draft_share, k, extra_s)[k - 1]


def _outcomes(costs: Costs, method: str, per_position: Sequence[float], draft_share: float,
              max_k: int, extra_s: float = 0.0) -> list[tuple[float, float]]:
    """(expected tokens, seconds) of a step where `method` drafts, for k = 1..max_k, in one walk
    over the positions; `extra_s`: what every step costs besides (a fed hidden-state drafter's
    catch-up). Plain floats: the chooser calls this for every method each step."""
    draft_s = costs.draft_token_s.get(method, 0.0)
    step_s = costs.draft_step_s.get(method, 0.0) + extra_s
    tokens, reach, out = 1.0, 1.0, []
    for k in range(1, max_k + 1):
        reach *= per_position[k - 1]
        tokens += reach
        drafted = draft_share * k
        out.append((tokens, step_s + draft_s * drafted + costs.pass_cost(1.0 + drafted)))
    return out


def _speedups(costs: Costs, method: str, per_position: Sequence[float], draft_share: float,
              max_k: int, extra_s: float = 0.0) -> list[float]:
    """expected_speedup for k = 1..max_k."""
    return [tokens * costs.pass_s[0] / seconds
            for tokens, seconds in _outcomes(costs, method, per_position, draft_share, max_k, extra_s)]


def _mix(hit: float, drafted: tuple[float, float], missed: tuple[float, float]) -> tuple[float, float]:
    """(tokens, seconds) per step of a method that drafts with probability `hit` and otherwise
    leaves the step to `missed`."""
    return (hit * drafted[0] + (1 - hit) * missed[0], hit * drafted[1] + (1 - hit) * missed[1])


def choose(costs: Costs, estimates: Mapping[str, AcceptanceEstimate], max_k: int, extra_s: float = 0.0) -> Choice:
    """The (method, k) with the highest expected tokens per second, or no speculation when
    nothing is expected to beat a plain pass (`extra_s`: a cost every step pays whatever is
    chosen). A method that may find nothing to draft (n-gram lookups) is valued with its
    fallback for those steps: the best other method on its own, or a plain pass. Ties go to no
    speculation, then to the method listed first, then to the smaller k."""
    plain = (1.0, costs.pass_s[0] + extra_s)
    rate = costs.pass_s[0]
    # Each method on its own (a miss is a plain pass after the lookup): its best (tokens, seconds, k).
    alone: dict[str, tuple[float, float, int]] = {}
    outcomes: dict[str, list[tuple[float, float]]] = {}
    for method, estimate in estimates.items():
        per_position, share, hit = estimate.summary()
        outcomes[method] = _outcomes(costs, method, per_position, share, max_k, extra_s)
        miss = (1.0, plain[1] + costs.draft_token_s.get(method, 0.0))
        for k, outcome in enumerate(outcomes[method], start=1):
            tokens, seconds = _mix(hit, outcome, miss)
            if method not in alone or tokens / seconds > alone[method][0] / alone[method][1]:
                alone[method] = (tokens, seconds, k)
    best: Optional[tuple[float, str, int, Optional[tuple[str, int]]]] = None
    for method, estimate in estimates.items():
        hit = estimate.summary()[2]
        others = [(t, sec, m, k) for m, (t, sec, k) in alone.items() if m != method and t / sec > plain[0] / plain[1]]
        fallback = max(others, key=lambda o: o[0] / o[1], default=None)
        missed = (fallback[0], fallback[1]) if fallback else plain
        missed = (missed[0], missed[1] + costs.draft_token_s.get(method, 0.0))
        for k, outcome in enumerate(outcomes[method], start=1):
            tokens, seconds = _mix(hit, outcome, missed)
            speedup = tokens * rate / seconds
            if best is None or speedup > best[0]:
                best = (speedup, method, k, (fallback[2], fallback[3]) if fallback else None)
    if best is None:
        return Choice("none", 0, 1.0, "no speculation: no method available")
    speedup, method, k, fallback = best
    plain_speedup = plain[0] * rate / plain[1]
    if speedup <= plain_speedup:
        return Choice("none", 0, plain_speedup, f"no speculation: best expected {speedup:.2f}x ({method}, k = {k})")
    return Choice(method, k, speedup, f"{method}, k = {k}: expected {speedup:.2f}x", fallback)


def _method_order(method: str) -> int:
    return AUTO_METHODS.index(method) if method in AUTO_METHODS else len(AUTO_METHODS)


class AutoProposer:
    """Drafts each step with the method `choose` picks from its sub-proposers (one per
    method). `observer`: the one sub-proposer that reads the target's hidden states (MTP),
    which the engine feeds every pass, whichever method drafted it."""

    def __init__(self, proposers: Mapping[str, object], costs: "Costs | CostModel", max_k: int,
                 observer: Optional[str] = None, learned: Optional[dict] = None, learn_costs: bool = True):
        self.proposers = {m: proposers[m] for m in sorted(proposers, key=_method_order)}
        # Costs learned from this run's passes (and the runs before it on the same models).
        self.cost_model = costs if isinstance(costs, CostModel) else CostModel(costs)
        self.learn_costs = learn_costs
        self.max_k = max_k
        self.observer = self.proposers.get(observer) if observer else None
        self.observer_method = observer if self.observer is not None else None
        self.last_chosen = {m: 0 for m in self.proposers}  # the step `choose` last picked each (not a re-probe)
        self.counters = ProposerCounters()
        # `learned`: estimates kept from earlier runs on the same models (updated in place), so
        # a reply starts from what the replies before it measured rather than from the prior.
        learned = {} if learned is None else learned
        self.estimates = {m: learned.setdefault(m, AcceptanceEstimate(max_k)) for m in self.proposers}
        self.last_used = {m: 0 for m in self.proposers}
        self.steps = 0
        self.choice = Choice("none", 0, 1.0, "no speculation: not started")
        self._pending: Optional[tuple[str, int, int]] = None  # (method, k asked, drafted) of this step
        self._missed: Optional[str] = None  # the method that found nothing this step, before its fallback
        self.usage: dict[str, int] = {}  # "method k=K" (or "none") -> steps, for reports
        self._previous_drafter: Optional[str] = None  # the method that drafted the step before

    @property
    def costs(self) -> Costs:
        return self.cost_model.costs()

    def record_timing(self, pass_tokens: int, pass_s: float, observe_s: float, draft_s: float) -> None:
        """This step's measurements, before `accept`: the target pass over `pass_tokens` tokens
        (verification included), a fed hidden-state drafter's catch-up on its rows, and the
        drafting. A step whose lookup found nothing before its fallback drafted tells nothing
        clean about either method's drafting cost, and is left out of that, as is a step right
        after a switch of method."""
        if not self.learn_costs:
            return
        model = self.cost_model
        model.record_pass(pass_tokens, pass_s)
        if self.observer_method is not None:
            model.record_observing(self.observer_method, observe_s)
        if self._pending is not None and self._missed is None:
            method, _, drafted = self._pending
            # Only a method that also drafted the step before: after a switch its drafting
            # includes catching up on what other methods committed meanwhile, a cost of
            # switching that would make a method look dearer the less it is used.
            if (LEARN_DRAFTING and drafted and method != self.observer_method
                    and method == self._previous_drafter):
                model.record_drafting(method, drafted, draft_s)
        self._previous_drafter = self._pending[0] if self._pending is not None else None

    def begin(self, prompt: Sequence[int]) -> None:
        for proposer in self.proposers.values():
            proposer.begin(prompt)
        self.steps = 0
        self.last_used = {m: 0 for m in self.proposers}
        self.last_chosen = {m: 0 for m in self.proposers}
        self._previous_drafter = None  # a new prompt: every method catches up first

    def decide(self, k_budget: int) -> Choice:
        """This step's choice (from history only); a method unused for REPROBE_EVERY steps
        drafts once at its best k, so a change of text can bring it back."""
        choice = choose(self.costs, self.estimates, max(1, min(self.max_k, k_budget)), self.extra_s())
        if choice.method in self.last_chosen:
            self.last_chosen[choice.method] = self.steps
        stale = [m for m in self.proposers if self.steps - self.last_used[m] >= REPROBE_EVERY and m != choice.method]
        if stale:
            method = stale[0]
            per_position, share, _ = self.estimates[method].summary()
            speedups = _speedups(self.costs, method, per_position, share, max(1, min(self.max_k, k_budget)),
                                 self.extra_s())
            speedup = max(speedups)
            k = speedups.index(speedup) + 1
            choice = Choice(method, k, speedup, f"{method}, k = {k}: re-probing (expected {speedup:.2f}x)")
        return choice

    def propose(self, context: Sequence[int], k: int) -> Draft:
        started = time.perf_counter()
        self.steps += 1
        self.choice = self.decide(k)
        method = self.choice.method
        if method == "none" or k <= 0:
            self._pending = None
            draft = Draft(())
        else:
            self.last_used[method] = self.steps
            draft = self.proposers[method].propose(context, min(k, self.choice.k))
            self._pending = (method, min(k, self.choice.k), len(draft.tokens))
            if not draft.tokens and self.choice.fallback is not None:
                # Found nothing: its miss is recorded, and the fallback drafts this step. Still
                # lossless: the lookup reads only committed tokens, never this step's pass.
                self.estimates[method].record(min(k, self.choice.k), 0, 0)
                self._missed = method
                fallback, fallback_k = self.choice.fallback
                self.last_used[fallback] = self.last_chosen[fallback] = self.steps
                draft = self.proposers[fallback].propose(context, min(k, fallback_k))
                self._pending = (fallback, min(k, fallback_k), len(draft.tokens))
                self.choice = Choice(fallback, fallback_k, self.choice.expected_speedup,
                                     f"{method} found nothing: {fallback}, k = {fallback_k} "
                                     f"(expected {self.choice.expected_speedup:.2f}x with {method})")
        label = f"{self.choice.method} k={self.choice.k}" if draft.tokens else "none"
        self.usage[label] = self.usage.get(label, 0) + 1
        self.counters.record_proposal(len(draft.tokens), time.perf_counter() - started)
        return draft

    def accept(self, n_accepted: int, committed: Sequence[int]) -> None:
        self.counters.record_accepted(n_accepted)
        chosen = None
        if self._pending is not None:
            chosen, asked, drafted = self._pending
            self.estimates[chosen].record(asked, drafted, n_accepted)
            self.proposers[chosen].accept(n_accepted, committed)
        if self._missed is not None:
            self.proposers[self._missed].accept(0, committed)
            self._missed = None
        if self.observer is not None and self.proposers.get(chosen) is not self.observer:
            # It saw this pass too: it keeps the committed rows whoever drafted.
            self.observer.accept(n_accepted, committed)
        self._pending = None
        if self.observer_method and self.steps - self.last_chosen[self.observer_method] >= RETIRE_AFTER:
            self._retire(self.observer_method)

    def extra_s(self) -> float:
        """What feeding the hidden-state drafter adds to every step while it is fed."""
        return self.costs.observe_s.get(self.observer_method, 0.0) if self.observer_method else 0.0

    def _retire(self, method: str) -> None:
        """Stop feeding and considering a hidden-state drafter for the rest of this run (the
        engine detaches it at its next pass; the next run starts with it again)."""
        for table in (self.proposers, self.estimates, self.last_used, self.last_chosen):
            table.pop(method, None)
        self.observer = self.observer_method = None

    def stats(self) -> dict:
        return {"method": "auto", "choice": self.choice.reason, **self.counters.as_dict()}

    def report(self) -> dict:
        """What auto did and why, for compare's JSON and the server's `specdesk` field: its
        share of steps by method and k, and the costs it chose with."""
        steps = sum(self.usage.values()) or 1
        return {"steps_by_choice": {label: round(n / steps, 3) for label, n in
                                    sorted(self.usage.items(), key=lambda item: -item[1])},
                "steps": sum(self.usage.values()), "costs": self.cost_model.describe()}


# --- measuring costs ----------------------------------------------------------------
_models: dict[str, CostModel] = {}  # cost key -> the model every run on those models learns into
# engine -> (cost key, greedy) -> method -> its acceptance estimate, carried from one run to the next
_learned: "weakref.WeakKeyDictionary[object, dict[tuple[str, bool], dict[str, AcceptanceEstimate]]]" = \
    weakref.WeakKeyDictionary()


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
    """The cost model for this engine and method set: from memory, seeded from the engine's
    cost folder (`engine.cost_cache_dir`, when set), else from a short probe now. What the
    replies measure updates it, and the folder's copy every SAVE_EVERY passes."""
    key = cost_key(engine, list(proposers), max_k, draft_path)
    if key in _models:
        return _models[key]
    folder = getattr(engine, "cost_cache_dir", None)
    path = Path(folder) / f"costs-{key}.json" if folder else None
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
    prompt, tail = probe[:-(max_k + 1)], probe[-(max_k + 1):]
    engine.prefill(prompt, None)
    ctx = engine.context
    n_past = ctx.n_past
    rng = np.random.default_rng(0)
    best = [float("inf")] * (max_k + 1)
    for _ in range(repeats):
        for n in range(1, max_k + 2):
            started = time.perf_counter()
            output = engine.target_pass([prompt[-1], *tail[:n - 1]], None)
            engine.verify_pass(Draft(tuple(tail[:n - 1])), output, SamplingParams(), rng)
            best[n - 1] = min(best[n - 1], time.perf_counter() - started)
            ctx.rollback(n_past)
    # A pass over more tokens never costs less: a size measured above a larger one caught a
    # slower moment (noise only adds time), so it takes the larger size's time.
    for n in range(max_k - 1, -1, -1):
        best[n] = min(best[n], best[n + 1])
    draft_token_s, observe_s = {}, {}
    for method, proposer in proposers.items():
        if method == observer:
            draft_token_s[method], observe_s[method] = _observer_costs(engine, method, probe, max_k, best)
        else:
            draft_token_s[method] = _drafting_cost(method, proposer, probe, max_k, repeats)
    return Costs(tuple(best), draft_token_s, observe_s)


def _observer_costs(engine, method: str, probe: list[int], max_k: int, pass_s: list[float]) -> tuple[float, float]:
    """A hidden-state drafter drafts only from the target's rows, so it is timed inside a
    short run of its own method: seconds per drafted token, and the median time its steps'
    target passes took beyond a plain pass of the same size (its catch-up on the target's rows)."""
    import threading

    from ..types import GenerationRequest, SpecConfig

    # k = 2: the sizes at which a fed drafter pays or not; its catch-up does not depend on k.
    request = GenerationRequest(tuple(probe[:-max_k]), max_tokens=36, spec=SpecConfig(method=method, k=min(2, max_k)),
                                stop_at_eos=False)
    drafted = seconds = 0.0
    beyond = []
    costs = Costs(tuple(pass_s), {})
    for event in engine.generate(request, threading.Event()):
        drafted += event.drafted
        seconds += event.draft_s
        beyond.append(max(0.0, event.verify_s - costs.pass_cost(1 + event.drafted)))
    observe = float(np.median(beyond[1:] or beyond)) if beyond else 0.0
    return (seconds / drafted if drafted else 0.0), observe


def _drafting_cost(method: str, proposer, probe: list[int], max_k: int, repeats: int) -> float:
    """Seconds per drafted token, proposing on the probe (the n-gram pool through a fresh
    pool, so the engine's learns nothing from the probe)."""
    from .ngram import NgramPoolProposer

    if method == "ngram-pool":
        proposer = NgramPoolProposer()
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


def make_auto_proposer(engine, spec, sampling: SamplingParams, rng: np.random.Generator) -> AutoProposer:
    """The auto proposer over every method this target can run now (or those `spec.auto_methods`
    names): the n-gram methods, the draft model when `spec.draft_path` names one, the
    target's MTP layers when it has them."""
    import dataclasses

    from .proposers import make_proposer

    availability = engine.method_availability()
    proposers = {}
    for method in spec.auto_methods or AUTO_METHODS:
        if method in ("none", "auto") or availability.get(method, "unknown") is not None:
            continue
        if method == "draft" and not spec.draft_path:
            continue
        proposers[method] = make_proposer(engine, dataclasses.replace(spec, method=method, auto_methods=()),
                                          sampling, rng)
    observer = "mtp" if "mtp" in proposers else None
    draft_path = spec.draft_path if "draft" in proposers else None
    model = load_or_measure(engine, proposers, spec.k, draft_path, observer)
    # Greedy and sampled runs accept differently: each learns apart.
    learned = _learned.setdefault(engine, {}).setdefault(
        (cost_key(engine, list(proposers), spec.k, draft_path), sampling.greedy), {})
    if observer is not None and not worth_feeding(model.costs(), observer, spec.k, learned.get(observer)):
        del proposers[observer]  # never attached: its catch-up would cost more than it can save
        observer = None
    return AutoProposer(proposers, model, spec.k, observer, learned,
                        learn_costs=getattr(engine, "cost_learning", True))


def worth_feeding(costs: Costs, method: str, max_k: int, shown: Optional[AcceptanceEstimate] = None) -> bool:
    """Whether a hidden-state drafter could beat a plain pass, paying its catch-up on every
    pass: at the acceptance it has shown on this model in earlier runs (`shown`), else even at
    OPTIMISTIC_ACCEPTANCE."""
    if shown is not None and shown.drafted > 0:
        per_position, share, _ = shown.summary()
    else:
        per_position, share = [OPTIMISTIC_ACCEPTANCE] * max_k, 1.0
    return max(_speedups(costs, method, per_position, share, max_k, costs.observe_s.get(method, 0.0))) > 1.0
