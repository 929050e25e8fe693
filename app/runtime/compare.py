"""Baseline-vs-speculative runner, shared by the CLI, the compare view and benchmarks.

For each prompt it runs baseline (k = 0) and speculative decoding one after the other on
the same engine, alternating, so both see the same machine state. Timing covers decoding
only: from the start of the first verification pass to the end of the last, so prompt
processing (which prefix caching makes cheaper for whichever runs second) is excluded.

One run of a busy machine can say 10x where the next says 1.5x, so compare and the k sweep
repeat each point (`Repeats`: at least three runs, more until their spread is small, up to a
limit) and report the median and the runs' range ("1.46x (1.38–1.54 over 3 runs)", `Measure`,
in app/runtime/measure.py). A speedup within the noise of 1.0x (`beyond_noise`) is no reason
to pick a setting, and a machine that is visibly busy (its load average above its cores, or
the baseline's tok/s varying over 15% between runs) is said beside the figure (`busy_reason`).
A compare's headline is the speculative median over the baseline's, the figures its two arms
show; runs shorter than MIN_MEASURED_TOKENS are said to be too short to time.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

from specdesk.app.runtime.generation import RunResult, run_once
from specdesk.app.runtime.measure import NOISE_FLOOR, Measure, Repeats, beyond_noise, busy_reason, machine_load
from specdesk.engines.files import require_regular_file
from specdesk.engines.types import GenerationRequest, RunStats, SamplingParams, SpecConfig, SpecDeskError, StepEvent

EventCallback = Callable[[str, int, StepEvent], None]  # (run label, prompt index, event)


@dataclass(frozen=True)
class PromptResult:
    prompt: str
    baseline: RunResult
    speculative: RunResult

    @property
    def identical(self) -> bool:
        return self.baseline.tokens == self.speculative.tokens

    def first_divergence(self) -> Optional[int]:
        for i, (a, b) in enumerate(zip(self.baseline.tokens, self.speculative.tokens)):
            if a != b:
                return i
        if len(self.baseline.tokens) != len(self.speculative.tokens):
            return min(len(self.baseline.tokens), len(self.speculative.tokens))
        return None


# Two logits closer than this are a tie to within numerical noise, whatever the model: a batched
# pass and a single-token pass sum in different orders, and in F16/BF16 that moves a logit by up
# to about 1e-2 on the demo models (measured differences are a few 1e-4). A quantized model's
# own noise is measured (engines/speculation/noise.py) and used where it is larger.
NEAR_TIE_LOGIT_GAP = 0.02


@dataclass(frozen=True)
class Divergence:
    """Where a greedy speculative run first left the baseline, and why it may have."""

    prompt: int  # index of the prompt
    token: int  # index of the first differing generated token
    # "near_tie": the two runs chose the target's top two tokens, and their gap is within the
    # arithmetic's noise there; else "mismatch" (a bug)
    kind: str
    logit_gap: Optional[float]  # the target's top-1 minus top-2 logit at that position
    noise: Optional[float] = None  # this model's measured batched-against-single noise, when measured

    def to_json(self) -> dict:
        return {"prompt": self.prompt, "token": self.token, "kind": self.kind,
                "logit_gap": None if self.logit_gap is None else round(self.logit_gap, 6),
                "noise": None if self.noise is None else round(self.noise, 6)}

    def describe(self) -> str:
        gap = "" if self.logit_gap is None else f"the target's top two logits are {self.logit_gap:.3g} apart there"
        noise = (f"this model's batched and single-token logits differ by up to {self.noise:.3g}"
                 if self.noise is not None and self.noise > NEAR_TIE_LOGIT_GAP else "")
        if self.kind == "near_tie":
            what = "the arithmetic, not a bug: " + (f"{gap}, within the noise ({noise})" if noise else
                                                     f"{gap}, a near-tie" if gap else "a near-tie")
        else:
            what = ("a mismatch, a bug: the target clearly preferred another token"
                    + (f" ({gap}{', beyond the noise: ' + noise if noise else ''})" if gap else ""))
        return f"prompt {self.prompt + 1}, token {self.token + 1}: {what}"


def classify_divergence(engine, prompt_index: int, prompt_tokens: list[int], result: "PromptResult",
                        tolerance: float = NEAR_TIE_LOGIT_GAP, noise: Optional[float] = None) -> Optional[Divergence]:
    """The first divergence of a greedy pair of runs, classified by the target's own logits at
    that position (one single-token pass after the common prefix): a near-tie when the two
    runs chose the target's top two tokens and those are within the tolerance (the larger of
    `tolerance` and the model's measured `noise`), else a mismatch."""
    position = result.first_divergence()
    if position is None:
        return None
    base, spec = result.baseline.tokens, result.speculative.tokens
    top = engine.top_logits([*prompt_tokens, *base[:position]], 2)
    gap = top[0][1] - top[1][1]
    chosen = {base[position] if position < len(base) else None, spec[position] if position < len(spec) else None}
    near_tie = gap <= max(tolerance, noise or 0.0) and chosen == {top[0][0], top[1][0]}
    return Divergence(prompt_index, position, "near_tie" if near_tie else "mismatch", float(gap), noise)


