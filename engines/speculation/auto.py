"""The `auto` method: each step, the method and k that gain the most against the run's rate.

Three parts, each on its own: this machine's costs (engines/speculation/costs.py: a probe run
as a job of its own before the first auto reply, or read from the cache, then learned from
the passes auto runs); each method's running acceptance per draft position
(`AcceptanceEstimate`); and `choose` (engines/speculation/chooser.py), a pure function of the
two. `AutoProposer` asks it every step and drafts with the member proposer it picks; to the
loop it is one proposer like the others (protocols.ChoosingProposer).

Lossless like every method: a step's choice depends only on the costs and on what earlier
steps committed, never on that step's target pass, and each step verifies its draft exactly
as the chosen method would alone. Deterministic for the same costs, inputs and seed.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from ..methods import auto_methods, method_info, needs_draft_model
from ..types import Draft, SpecConfig, SpecDeskError
from .chooser import (MAX_TAIL_P_MIN, AcceptanceEstimate, Choice, Costs, TailCalibration, cannot_pay, ceiling,
                      choose, economics, speedups, tail_p_min, worth_feeding)
from .costs import MIN_SAMPLES, WINDOW, CostModel, cost_key, measured, median
from .stats import ProposerCounters

REPROBE_EVERY = 8  # a method unused for this many steps drafts once, so it can come back
# ... and each re-probe that does not bring it back doubles the wait, up to this many times: a
# method that keeps losing costs a share of steps that falls toward nothing over a reply.
REPROBE_BACKOFF = 4
# A hidden-state drafter (MTP) costs a catch-up on every target pass even when it does not
# draft: not chosen on its merits for this many steps, it is let go for the rest of the run;
# one that could not win even at chooser.OPTIMISTIC_ACCEPTANCE is not fed at all.
RETIRE_AFTER = 6

# Drafting costs from the steps themselves: off, as measured on held-out prompts. A step's
# drafting includes the draft model catching up on what was committed since, which in a run
# that mixes methods grows with how rarely it drafts; learned, it made auto shun the draft
# model (0.88-0.91x of the best fixed setting, against 0.99x with the probe's costs).
LEARN_DRAFTING = False
MAX_CATCH_UP_SCALE = 20.0  # a draft model's catch-up is never priced further than this from Costs.catch_up_cost


class CatchUpScale:
    """How a draft model's catch-up (one batch over the tokens other methods committed since it
    last drafted) compares with the price Costs.catch_up_cost puts on it: the ratio of what such
    steps took beyond their drafting to that price, the median of the recent ones (1 before any).
    The price scales the drafter's per-token cost by the target's pass shape; a small draft
    model's batch is dearer than that says (the demo draft: about 9x), and unscaled, auto switched
    to it after runs of lookups as if that were nearly free."""

    def __init__(self) -> None:
        self.ratios: deque[float] = deque(maxlen=WINDOW)
        self._scale = 1.0  # read every step: kept until the next record

    def record(self, seconds: float, priced: float) -> None:
        if priced > 0.0 and seconds >= 0.0:
            self.ratios.append(seconds / priced)
            if len(self.ratios) >= MIN_SAMPLES:
                self._scale = min(MAX_CATCH_UP_SCALE, max(1.0 / MAX_CATCH_UP_SCALE, median(self.ratios)))

    def scale(self) -> float:
        return self._scale


class Stretch:
    """How many steps in a row a draft model drafts once it has caught up: the mean of its
    recent stretches (older ones count less; one step before any). A catch-up is paid once
    for the stretch it opens, so the chooser charges each step of it that share (a draft model
    that drafts for ten steps after the lookups stop finding does not pay its catch-up ten times;
    one that drafts a single step between lookups pays it whole)."""

    DECAY = 0.9
    PRIOR_WEIGHT = 1.0

    def __init__(self) -> None:
        self.current = 0  # steps in the stretch under way
        self._sum = self.PRIOR_WEIGHT * 1.0
        self._weight = self.PRIOR_WEIGHT

    def step(self, drafted: bool) -> None:
        if drafted:
            self.current += 1
        elif self.current:
            self._sum = self.DECAY * self._sum + self.current
            self._weight = self.DECAY * self._weight + 1.0
            self.current = 0

    def mean(self) -> float:
        return max(1.0, self._sum / self._weight)


RATE_WINDOW = 128  # steps the run's rate is read over (StepRate): several replies, not a burst of lookup hits


class StepRate:
    """The tokens per second the run is making, as the costs price its recent steps: what each
    committed over what its pass and drafting cost by `Costs` (not by the clock, so the choice
    stays a function of the costs and the text). `choose` values each option against it."""

    def __init__(self) -> None:
        self.steps: deque[tuple[int, float]] = deque(maxlen=RATE_WINDOW)
        self._tokens, self._seconds = 0, 0.0

    def record(self, tokens: int, seconds: float) -> None:
        if seconds <= 0.0:
            return
        if len(self.steps) == self.steps.maxlen:
            old_tokens, old_seconds = self.steps[0]
            self._tokens -= old_tokens
            self._seconds -= old_seconds
        self.steps.append((tokens, seconds))
        self._tokens += tokens
        self._seconds += seconds

    def rate(self) -> Optional[float]:
        return self._tokens / self._seconds if self.steps and self._seconds > 0.0 else None


@dataclass(frozen=True)
class AutoPlan:
    """What an auto run chooses among, read from its request and the engine's methods."""

    methods: tuple[str, ...]  # in the order the request (or the table's auto rows) lists them: part of the cost key
    max_k: int
    observer: Optional[str]  # the method that reads the target's hidden states (fed every pass)
    draft_path: Optional[str]  # the draft model's file, when "draft" is among the methods


