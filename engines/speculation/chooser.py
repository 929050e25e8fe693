"""The auto chooser: which method and k a step should draft with, from costs and acceptance.

A pure function of what it is given (no engine, no clock): `Costs`, this machine's seconds for
a target pass over n tokens and for each method's drafting; each method's `AcceptanceEstimate`,
its running acceptance per draft position; and the rate the run is making, as those costs price
its recent steps. `choose` returns the (method, k) that gains the most against that rate (by
tokens per second before there is one), or no speculation when nothing is expected to beat a
plain pass. The costs come from engines/speculation/costs.py; the proposer that asks every step
is engines/speculation/auto.AutoProposer.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import numpy as np

PRIOR_ACCEPTANCE = 0.6  # per-position acceptance assumed before a method has drafted
PRIOR_WEIGHT = 2.0  # how many observed steps the prior is worth
DECAY = 0.97  # older steps count less, so a change of text shows within a few dozen steps
# A hidden-state drafter (MTP) is fed only if it could win at the acceptance it has shown, or
# before it has shown any, at this one (worth_feeding).
OPTIMISTIC_ACCEPTANCE = 0.8
# A step drafts only if it also pays at the acceptance the method has surely shown: each
# position's estimate less CAUTION_Z standard errors, the prior counting as CAUTION_WEIGHT
# steps (AcceptanceEstimate.cautious). Where a pass over n tokens costs little more than one
# (a GPU, F16 weights) a draft pays at any plausible acceptance and this changes nothing; where
# it costs nearly n (Q4_1 on a CPU) a rejected draft costs a whole pass more and only a lookup
# that has been right step after step may draft.
CAUTION_Z = 1.0
CAUTION_WEIGHT = 8.0
# ... and by more than this share: the pass costs are medians of a few noisy passes, and a gain
# smaller than their noise (a k = 1 draft where a pass over 2 tokens measured 1.98x one) is none.
MIN_GAIN = 0.03


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

    def catch_up_cost(self, method: str, behind: int) -> float:
        """What a draft model pays before drafting when it is `behind` committed tokens (other
        methods drafted meanwhile): one batch over them instead of the single token a step
        after its own starts from, priced as its per-token cost scaled by the target's pass
        shape (both run on this machine), growing past the measured sizes along the last step."""
        extra = behind - 1
        per_token = self.draft_token_s.get(method, 0.0)
        if extra <= 0 or per_token <= 0.0:
            return 0.0
        last = len(self.pass_s)
        n = 1 + extra
        batch = self.pass_cost(min(n, last))
        if n > last and last >= 2:
            batch += (n - last) * max(0.0, self.pass_s[-1] - self.pass_s[-2])
        return per_token * max(0.0, batch / self.pass_s[0] - 1.0)

    def pass_cost(self, n: float) -> float:
        """A pass over n tokens (fractional n: linear between measured sizes, the last size's
        cost beyond them). Plain floats: the chooser calls this K x methods times a step."""
        last = len(self.pass_s)
        if n >= last:
            return self.pass_s[-1]
        low = int(n) or 1
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
    # (max_k,) each: plain lists, not arrays: recorded every step, and numpy's per-call cost on
    # four elements was a fifth of auto's own time a step
    reached: list[float] = field(init=False)
    accepted: list[float] = field(init=False)
    asked: float = 0.0
    drafted: float = 0.0
    tries: float = 0.0
    misses: float = 0.0

    def __post_init__(self) -> None:
        self.reached = [0.0] * self.max_k
        self.accepted = [0.0] * self.max_k
        self._summary: Optional[tuple[list[float], float]] = None

    def record(self, k: int, drafted: int, accepted: int) -> None:
        self._summary = None
        self.reached = [DECAY * x for x in self.reached]
        self.accepted = [DECAY * x for x in self.accepted]
        self.tries, self.misses = self.tries * DECAY + 1, self.misses * DECAY + (drafted == 0)
        self.asked, self.drafted = self.asked * DECAY, self.drafted * DECAY
        if drafted == 0:
            return
        self.asked, self.drafted = self.asked + k, self.drafted + drafted
        for i in range(min(k, accepted + 1)):
            self.reached[i] += 1.0
        for i in range(accepted):
            self.accepted[i] += 1.0

    def per_position(self) -> list[float]:
        """(max_k,) conditional acceptance of position i given positions < i were accepted.

        Each position's prior is the estimate of the position before it (the first one's,
        PRIOR_ACCEPTANCE): a method whose drafts have been cut at k never reaches position k + 1,
        and a fixed prior there would price it below what the method has shown, so auto would
        never try the longer draft that would measure it."""
        out = []
        prior = PRIOR_ACCEPTANCE
        for accepted, reached in zip(self.accepted, self.reached):
            prior = float((accepted + PRIOR_WEIGHT * prior) / (reached + PRIOR_WEIGHT))
            out.append(prior)
        return out

    def cautious(self) -> list[float]:
        """per_position() less CAUTION_Z standard errors of each position's estimate: what the
        method has surely shown, so that a few lucky steps do not make a dear draft look safe."""
        out = []
        for mean, reached in zip(self.summary()[0], self.reached):
            spread = CAUTION_Z * (mean * (1.0 - mean) / (float(reached) + CAUTION_WEIGHT)) ** 0.5
            out.append(max(0.0, mean - spread))
        return out

    def draft_share(self) -> float:
        """Drafted tokens per token asked for, when it drafted (n-gram methods often find fewer)."""
        return (self.drafted + PRIOR_WEIGHT) / (self.asked + PRIOR_WEIGHT)

    def hit_rate(self) -> float:
        """The share of steps it drafted anything (the prior: it does)."""
        return (self.tries - self.misses + PRIOR_WEIGHT) / (self.tries + PRIOR_WEIGHT)

    def summary(self) -> tuple[list[float], float, float]:
        """(per_position() as floats, draft_share(), hit_rate()), computed once per recorded step."""
        if self._summary is None:
            self._summary = (self.per_position(), self.draft_share(), self.hit_rate())
        return self._summary


@dataclass(frozen=True)
class Choice:
    method: str  # "none" or a method
    k: int
    expected_speedup: float  # over a plain pass per token, from the costs and estimates
    reason: str
    fallback: Optional[tuple[str, int]] = None  # (method, k) that drafts when this one finds nothing


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
    return speedups(costs, method, per_position, draft_share, k, extra_s)[k - 1]


def _outcomes(costs: Costs, method: str, per_position: Sequence[float], draft_share: float,
              max_k: int, extra_s: float = 0.0, drafting: bool = True) -> list[tuple[float, float]]:
    """(expected tokens, seconds) of a step where `method` drafts, for k = 1..max_k, in one walk
    over the positions; `extra_s`: what every step costs besides (a fed hidden-state drafter's
    catch-up); `drafting`: False for a draft already made this step (its cost is spent whatever
    is chosen). Plain floats: the chooser calls this for every method each step."""
    draft_s = costs.draft_token_s.get(method, 0.0) if drafting else 0.0
    step_s = costs.draft_step_s.get(method, 0.0) + extra_s
    tokens, reach, out = 1.0, 1.0, []
    for k in range(1, max_k + 1):
        reach *= per_position[k - 1]
        tokens += reach
        drafted = draft_share * k
        out.append((tokens, step_s + draft_s * drafted + costs.pass_cost(1.0 + drafted)))
    return out


def speedups(costs: Costs, method: str, per_position: Sequence[float], draft_share: float,
              max_k: int, extra_s: float = 0.0) -> list[float]:
    """expected_speedup for k = 1..max_k."""
    return [tokens * costs.pass_s[0] / seconds
            for tokens, seconds in _outcomes(costs, method, per_position, draft_share, max_k, extra_s)]


def _mix(hit: float, drafted: tuple[float, float], missed: tuple[float, float]) -> tuple[float, float]:
    """(tokens, seconds) per step of a method that drafts with probability `hit` and otherwise
    leaves the step to `missed`."""
    return (hit * drafted[0] + (1 - hit) * missed[0], hit * drafted[1] + (1 - hit) * missed[1])


def choose(costs: Costs, estimates: Mapping[str, AcceptanceEstimate], max_k: int, extra_s: float = 0.0,
           method_s: Optional[Mapping[str, float]] = None, found: Optional[Mapping[str, int]] = None,
           run_rate: Optional[float] = None) -> Choice:
    """The (method, k) that gains the most against `run_rate` (below), or no speculation when
    nothing is expected to beat a plain pass (`extra_s`: a cost every step pays whatever is
    chosen; `method_s`: what drafting with a method costs this step besides, a draft model's
    catch-up on what other methods committed). `found`: methods that have drafted this step
    already (the lookups, which cost next to nothing) -> how many tokens they found: each is
    valued at k up to that many and at no drafting cost, and one that found nothing is not a
    candidate. Any other method that may find nothing to draft is valued with its fallback for
    those steps: the best other method on its own, or a plain pass. Ties go to no speculation,
    then to the method listed first, then to the smaller k.

    `run_rate`: the tokens per second the run is making (StepRate; a plain pass's rate at
    least). Each option is valued as its tokens less the tokens the run would have made in its
    seconds, `tokens - run_rate * seconds`, not by its own tokens per second: every token a
    step does not commit is left to the steps after it, which make them at the run's rate. A
    slow step that commits a few tokens (a draft model catching up where the lookups found
    nothing) beats a plain pass on its own rate and still loses where the lookups go on at
    three times that rate after it (the long-run rate is highest choosing this way:
    Dinkelbach's rule). Where this step can do better than the run's rate, the same rule drafts
    longer than the best rate would. Without a rate (the run's first step), by tokens per second."""
    plain = (1.0, costs.pass_s[0] + extra_s)
    rate = costs.pass_s[0]
    if run_rate is not None:
        run_rate = max(run_rate, 1.0 / plain[1])

    def value(tokens: float, seconds: float) -> float:
        return tokens / seconds if run_rate is None else tokens - run_rate * seconds

    found = found or {}
    # Each method on its own (a miss is a plain pass after the lookup): its best (tokens, seconds, k).
    alone: dict[str, tuple[float, float, int]] = {}
    outcomes: dict[str, list[tuple[float, float]]] = {}
    # method -> the _outcomes arguments besides its acceptance (share, k limit, extra seconds,
    # drafting), so the cautious check below values the same step the same way
    terms: dict[str, tuple[float, int, float, bool]] = {}
    for method, estimate in estimates.items():
        per_position, share, hit = estimate.summary()
        extra = extra_s + (method_s or {}).get(method, 0.0)
        if method in found:
            if not found[method]:
                continue
            terms[method] = (1.0, min(max_k, found[method]), extra, False)
            outcomes[method] = _outcomes(costs, method, per_position, *terms[method])
            top = None
            for k, (t, sec) in enumerate(outcomes[method], start=1):
                if top is None or value(t, sec) > top[0]:
                    top = (value(t, sec), t, sec, k)
            alone[method] = top[1:]
            continue
        terms[method] = (share, max_k, extra, True)
        outcomes[method] = _outcomes(costs, method, per_position, *terms[method])
        miss = (1.0, plain[1] + costs.draft_token_s.get(method, 0.0))
        for k, outcome in enumerate(outcomes[method], start=1):
            tokens, seconds = _mix(hit, outcome, miss)
            if method not in alone or value(tokens, seconds) > value(*alone[method][:2]):
                alone[method] = (tokens, seconds, k)
    best: Optional[tuple[float, float, str, int, Optional[tuple[str, int]]]] = None  # (value, speedup, ...)
    valued: dict[str, tuple[float, tuple[float, float]]] = {}  # method -> (hit, what a miss gives)
    plain_value = value(*plain)
    # the methods that beat a plain pass on their own, best first (ties: the one listed first)
    others = sorted(((value(t, sec), t, sec, m, k) for m, (t, sec, k) in alone.items() if value(t, sec) > plain_value),
                    key=lambda o: -o[0])
    for method, estimate in estimates.items():
        if method not in outcomes:
            continue
        if method in found:  # drafted already, never missing: its best k on its own
            valued[method] = (1.0, plain)
            tokens, seconds, k = alone[method]
            if best is None or value(tokens, seconds) > best[0]:
                best = (value(tokens, seconds), tokens * rate / seconds, method, k, None)
            continue
        hit = estimate.summary()[2]
        fallback = next(((t, sec, m, k) for _, t, sec, m, k in others if m != method), None)
        missed = (fallback[0], fallback[1]) if fallback else plain
        missed = (missed[0], missed[1] + costs.draft_token_s.get(method, 0.0))
        valued[method] = (hit, missed)
        for k, outcome in enumerate(outcomes[method], start=1):
            tokens, seconds = _mix(hit, outcome, missed)
            if best is None or value(tokens, seconds) > best[0]:
                best = (value(tokens, seconds), tokens * rate / seconds, method, k,
                        (fallback[2], fallback[3]) if fallback else None)
    if best is None:
        return Choice("none", 0, 1.0, "no speculation: no method available")
    best_value, speedup, method, k, fallback = best
    plain_speedup = plain[0] * rate / plain[1]
    if best_value <= value(*plain):
        if speedup > plain_speedup:
            return Choice("none", 0, plain_speedup,
                          f"no speculation: {method}, k = {k} would make {speedup:.2f}x here, below the "
                          f"{run_rate * rate:.2f}x the steps after it make")
        return Choice("none", 0, plain_speedup, f"no speculation: best expected {speedup:.2f}x ({method}, k = {k})")
    # The same step at the acceptance the method has surely shown (AcceptanceEstimate.cautious)
    # must still beat a plain pass by more than the costs' noise (MIN_GAIN).
    hit, missed = valued[method]
    share, _, extra, drafting = terms[method]
    sure = _outcomes(costs, method, estimates[method].cautious(), share, k, extra, drafting)[k - 1]
    tokens, seconds = _mix(hit, sure, missed)
    if tokens * rate / seconds <= plain_speedup * (1.0 + MIN_GAIN):
        return Choice("none", 0, plain_speedup,
                      f"no speculation: {method}, k = {k} would pay only at the acceptance it has not yet "
                      f"surely shown (expected {speedup:.2f}x, {tokens * rate / seconds:.2f}x at worst)")
    return Choice(method, k, speedup, f"{method}, k = {k}: expected {speedup:.2f}x", fallback)


# A pass over n tokens reads the weights once and does n tokens' arithmetic, so it costs at
# most about n passes over one (llama.cpp's CPU kernels reach 1.05n where they have no batched
# path). A probe that found more caught a busy moment, not this machine's arithmetic.
PLAUSIBLE_PER_TOKEN = 1.5


def implausible_size(pass_s: Sequence[float]) -> Optional[int]:
    """The first pass size n whose measured time exceeds PLAUSIBLE_PER_TOKEN * n passes over
    one token (the measurement caught a busy moment), else None."""
    if not pass_s or pass_s[0] <= 0:
        return 1 if pass_s else None
    for n, seconds in enumerate(pass_s[1:], start=2):
        if seconds > PLAUSIBLE_PER_TOKEN * n * pass_s[0]:
            return n
    return None


MAX_TAIL_P_MIN = 0.9  # a draft row is never asked to be surer than this to be verified
CALIBRATION_PRIOR = 4.0  # rows a drafter's confidence is taken at its word for, before it is checked
CALIBRATION_ROWS = 256  # the most recent draft rows the calibration is fitted to
MAX_SHIFT = 4.0  # log-odds: a row is never held more than this much likelier (or less) than its confidence


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1.0 - 1e-6)
    return float(np.log(p / (1.0 - p)))


def _sigmoid(x: np.ndarray | float):
    return 1.0 / (1.0 + np.exp(-x))


class TailCalibration:
    """How a model drafter's confidence in a row (its top-1 probability) compares with how often
    the target accepts that row. tail_p_min prices a row at the acceptance it needs; a drafter's
    confidence is that acceptance only if it is calibrated. A small draft model trained on its
    target's outputs agrees with it more often than its own softmax says (the demo draft), and an
    uncalibrated cut stops the very rows that would have paid.

    Fitted as one shift in log-odds (acceptance = sigmoid(logit(confidence) + shift), the shift
    that makes the expected acceptances of the recent rows sum to the accepted ones), over the
    rows after each draft's first that the target reached (every earlier row accepted), older
    steps weighing less (DECAY), and CALIBRATION_PRIOR rows of a calibrated drafter besides."""

    def __init__(self) -> None:
        self.rows: deque[tuple[int, float, bool]] = deque(maxlen=CALIBRATION_ROWS)  # (step, logit, accepted)
        self.steps = 0
        self._fitted = 0.0  # the last fit: where the next one starts
        self._shift: Optional[float] = 0.0

    def record(self, confidence: Sequence[float], n_accepted: int) -> None:
        """`confidence`: the draft's rows 1.. (row 0 is never cut); `n_accepted`: its accepted prefix."""
        self.steps += 1
        for row, value in enumerate(confidence, start=1):
            if row > n_accepted:  # not reached: an earlier row was rejected
                break
            self.rows.append((self.steps, _logit(value), row < n_accepted))
            self._shift = None

    def shift(self) -> float:
        """The fitted log-odds shift (0: calibrated; above 0: right more often than it says)."""
        if self._shift is None:
            if not self.rows:
                self._shift = 0.0
                return self._shift
            steps, logits, accepted = (np.array(column, dtype=np.float64) for column in zip(*self.rows))
            weights = DECAY ** (self.steps - steps)
            # the prior: rows at confidence 0.5 accepted half the time, which pull the shift to 0
            logits = np.append(logits, 0.0)
            accepted = np.append(accepted, 0.5)
            weights = np.append(weights, CALIBRATION_PRIOR)
            shift = self._fitted
            for _ in range(30):  # Newton's method on a monotone function of one variable
                p = _sigmoid(logits + shift)
                gap = float(np.dot(weights, p - accepted))
                slope = float(np.dot(weights, p * (1.0 - p)))
                step = gap / max(slope, 1e-9)
                shift = min(MAX_SHIFT, max(-MAX_SHIFT, shift - step))
                if abs(step) < 1e-6:
                    break
            self._shift = self._fitted = shift
        return self._shift

    def confidence_for(self, acceptance: float) -> float:
        """The confidence at which a row is accepted with probability `acceptance` (0: no cut)."""
        if acceptance <= 0.0:
            return 0.0
        return float(_sigmoid(_logit(acceptance) - self.shift()))


def tail_p_min(costs: Costs, method: str, k: int, expected_speedup: float) -> float:
    """How sure a draft model must be of a row beyond its first for verifying it to pay
    (its draft_p_min): the row adds its drafting and t(k+1) - t(k) to the step, and brings one
    token with about that probability, worth t(1)/speedup at the rate the step expects. Flat
    pass costs (a GPU, F16 on a fast CPU) ask little; passes that cost nearly n singles (Q4_1
    on a CPU without a batched kernel) ask a lot, so unlikely tails are cut before the pass.
    The probability is the row's acceptance: TailCalibration turns it into the drafter's confidence."""
    if k < 2 or expected_speedup <= 0 or costs.pass_s[0] <= 0:
        return 0.0
    marginal = costs.pass_cost(k + 1) - costs.pass_cost(k) + costs.draft_token_s.get(method, 0.0)
    return min(MAX_TAIL_P_MIN, max(0.0, marginal * expected_speedup / costs.pass_s[0]))


def pass_ratio(costs: Costs, n: int) -> float:
    """t(n)/t(1): what a pass over n tokens costs against a pass over one, on this machine."""
    return costs.pass_cost(n) / costs.pass_s[0]


def economics(costs: Costs) -> str:
    """The pass costs that decide whether speculation pays, in words: "a pass over 2 tokens
    costs 2.1x one here, over 3 tokens 2.7x, over 5 tokens 4.0x"."""
    sizes = [n for n in (2, 3, 5) if n <= len(costs.pass_s)]
    if not sizes:
        return "only single-token passes were measured"
    first, *rest = sizes
    return (f"a pass over {first} tokens costs {pass_ratio(costs, first):.1f}x one here"
            + "".join(f", over {n} tokens {pass_ratio(costs, n):.1f}x" for n in rest))


def ceiling(costs: Costs, method: str, max_k: int, extra_s: float = 0.0,
            acceptance: float = OPTIMISTIC_ACCEPTANCE) -> float:
    """The best speedup `method` could make at some k if every draft position were accepted at
    `acceptance` (better than most methods reach on most text), at its measured drafting cost."""
    return max(speedups(costs, method, [acceptance] * max_k, 1.0, max_k, extra_s))


def could_pay(costs: Costs, method: str, max_k: int, extra_s: float = 0.0,
              acceptance: float = OPTIMISTIC_ACCEPTANCE, beat: float = 1.0) -> bool:
    """Whether `method` could beat a plain pass (or the speedup `beat`: the rate the run is
    making) at its `ceiling`."""
    return ceiling(costs, method, max_k, extra_s, acceptance) > beat


def cannot_pay(costs: Costs, methods, max_k: int, extra_s: Optional[Mapping[str, float]] = None) -> Optional[str]:
    """None where some method could pay (could_pay); else why none can, in one line that a
    newcomer can read: "checking 2 tokens costs 2.1x one here, so no draft can pay"."""
    extra_s = extra_s or {}
    if any(could_pay(costs, m, max_k, extra_s.get(m, 0.0)) for m in methods):
        return None
    ratio = pass_ratio(costs, 2) if len(costs.pass_s) >= 2 else float("nan")
    return f"checking 2 tokens costs {ratio:.1f}x one here, so no draft can pay"


def worth_feeding(costs: Costs, method: str, max_k: int, shown: Optional[AcceptanceEstimate] = None) -> bool:
    """Whether a hidden-state drafter could beat a plain pass, paying its catch-up on every
    pass: at the acceptance it has shown on this model in earlier runs (`shown`), else even at
    OPTIMISTIC_ACCEPTANCE."""
    if shown is not None and shown.drafted > 0:
        per_position, share, _ = shown.summary()
    else:
        per_position, share = [OPTIMISTIC_ACCEPTANCE] * max_k, 1.0
    return max(speedups(costs, method, per_position, share, max_k, costs.observe_s.get(method, 0.0))) > 1.0