def divergence_noise(engine, prompt_tokens: list[int], result: "PromptResult") -> Optional[float]:
    """The target's batched-against-single noise, measured on the prompt and its baseline output
    (the text this model writes), or None where the sequence is too short to measure."""
    sequence = [*prompt_tokens, *result.baseline.tokens]
    try:
        return engine.logit_noise(sequence[-64:])
    except ValueError:
        return None


def merge_stats(stats: Iterable[RunStats]) -> RunStats:
    items = list(stats)
    width = max((len(s.per_position_drafted) for s in items), default=0)
    hist_width = max((len(s.accepted_length_histogram) for s in items), default=0)

    def column_sum(vectors, n):
        return tuple(sum(v[i] for v in vectors if i < len(v)) for i in range(n))

    return RunStats(
        tokens=sum(s.tokens for s in items),
        seconds=sum(s.seconds for s in items),
        passes=sum(s.passes for s in items),
        drafted=sum(s.drafted for s in items),
        accepted=sum(s.accepted for s in items),
        draft_s=sum(s.draft_s for s in items),
        verify_s=sum(s.verify_s for s in items),
        per_position_drafted=column_sum([s.per_position_drafted for s in items], width),
        per_position_accepted=column_sum([s.per_position_accepted for s in items], width),
        accepted_length_histogram=column_sum([s.accepted_length_histogram for s in items], hist_width),
    )


# --- repeated runs (app/runtime/measure.py: Measure, Repeats, beyond_noise, busy_reason) ----------
MIN_MEASURED_TOKENS = 32  # fewer tokens per run than this measure scheduling noise more than decoding


def run_speedups(runs: Iterable[Iterable["PromptResult"]]) -> Measure:
    """Each run's speedup (its speculative tok/s over its own baseline's, over its prompts): median and spread."""
    speedups = []
    for run in runs:
        results = list(run)
        base = merge_stats(r.baseline.stats for r in results)
        spec = merge_stats(r.speculative.stats for r in results)
        if base.tok_per_s > 0 and spec.tokens:
            speedups.append(spec.tok_per_s / base.tok_per_s)
    return Measure.of(speedups)