def auto_plan(spec: SpecConfig, availability: Mapping[str, Optional[str]]) -> AutoPlan:
    """Every method this target can run now (or those `spec.auto_methods` names): the n-gram
    methods, the draft model when `spec.draft_path` names one, the target's MTP layers when it
    has them (`availability`: method -> None where it can run, as Engine.method_availability)."""
    methods = tuple(dict.fromkeys(
        m for m in spec.auto_methods or auto_methods()
        if availability.get(m, "unknown") is None and (not needs_draft_model(m) or spec.draft_path)))
    observer = next((m for m in methods if method_info(m).reads_hidden), None)
    return AutoPlan(methods, spec.k, observer,
                    spec.draft_path if any(needs_draft_model(m) for m in methods) else None)


VERDICT_TOLERANCE = 0.05


def _near(before: Optional[Costs], now: Costs) -> bool:
    """Whether `now` prices every pass size and drafting within VERDICT_TOLERANCE of `before`."""
    if before is None:
        return False
    if before is now:
        return True
    def within(pairs) -> bool:
        return all(abs(b - a) <= VERDICT_TOLERANCE * max(abs(a), abs(b)) for a, b in pairs)

    return len(before.pass_s) == len(now.pass_s) and within(zip(before.pass_s, now.pass_s)) and all(
        field_before.keys() == field_now.keys() and within((field_before[m], b) for m, b in field_now.items())
        for field_before, field_now in ((before.draft_token_s, now.draft_token_s), (before.observe_s, now.observe_s),
                                        (before.draft_step_s, now.draft_step_s)))


def _is_lookup(method: str) -> bool:
    return method_info(method).lookup


def _method_order(method: str) -> int:
    order = auto_methods()  # the order ties are broken in
    return order.index(method) if method in order else len(order)