@dataclass(frozen=True)
class CompareReport:
    engine: str
    target: str
    draft: Optional[str]
    method: str
    k: int
    temperature: float
    results: tuple[PromptResult, ...]
    divergences: tuple[Divergence, ...] = ()  # greedy runs only: each prompt's first divergence
    device: Optional[str] = None  # where the models sat (the engine's device_description)
    repeats: tuple[tuple[PromptResult, ...], ...] = ()  # the runs after the first (`results`), over the same prompts
    load: Optional[tuple[float, int]] = None  # the machine's load average and cores when the runs ended

    @property
    def runs(self) -> tuple[tuple[PromptResult, ...], ...]:
        return (self.results, *self.repeats)

    @property
    def baseline(self) -> RunStats:
        """The first run's baseline over the prompts; the tok/s figure over all runs is `baseline_rate`."""
        return merge_stats(r.baseline.stats for r in self.results)

    @property
    def speculative(self) -> RunStats:
        return merge_stats(r.speculative.stats for r in self.results)

    def _per_run(self, arm: str) -> list[RunStats]:
        return [merge_stats(getattr(r, arm).stats for r in run) for run in self.runs]

    @property
    def baseline_rate(self) -> Measure:
        return Measure.of(s.tok_per_s for s in self._per_run("baseline") if s.tokens)

    @property
    def speculative_rate(self) -> Measure:
        return Measure.of(s.tok_per_s for s in self._per_run("speculative") if s.tokens)

    @property
    def speedup_measure(self) -> Measure:
        """Each run's speedup (paired with its own baseline): their median is what measurements keep."""
        return run_speedups(self.runs)

    @property
    def headline_speedup(self) -> float:
        """The speculative median tok/s over the baseline's: the figure the two panes show divide
        to, so the headline never contradicts them (a run's own ratio can, on a busy machine)."""
        base, spec = self.baseline_rate.median, self.speculative_rate.median
        return spec / base if base > 0 else 0.0

    def headline(self, sign: str = "x") -> str:
        """'1.47x faster (runs 1.40–1.52x, 3 runs)', or within the noise of 1.0x, or slower."""
        speedup, runs = self.headline_speedup, self.speedup_measure
        across = f"runs {runs.span(sign)}, {runs.runs} runs" if runs.runs > 1 else f"{runs.runs} run"
        figure = f"{speedup:.2f}{sign}"
        if not self.beyond_noise or (speedup - 1.0) * (runs.median - 1.0) <= 0 or abs(speedup - 1.0) <= NOISE_FLOOR:
            return f"{figure}: within the noise of 1.0{sign} ({across})"
        if speedup > 1:
            return f"{figure} faster ({across})"
        return f"{figure}, slower than baseline ({across})"

    @property
    def too_short(self) -> Optional[str]:
        """Why these runs are too short to measure a speedup (None: long enough): a run of a few
        tokens times a few passes, which scheduling noise alone can make look twice as fast."""
        tokens = min((merge_stats(r.baseline.stats for r in run).tokens for run in self.runs), default=0)
        if tokens >= MIN_MEASURED_TOKENS:
            return None
        return (f"each run generated {tokens} token{'s' if tokens != 1 else ''}: too few to measure a speedup "
                f"(at least {MIN_MEASURED_TOKENS}); use a prompt with a longer answer or more max tokens")

    @property
    def speedup(self) -> float:
        return self.speedup_measure.median

    @property
    def beyond_noise(self) -> bool:
        return beyond_noise(self.speedup_measure)

    @property
    def busy(self) -> Optional[str]:
        return busy_reason(self.baseline_rate, self.load)

    @property
    def identical_outputs(self) -> Optional[bool]:
        if self.temperature > 0:
            return None
        return all(r.identical for run in self.runs for r in run)

    def auto_report(self) -> dict:
        """Method auto over all prompts: its share of steps by method and k, and the costs it
        used at the end (from the last prompt's run)."""
        reports = [r.speculative.auto_report for r in self.results if r.speculative.auto_report]
        steps = sum(r["steps"] for r in reports)
        shares: dict[str, float] = {}
        for report in reports:
            for label, share in report["steps_by_choice"].items():
                shares[label] = shares.get(label, 0.0) + share * report["steps"]
        return {"steps": steps,
                "steps_by_choice": {label: round(n / steps, 3) for label, n in
                                    sorted(shares.items(), key=lambda item: -item[1])} if steps else {},
                "costs": reports[-1]["costs"] if reports else None,
                # why speculation pays or not on this machine: the pass costs in words, and where no
                # draft could pay, auto's one-line verdict (engines/speculation/chooser.py)
                "economics": reports[-1].get("economics") if reports else None,
                "verdict": reports[-1].get("verdict") if reports else None}

    def auto_summary(self) -> Optional[str]:
        """One line on what auto decided and why, for the table: "auto drafted nothing: checking
        2 tokens costs 2.1x one here, so no draft can pay", or its choices and the economics."""
        if self.method != "auto":
            return None
        report = self.auto_report()
        if not report["steps"]:
            return None
        if report["verdict"]:
            return f"auto drafted nothing: {report['verdict']}"
        choices = ", ".join(f"{label} {share:.0%}" for label, share in list(report["steps_by_choice"].items())[:3])
        return f"auto's steps: {choices}" + (f" ({report['economics']})" if report["economics"] else "")

    def to_json(self) -> dict:
        base, spec = self.baseline, self.speculative
        base_rate, spec_rate, speedup = self.baseline_rate, self.speculative_rate, self.speedup_measure
        return {
            "engine": self.engine,
            "device": self.device,
            "target": self.target,
            "draft": self.draft,
            "method": self.method,
            "k": self.k,
            "temperature": self.temperature,
            "prompts": len(self.results),
            "runs": speedup.runs,
            "baseline": {"tokens": base.tokens, "seconds": round(base.seconds, 4),
                         "tok_per_s": round(base_rate.median, 3), "tok_per_s_spread": round(base_rate.spread, 3)},
            "speculative": {
                "tokens": spec.tokens, "seconds": round(spec.seconds, 4), "tok_per_s": round(spec_rate.median, 3),
                "tok_per_s_spread": round(spec_rate.spread, 3),
                "drafted": spec.drafted, "accepted": spec.accepted,
                "acceptance_rate": round(spec.acceptance_rate, 4),
                "mean_accepted_length": round(spec.mean_accepted_length, 4),
                "per_position_acceptance": [round(a, 4) for a in spec.per_position_acceptance],
            },
            "speedup": round(speedup.median, 4),
            "speedup_spread": round(speedup.spread, 4),
            "speedup_range": [round(min(speedup.values), 4), round(max(speedup.values), 4)] if speedup.values else [],
            "speedup_of_medians": round(self.headline_speedup, 4),
            "speedup_beyond_noise": self.beyond_noise,
            "busy": self.busy,
            "too_short": self.too_short,
            **({"auto": self.auto_report()} if self.method == "auto" else {}),
            "identical_outputs": self.identical_outputs,
            "divergences": [d.to_json() for d in self.divergences],
        }


def warm_up(engine, prompt_tokens: list[int], spec: SpecConfig, sampling: SamplingParams) -> None:
    """One short run of each kind, so first-call allocations are not timed."""
    for config in (SpecConfig(), spec):
        run_once(engine, GenerationRequest(tuple(prompt_tokens), max_tokens=4, sampling=sampling, spec=config))


def compare(engine, prompts: list[str], spec: SpecConfig, sampling: SamplingParams, max_tokens: int,
            tokenize: Callable[[str], list[int]], on_event: Optional[EventCallback] = None,
            cancel: Optional[threading.Event] = None, warm: bool = True,
            repeats: Repeats = Repeats()) -> CompareReport:
    """Baseline and speculative on every prompt, run again until the speedup is steady
    (`repeats`); `on_event` sees the first run's events."""
    if not prompts:
        raise SpecDeskError("no prompts to compare")
    cancel = cancel or threading.Event()
    encoded = [tokenize(p) for p in prompts]
    if warm:
        warm_up(engine, encoded[0], spec, sampling)
    runs: list[tuple[PromptResult, ...]] = []
    while True:
        run = compare_once(engine, prompts, encoded, spec, sampling, max_tokens, cancel,
                           on_event if not runs else None, flip=len(runs) % 2 == 1)
        if runs and (cancel.is_set() or len(run) < len(prompts)):
            break  # a cut run is not a measurement: the ones before it stand
        runs.append(run)
        if cancel.is_set() or not repeats.more(run_speedups(runs)):
            break
    divergences = []
    noise: Optional[float] = None  # measured at the first divergence: identical runs need none
    if sampling.greedy:
        for index, (tokens, result) in enumerate(zip(encoded, runs[0])):
            if "cancelled" in (result.baseline.finish_reason, result.speculative.finish_reason):
                continue  # a cut run differs in length only
            if result.first_divergence() is None:
                continue
            if noise is None:
                noise = divergence_noise(engine, tokens, result)
            divergence = classify_divergence(engine, index, tokens, result, noise=noise)
            if divergence is not None:
                divergences.append(divergence)
    return CompareReport(engine.name, str(engine.target.path), spec.draft_path, spec.method,
                         spec.k, sampling.temperature, runs[0], tuple(divergences),
                         getattr(engine, "device_description", None), tuple(runs[1:]), machine_load())