class AutoProposer:
    """Drafts each step with the method `choose` picks from its sub-proposers (one per
    method). `observer`: the one sub-proposer that reads the target's hidden states (MTP),
    which the target feeds every pass whichever method drafted (protocols.target_observer)."""

    def __init__(self, proposers: Mapping[str, object], costs: "Costs | CostModel", max_k: int,
                 observer: Optional[str] = None, learned: Optional[dict] = None, learn_costs: bool = True):
        self.proposers = {m: proposers[m] for m in sorted(proposers, key=_method_order)}
        # Costs learned from this run's passes (and the runs before it on the same models).
        self.cost_model = costs if isinstance(costs, CostModel) else CostModel(costs)
        self.learn_costs = learn_costs
        self.max_k = max_k
        self.observer = self.proposers.get(observer) if observer else None
        self.observer_method = observer if self.observer is not None else None
        # Methods that look the context up (no model): each looks every step before the choice.
        self.lookups = tuple(m for m in self.proposers if _is_lookup(m))
        self._looked: dict[str, tuple[int, ...]] = {}  # lookup -> what it found this step
        self.last_chosen = {m: 0 for m in self.proposers}  # the step `choose` last picked each (not a re-probe)
        self.reprobes = {m: 0 for m in self.proposers}  # re-probes since `choose` last picked each
        self.reprobe_steps = 0  # steps of this run a method expected to be slower drafted (bounded re-probes)
        self._verdict: tuple[Optional[Costs], int, Optional[str]] = (None, 0, None)
        self._ceilings: dict[str, float] = {}  # method -> chooser.ceiling, made with the verdict
        self.counters = ProposerCounters()
        # `learned`: estimates kept from earlier runs on the same models (updated in place), so
        # a reply starts from what the replies before it measured rather than from the prior.
        learned = {} if learned is None else learned
        self.estimates = {m: learned.setdefault(m, AcceptanceEstimate(max_k)) for m in self.proposers}
        # model drafter -> how its confidence in a row compares with the target's acceptance, kept
        # across runs like the estimates (under "method:tails" in the same table)
        self.calibration: dict[str, TailCalibration] = {
            m: learned.setdefault(f"{m}:tails", TailCalibration()) for m, p in self.proposers.items()
            if hasattr(p, "p_min")}
        # the rate the run is making, carried from one reply to the next like the estimates
        step_rate = learned.setdefault("run:rate", StepRate())
        self.step_rate = step_rate if isinstance(step_rate, StepRate) else StepRate()
        self._priced_s = 0.0  # this step's seconds by the costs (StepRate)
        self._catch_up: dict[str, float] = {}  # this step's catch_up_s(), as decide read it
        self.catch_up: dict[str, CatchUpScale] = {
            m: learned.setdefault(f"{m}:catch-up", CatchUpScale()) for m in self.proposers
            if method_info(m).takes == "draft_model"}
        self.stretches: dict[str, Stretch] = {
            m: learned.setdefault(f"{m}:stretch", Stretch()) for m in self.catch_up}
        self._behind: Optional[tuple[str, float]] = None  # (model drafter, its unscaled catch-up price) this step
        self.last_used = {m: 0 for m in self.proposers}
        self.steps = 0
        self.last_plain = 0  # the step that last ran a plain pass (nothing drafted)
        self.choice = Choice("none", 0, 1.0, "no speculation: not started")
        self._pending: Optional[tuple[str, int, int]] = None  # (method, k asked, drafted) of this step
        self._missed: Optional[str] = None  # the method that found nothing this step, before its fallback
        # (lookup, position, draft, tokens right so far) of drafts looked up and not chosen,
        # scored against the text as it is committed (_score_looks)
        self._pending_looks: list[tuple[str, int, tuple[int, ...], int]] = []
        self.usage: dict[str, int] = {}  # "method k=K" (or "none") -> steps, for reports
        # Model-drafting methods (the draft model) -> how many committed tokens their own
        # context holds: what they drafted and had accepted; the rest they must catch up on.
        self._seen: dict[str, int] = {}
        self._context_len = 0
        self._previous_drafter: Optional[str] = None  # the method that drafted the step before
        self._p_floor: dict[str, float] = {}  # method -> the draft_p_min the run asked for
        self.p_min_used: dict[str, float] = {}  # method -> the draft_p_min its last draft stopped at

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
            if drafted and self._behind is not None and method == self._behind[0]:
                # what it took beyond its drafting: its catch-up
                self.catch_up[method].record(max(0.0, draft_s - self.costs.drafting_cost(method, drafted)),
                                             self._behind[1])
            # Only a method that also drafted the step before: after a switch its drafting
            # includes catching up on what other methods committed meanwhile, a cost of
            # switching that would make a method look dearer the less it is used.
            if (LEARN_DRAFTING and drafted and method != self.observer_method
                    and method == self._previous_drafter):
                model.record_drafting(method, drafted, draft_s)
        self._previous_drafter = self._pending[0] if self._pending is not None else None

    def begin(self, prompt: Sequence[int]) -> None:
        self._score_unfinished_looks()
        for proposer in self.proposers.values():
            proposer.begin(prompt)
        # begin() syncs every drafter with the prompt (a draft model prefills it there)
        self._seen = {m: len(prompt) for m in self.proposers if method_info(m).takes == "draft_model"}
        self._context_len = len(prompt)
        self.steps = self.last_plain = 0
        self.last_used = {m: 0 for m in self.proposers}
        self.last_chosen = {m: 0 for m in self.proposers}
        self.reprobes = {m: 0 for m in self.proposers}
        self.reprobe_steps = 0
        self._previous_drafter = None  # a new prompt: every method catches up first

    def decide(self, k_budget: int, found: Optional[Mapping[str, int]] = None) -> Choice:
        """This step's choice (from history, and from what the lookups found in the committed
        tokens: `found`, method -> tokens drafted); a method unused for REPROBE_EVERY steps
        drafts once at its best k, so a change of text can bring it back. Until a plain pass has
        been measured (costs.MIN_SAMPLES of them), one runs every REPROBE_EVERY steps: every
        speedup is counted against it, and priced from the drafted passes alone it drifts with
        whatever those carry (a fed drafter's catch-up) and is never corrected."""
        found = found or {}
        budget = max(1, min(self.max_k, k_budget))
        self._catch_up = {}
        if all(m in found and not found[m] for m in self.proposers):
            # Only lookups, and none found anything: a plain pass, whatever the costs say (the
            # verdict, when one was reached, still says why none could pay anyway).
            verdict = self._verdict[2]
            return Choice("none", 0, 1.0, f"no speculation: {verdict}" if verdict is not None
                          else "no speculation: no method available")
        verdict = self.verdict(budget)
        if verdict is not None:  # whatever the text, no method could pay here: nothing to probe
            return Choice("none", 0, 1.0, f"no speculation: {verdict}")
        if (self.learn_costs and self.cost_model.passes_seen and self.steps - self.last_plain >= REPROBE_EVERY
                and len(self.cost_model.passes[0]) < MIN_SAMPLES):
            return Choice("none", 0, 1.0, "no speculation: measuring a plain pass again")
        run_rate = self.step_rate.rate()
        # each step of the stretch a catch-up opens pays its share of it (Stretch)
        self._catch_up = self.catch_up_s()  # (priced whole in _price: the step pays it)
        catch_up = {m: s / self.stretches[m].mean() for m, s in self._catch_up.items()}
        choice = choose(self.costs, self.estimates, budget, self.extra_s(), catch_up, found, run_rate=run_rate)
        if choice.method in self.last_chosen:
            self.last_chosen[choice.method] = self.steps
            self.reprobes[choice.method] = 0
        # ... and only one that could beat the rate the run is making: a draft model re-probed
        # between runs of long lookups costs more than it could bring. (Its catch-up is left out:
        # paid once, it lets the steps after it draft, and a model left far behind would be
        # priced out for good.)
        beat = max(1.0, (run_rate or 0.0) * self.costs.pass_s[0])
        stale = [m for m in self.proposers if m != choice.method and found.get(m, budget)
                 and self.steps - self.last_used[m] >= REPROBE_EVERY << min(self.reprobes[m], REPROBE_BACKOFF)
                 and self._ceilings[m] > beat]
        if stale:
            method = stale[0]
            per_position, share, _ = self.estimates[method].summary()
            by_k = speedups(self.costs, method, per_position, share, min(budget, found.get(method, budget)),
                            self.extra_s())
            speedup = max(by_k)
            k = by_k.index(speedup) + 1
            self.reprobes[method] += 1
            self.reprobe_steps += 1
            choice = Choice(method, k, speedup, f"{method}, k = {k}: re-probing (expected {speedup:.2f}x)")
        return choice

    def verdict(self, max_k: Optional[int] = None) -> Optional[str]:
        """Why no method of this run could pay on this machine, whatever the text (chooser.cannot_pay:
        even at an acceptance few methods reach), or None where one could. Asked again only when
        the costs moved by more than VERDICT_TOLERANCE (a pass's median moves a little at
        almost every pass; the verdict is asked every step)."""
        max_k = self.max_k if max_k is None else max_k
        costs = self.costs
        if self._verdict[1] != max_k or not _near(self._verdict[0], costs) or self._ceilings.keys() != self.proposers.keys():
            extra = {self.observer_method: self.extra_s()} if self.observer_method else {}
            self._verdict = (costs, max_k, cannot_pay(costs, list(self.proposers), max_k, extra))
            # what each could make at an acceptance few methods reach: whether a re-probe could pay
            self._ceilings = {m: ceiling(costs, m, max_k, self.extra_s()) for m in self.proposers}
        return self._verdict[2]

    def propose(self, context: Sequence[int], k: int) -> Draft:
        started = time.perf_counter()
        self.steps += 1
        self._context_len = len(context)
        # The lookups cost next to nothing: each looks first, and the choice knows what each
        # found (a longer k's lookup starts with the shorter one's draft, so one look serves all).
        looked = {m: self.proposers[m].propose(context, min(k, self.max_k)) for m in self.lookups} if k > 0 else {}
        self._looked = {m: d.tokens for m, d in looked.items()}
        self.choice = self.decide(k, {m: len(d.tokens) for m, d in looked.items()})
        method = self.choice.method
        self._behind = None
        if method == "none" or k <= 0:
            self._pending = None
            draft = Draft(())
        else:
            self.last_used[method] = self.steps
            if method in looked:
                draft = Draft(looked[method].tokens[:min(k, self.choice.k)])
            else:
                self._cut_tails(method, min(k, self.choice.k))
                self._note_behind(method)
                draft = self.proposers[method].propose(context, min(k, self.choice.k))
            self._pending = (method, min(k, self.choice.k), len(draft.tokens))
            if not draft.tokens and self.choice.fallback is not None:
                # Found nothing: its miss is recorded, and the fallback drafts this step. Still
                # lossless: the lookup reads only committed tokens, never this step's pass.
                self.estimates[method].record(min(k, self.choice.k), 0, 0)
                self._missed = method
                fallback, fallback_k = self.choice.fallback
                self.last_used[fallback] = self.last_chosen[fallback] = self.steps
                self._cut_tails(fallback, min(k, fallback_k))
                self._note_behind(fallback)
                draft = self.proposers[fallback].propose(context, min(k, fallback_k))
                self._pending = (fallback, min(k, fallback_k), len(draft.tokens))
                self.choice = Choice(fallback, fallback_k, self.choice.expected_speedup,
                                     f"{method} found nothing: {fallback}, k = {fallback_k} "
                                     f"(expected {self.choice.expected_speedup:.2f}x with {method})")
        if not draft.tokens:
            self.last_plain = self.steps
        self._priced_s = self._price(draft)
        label = f"{self.choice.method} k={self.choice.k}" if draft.tokens else "none"
        self.usage[label] = self.usage.get(label, 0) + 1
        self.counters.record_proposal(len(draft.tokens), time.perf_counter() - started)
        return draft

    def _price(self, draft: Draft) -> float:
        """This step's seconds by the costs: its pass over the drafted tokens, the drafting of
        the method that drafted (a lookup's is next to nothing) with a draft model's catch-up,
        and what feeding a hidden-state drafter adds."""
        if not draft.tokens:  # (a plain step: priced without making a new estimate)
            costs = self.cost_model.last_costs()
            return costs.pass_s[0] + (costs.observe_s.get(self.observer_method, 0.0) if self.observer_method else 0.0)
        costs = self.costs
        seconds = costs.pass_cost(1 + len(draft.tokens)) + self.extra_s()
        if self._pending is not None:
            method = self._pending[0]
            if method not in self._looked:
                seconds += costs.drafting_cost(method, len(draft.tokens)) + self._catch_up.get(method, 0.0)
        return seconds

    def _note_behind(self, method: str) -> None:
        """Before a draft model drafts more than one token behind: its catch-up's unscaled price,
        which record_timing compares with what the step took (CatchUpScale)."""
        if method in self.catch_up and method in self._seen:
            priced = self.costs.catch_up_cost(method, self._context_len - self._seen[method])
            if priced > 0.0:
                self._behind = (method, priced)

    def _cut_tails(self, method: str, k: int) -> None:
        """A model drafter (one with a draft_p_min) stops at a row too unlikely to pay for its
        verification on this machine (chooser.tail_p_min); never below the p_min asked for."""
        proposer = self.proposers[method]
        if not hasattr(proposer, "p_min"):
            return
        floor = self._p_floor.setdefault(method, proposer.p_min)
        needed = tail_p_min(self.costs, method, k, self.choice.expected_speedup)  # the row's acceptance
        proposer.p_min = max(floor, min(MAX_TAIL_P_MIN, self.calibration[method].confidence_for(needed)))
        self.p_min_used[method] = proposer.p_min

    def accept(self, n_accepted: int, committed: Sequence[int]) -> None:
        self.counters.record_accepted(n_accepted)
        self.step_rate.record(n_accepted + 1, self._priced_s)
        drafter = self._pending[0] if self._pending is not None else None
        for method, stretch in self.stretches.items():
            stretch.step(method == drafter)
        chosen = None
        if self._pending is not None:
            chosen, asked, drafted = self._pending
            confidence = getattr(self.proposers[chosen], "row_confidence", None)
            if confidence is not None:  # a model drafter that read its rows' confidence (the tail cut)
                self.calibration[chosen].record(confidence, n_accepted)
                if 0 < drafted < asked:
                    # Cut by its own confidence, not by the text: the rows past the cut were
                    # never drafted, so they count neither way in its acceptance per position
                    # (counted as rejected, each cut would lower the estimate that sets the next
                    # cut's k, and auto would talk itself into ever shorter drafts).
                    asked = drafted
            self.estimates[chosen].record(asked, drafted, n_accepted)
            self.proposers[chosen].accept(n_accepted, committed)
            if chosen in self._seen:  # its context now holds the step's context and the accepted drafts
                self._seen[chosen] = self._context_len + n_accepted
        if self._missed is not None:
            self.proposers[self._missed].accept(0, committed)
            self._missed = None
        for method in self._looked:  # looked but did not draft this step: they learn the step's tokens
            if method != chosen:
                # one draft of each lookup scored at a time: drafts looked up at consecutive
                # steps cover the same tokens, and counted each they would make a few right
                # tokens look like many (the acceptance would seem surer than it is)
                if self._looked[method] and all(m != method for m, *_ in self._pending_looks):
                    self._pending_looks.append((method, self._context_len, self._looked[method], 0))
                self.proposers[method].accept(0, committed)
        self._score_looks(committed)
        self._looked = {}
        if self.observer is not None and self.proposers.get(chosen) is not self.observer:
            # It saw this pass too: it keeps the committed rows whoever drafted.
            self.observer.accept(n_accepted, committed)
        self._pending = None
        if self.observer_method and self.steps - self.last_chosen[self.observer_method] >= RETIRE_AFTER:
            self._retire(self.observer_method)

    def _score_looks(self, committed: Sequence[int]) -> None:
        """Score the drafts of lookups that looked and were not chosen against the tokens the
        text went on with, into their acceptance estimates: a draft token is accepted exactly
        when the target commits that token there (greedy: its argmax; sampled: a lookup's draft
        is one-hot, and a token rejected there is never the one resampled). A draft is scored as
        the steps after it commit its positions, up to its first wrong token. Without this each
        lookup's estimate would come only from the steps it was chosen on: one chosen where the
        other found nothing is measured on the hardest text alone, and one that has not shown
        enough to draft (where a rejected draft costs nearly a whole pass) could never show it."""
        start = self._context_len  # where this step's committed tokens begin
        end = start + len(committed)
        still = []
        for method, at, draft, matched in self._pending_looks:
            while matched < len(draft) and at + matched < end and draft[matched] == committed[at + matched - start]:
                matched += 1
            if matched == len(draft) or at + matched < end:  # all of it right, or wrong at `matched`
                if method in self.estimates:
                    self.estimates[method].record(len(draft), len(draft), matched)
            else:
                still.append((method, at, draft, matched))
        self._pending_looks = still

    def _score_unfinished_looks(self) -> None:
        """A reply ended with drafts not yet scored to the end: what was committed of them."""
        for method, _, _, matched in self._pending_looks:
            if matched and method in self.estimates:  # known right that far, not beyond
                self.estimates[method].record(matched, matched, matched)
        self._pending_looks = []

    def catch_up_s(self) -> dict[str, float]:
        """This step's catch-up per model-drafting method: the committed tokens it has not seen
        since it last drafted (other methods drafted meanwhile), priced by Costs.catch_up_cost.
        A method that drafted the step before is one token behind, as after its own steps."""
        costs = self.costs
        return {m: costs.catch_up_cost(m, self._context_len - seen) * self.catch_up[m].scale()
                for m, seen in self._seen.items() if m in self.proposers and m in self.catch_up}

    def extra_s(self) -> float:
        """What feeding the hidden-state drafter adds to every step while it is fed."""
        return self.costs.observe_s.get(self.observer_method, 0.0) if self.observer_method else 0.0

    def _retire(self, method: str) -> None:
        """Stop feeding and considering a hidden-state drafter for the rest of this run (the
        engine detaches it at its next pass; the next run starts with it again)."""
        for table in (self.proposers, self.estimates, self.last_used, self.last_chosen, self.reprobes):
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
                "steps": sum(self.usage.values()), "costs": self.cost_model.describe(),
                "economics": economics(self.costs), "verdict": self.verdict(),
                "draft_p_min": {m: round(p, 3) for m, p in self.p_min_used.items()},
                # log-odds a row is likelier to be accepted than its drafter's confidence says
                "tail_calibration": {m: round(self.calibration[m].shift(), 3) for m in self.p_min_used},
                # what a draft model's catch-up took against its price (CatchUpScale)
                "catch_up_scale": {m: round(scale.scale(), 3) for m, scale in self.catch_up.items()},
                "reprobe_steps": self.reprobe_steps}