def compare_once(engine, prompts: list[str], encoded: list[list[int]], spec: SpecConfig, sampling: SamplingParams,
                 max_tokens: int, cancel: threading.Event, on_event: Optional[EventCallback] = None,
                 flip: bool = False) -> tuple[PromptResult, ...]:
    """One run over the prompts: baseline and speculative on each, the arm that goes first
    alternating between prompts (and, with `flip`, the other way round from the last run)."""
    baseline_spec = dataclasses.replace(spec, method="none")
    results = []
    for index, (prompt, tokens) in enumerate(zip(prompts, encoded)):
        # Prompts are independent requests: what a learning proposer (the n-gram pool) saw
        # in earlier prompts' outputs must not help it here.
        engine.reset_chat()
        arms = {}
        # Alternate which arm goes first, so a machine that speeds up or slows down over the run
        # (clock boost, a background job, caches warming) does not favour one arm.
        order = (("baseline", baseline_spec), ("speculative", spec))
        for label, config in order if (index % 2 == 0) != flip else order[::-1]:
            request = GenerationRequest(tuple(tokens), max_tokens=max_tokens, sampling=sampling, spec=config)
            callback = None if on_event is None else (lambda e, label=label: on_event(label, index, e))
            arms[label] = run_once(engine, request, cancel, callback)
        results.append(PromptResult(prompt, arms["baseline"], arms["speculative"]))
        if cancel.is_set():
            break
    return tuple(results)


# --- the k sweep ----------------------------------------------------------------------
@dataclass(frozen=True)
class SweepPoint:
    k: int  # 0 is the baseline
    stats: RunStats  # the run whose tok/s is the median of this point's runs
    rate: Measure  # tok/s over the runs
    speedup: Optional[Measure] = None  # each run's tok/s over the baseline's median; None for the baseline


@dataclass(frozen=True)
class SweepResult:
    method: str
    baseline: RunStats
    points: tuple[SweepPoint, ...]  # speculative runs, in the order of ks
    baseline_rate: Measure = Measure(0.0, 0.0, 0)
    load: Optional[tuple[float, int]] = None  # the machine's load average and cores when the sweep ended

    def best(self) -> Optional[SweepPoint]:
        """The fastest k, when its speedup is beyond the noise of 1.0x; None otherwise (a k that
        is no faster than the baseline, or whose gain the runs' spread could explain)."""
        best = max(self.points, key=lambda p: p.rate.median, default=None)
        if best is None or best.speedup is None or not beyond_noise(best.speedup) or best.speedup.median < 1.0:
            return None
        return best

    def fastest(self) -> Optional[SweepPoint]:
        return max(self.points, key=lambda p: p.rate.median, default=None)

    @property
    def busy(self) -> Optional[str]:
        return busy_reason(self.baseline_rate, self.load)