# engine -> (cost key, greedy) -> method -> its acceptance estimate, carried from one run to the next
# (and "method:tails" -> its TailCalibration, "method:catch-up" -> its CatchUpScale)
_learned: "weakref.WeakKeyDictionary[object, dict[tuple[str, bool], dict[str, object]]]" = weakref.WeakKeyDictionary()


def start_auto(engine, plan: AutoPlan, members: Mapping[str, object], greedy: bool) -> AutoProposer:
    """The auto proposer of one run over `members` (method -> its proposer for this run), with
    the costs its preparation measured or read (costs.load_or_measure, run before the run by
    proposers.prepare) and the acceptance earlier runs on the same models learned."""
    model = measured(engine, plan.methods, plan.max_k, plan.draft_path)
    if model is None:
        raise SpecDeskError("method auto has no costs for these models yet: prepare it before the run "
                            "(engines/speculation/proposers.prepare)")
    members = dict(members)
    # Greedy and sampled runs accept differently: each learns apart.
    learned = _learned.setdefault(engine, {}).setdefault(
        (cost_key(engine, plan.methods, plan.max_k, plan.draft_path), greedy), {})
    observer = plan.observer
    if observer is not None and not worth_feeding(model.costs(), observer, plan.max_k, learned.get(observer)):
        del members[observer]  # never attached: its catch-up would cost more than it can save
        observer = None
    return AutoProposer(members, model, plan.max_k, observer, learned,
                        learn_costs=getattr(engine, "cost_learning", True))