def repeated(run: Callable[[], RunStats], repeats: Repeats, cancel: threading.Event) -> tuple[RunStats, Measure]:
    """`run` until its tok/s is steady: (the run at the median, the tok/s over the runs)."""
    runs: list[RunStats] = []
    while True:
        stats = run()
        if runs and cancel.is_set():
            break  # a cut run is not a measurement
        runs.append(stats)
        rate = Measure.of(s.tok_per_s for s in runs)
        if cancel.is_set() or not repeats.more(rate):
            break
    middle = sorted(runs, key=lambda s: s.tok_per_s)[(len(runs) - 1) // 2]
    return middle, rate


def sweep(engine, tokens: list[int], spec: SpecConfig, sampling: SamplingParams, max_tokens: int,
          ks: Iterable[int], cancel: threading.Event, on_point: Callable[[SweepPoint], None],
          repeats: Repeats = Repeats(), learns: bool = False) -> SweepResult:
    """The baseline, then the speculative method at each k, each repeated until steady; with
    `learns` (the n-gram pool) the engine's chat is reset before every speculative run, so
    each starts from the same state."""
    warm_up(engine, tokens, spec, sampling)

    def once(config: SpecConfig) -> RunStats:
        if learns and config.method != "none":
            engine.reset_chat()
        request = GenerationRequest(tuple(tokens), max_tokens=max_tokens, sampling=sampling, spec=config)
        return run_once(engine, request, cancel).stats

    baseline, baseline_rate = repeated(lambda: once(dataclasses.replace(spec, method="none")), repeats, cancel)
    on_point(SweepPoint(0, baseline, baseline_rate))
    points = []
    for k in ks:
        if cancel.is_set():
            break
        runs: list[RunStats] = []

        def run_k(k=k) -> RunStats:
            runs.append(once(dataclasses.replace(spec, k=k)))
            return runs[-1]

        stats, rate = repeated(run_k, repeats, cancel)
        kept = runs[:rate.runs]
        speedup = Measure.of(s.tok_per_s / baseline_rate.median for s in kept) if baseline_rate.median > 0 else None
        point = SweepPoint(k, stats, rate, speedup)
        points.append(point)
        on_point(point)
    return SweepResult(spec.method, baseline, tuple(points), baseline_rate, machine_load())


MAX_PROMPTS_FILE_BYTES = 256 * 2**20


def load_prompts(path: str | Path) -> list[str]:
    """A JSONL file with one {"prompt": "..."} per line; a broken line is named."""
    return [item["prompt"] for _, item in load_prompt_records(path)]


def load_prompt_records(path: str | Path) -> list[tuple[int, dict]]:
    """(line number, object) of each line of a JSONL prompts file, every object with a "prompt"
    string; a broken line is named. Other keys are the caller's to check."""
    p = require_regular_file(path, 'prompts file (JSONL, one {"prompt": "..."} per line)')
    size = p.stat().st_size
    if size > MAX_PROMPTS_FILE_BYTES:
        raise SpecDeskError(f"{p}: {size / 2**20:.0f} MB is too large for a prompts file "
                            f"(at most {MAX_PROMPTS_FILE_BYTES // 2**20} MB)")
    try:
        text = p.read_bytes().decode("utf-8-sig")
    except OSError as e:
        raise SpecDeskError(f"{p}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        line = _line_of(e.object, e.start)
        raise SpecDeskError(f"{p}, line {line}: not UTF-8 text (byte 0x{e.object[e.start]:02x}); "
                            "save the file as UTF-8") from None
    prompts = []
    # Lines end at "\n" only: JSON strings may hold U+2028 or U+0085, which splitlines() would cut.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecDeskError(f"{p}, line {number}: not valid JSON ({e.msg})") from e
        except RecursionError:
            raise SpecDeskError(f"{p}, line {number}: JSON nested too deeply") from None
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
            raise SpecDeskError(f'{p}, line {number}: expected an object like {{"prompt": "..."}}')
        try:
            item["prompt"].encode("utf-8")
        except UnicodeEncodeError as e:
            raise SpecDeskError(f"{p}, line {number}: the prompt has a lone surrogate "
                                f"({item['prompt'][e.start]!a}), which is not text") from None
        prompts.append((number, item))
    if not prompts:
        raise SpecDeskError(f"{p}: no prompts in the file")
    return prompts


def _line_of(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1
