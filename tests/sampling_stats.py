"""The sampling-distribution test shared by both engines' tests: speculative runs against plain
sampling's exact distribution.

One arm of sampled speculative runs is tested against the exact distribution of each generated
position, computed from the target over every path of tokens (down to PATH_FLOOR). One arm of
2000 runs against the exact distribution has the power of a two-arm test of about 4000 sampled
runs each, and costs no plain runs at all. The power check holds each test to a 6% shift of mass
onto one likely token."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Callable, Sequence

import numpy as np
from scipy import stats as scipy_stats

from specdesk.engines.speculation.verify import sampling_probs
from specdesk.engines.types import GenerationRequest, SamplingParams, SpecConfig

RUNS, POSITIONS = 2000, (0, 1)  # the first and second token of a draft
SHIFT = 0.06  # the power check: moving this share of the sample to one token must be rejected
PATH_FLOOR = 1e-6  # paths less likely than this are left out of the exact distributions (mass reported)


def token_counts(engine, prompt_tokens, spec, sampling, runs, positions):
    """Counts of the generated token at each position over `runs` seeds, and the number
    of draft tokens accepted along the way."""
    counts = {p: Counter() for p in positions}
    accepted = 0
    for seed in range(runs):
        seeded = SamplingParams(sampling.temperature, sampling.top_p, sampling.top_k, seed)
        request = GenerationRequest(tuple(prompt_tokens), max_tokens=max(positions) + 1, sampling=seeded,
                                    spec=spec, stop_at_eos=False)
        out = []
        for event in engine.generate(request, threading.Event()):
            out.extend(event.tokens)
            accepted += event.accepted
        for p in positions:
            counts[p][out[p]] += 1
    return counts, accepted


class Walker:
    """What the exact walk needs of a target: decode tokens at the end of the context (returning
    the last token's logits as float numpy), the context's length, and rollback to a length."""

    def __init__(self, decode_last: Callable[[list[int]], np.ndarray], n_past: Callable[[], int],
                 rollback: Callable[[int], None]):
        self.decode_last, self.n_past, self.rollback = decode_last, n_past, rollback


def exact_marginals(walker: Walker, prompt: Sequence[int], sampling: SamplingParams, last: int) -> tuple[list, float]:
    """Plain sampling's exact distribution of the token at each position 0..last after `prompt`:
    every path of tokens through the target, each weighted by its probability under `sampling`
    (sampling_probs, as the engines sample), down to PATH_FLOOR. Returns the distributions and
    the mass of the paths left out."""
    marginals: list = []
    left_out = 0.0

    def walk(depth: int, weight: float, logits: np.ndarray) -> None:
        nonlocal left_out
        probs = sampling_probs(logits, sampling)
        if not marginals:
            marginals.extend(np.zeros_like(probs) for _ in range(last + 1))
        marginals[depth] += weight * probs
        if depth == last:
            return
        n_past = walker.n_past()
        for token in np.flatnonzero(probs):
            path = weight * probs[token]
            if path < PATH_FLOOR:
                left_out += path
                continue
            walk(depth + 1, path, walker.decode_last([int(token)]))
            walker.rollback(n_past)

    walk(0, 1.0, walker.decode_last(list(prompt)))
    return marginals, left_out


def chi_square_fits(counts: Counter, probs: np.ndarray, min_expected: float = 5.0, max_categories: int = 12) -> float:
    """One-sample chi-square p-value of `counts` against the distribution `probs`: the most likely
    tokens (each expected at least `min_expected` times) as bins, every other token pooled into
    one more, and that bin merged into the last one while it expects fewer than `min_expected`
    draws. Pooling keeps the test's power on broad distributions: a hundred bins would spread the
    statistic over a hundred degrees of freedom and hide a shift of mass onto a likely token, while
    the pooled bin still sees mass moving into or out of the rare ones. Tokens the exact
    distribution left out (paths below PATH_FLOOR, a top-p boundary a batched pass puts
    elsewhere) fall into the pooled bin."""
    n = sum(counts.values())
    order = np.argsort(-probs)
    common = [int(t) for t in order[:max_categories] if probs[t] * n >= min_expected]
    observed = [counts[t] for t in common] + [n - sum(counts[t] for t in common)]
    expected = [probs[t] * n for t in common] + [n * max(0.0, 1.0 - sum(probs[t] for t in common))]
    if expected[-1] < min_expected and len(observed) > 1:
        observed[-2:] = [observed[-2] + observed[-1]]
        expected[-2:] = [expected[-2] + expected[-1]]
    expected = np.array(expected) * (n / sum(expected))  # sums agree (float rounding)
    return scipy_stats.chisquare(observed, expected).pvalue


_exact: dict = {}


def exact_positions(target: str, open_walker: Callable[[], tuple[Walker, Callable[[], None]]],
                    prompt: Sequence[int], sampling: SamplingParams) -> list:
    """exact_marginals at POSITIONS for `target` (a name: the cache key), computed once per
    process with the walker `open_walker` returns (with the function that frees it)."""
    key = (target, tuple(prompt), sampling)
    if key not in _exact:
        walker, close = open_walker()
        try:
            exact, left_out = exact_marginals(walker, prompt, sampling, max(POSITIONS))
        finally:
            close()
        assert left_out < 1e-3, f"the exact walk left out {left_out:.2g} of the mass"
        _exact[key] = exact
    return _exact[key]


def assert_follows_plain_sampling(engine, exact: list, prompt: Sequence[int], spec: SpecConfig,
                                  sampling: SamplingParams, runs: int = RUNS, min_accepted: int = 50,
                                  label: str = "") -> None:
    """`runs` seeded speculative runs of three tokens (a draft is cut to the tokens left, as a
    user's reply goes on) follow plain sampling's exact distribution `exact` (exact_positions) at
    POSITIONS; at least `min_accepted` draft tokens are accepted over them (0: the test covers
    the rejection path only), and the same test rejects the sample with SHIFT of it moved to
    one token."""
    counts, accepted = token_counts(engine, prompt, spec, sampling, runs, (*POSITIONS, max(POSITIONS) + 1))
    # Both paths must be exercised: accepted draft tokens and residual resampling after rejections.
    assert accepted >= min_accepted, f"{label}: only {accepted} draft tokens accepted: the test would not exercise acceptance"
    for position in POSITIONS:
        p_value = chi_square_fits(counts[position], exact[position])
        top = [(int(t), round(float(exact[position][t]) * runs)) for t in np.argsort(-exact[position])[:8]]
        assert p_value > 0.01, f"{label} position {position}: p = {p_value:.4g}\n{top}\n{counts[position].most_common(8)}"
    shifted_to = int(np.argsort(-exact[0])[1])  # the second most likely token: a bin of its own
    assert exact[0][shifted_to] * runs >= 5
    draws = np.array(list(counts[0].elements()))
    np.random.default_rng(0).shuffle(draws)
    draws[: int(runs * SHIFT)] = shifted_to
    assert chi_square_fits(Counter(draws.tolist()), exact[0]) < 0.01, "the sample is too small to detect a shift"


def gguf_exact(path, prompt: Sequence[int], sampling: SamplingParams) -> list:
    """exact_positions for a GGUF target, walked by llama.cpp on one thread."""
    return exact_positions(f"gguf:{path}", lambda: _gguf_walker(path), prompt, sampling)


def _gguf_walker(path, n_ctx: int = 256):
    from specdesk.engines.llama.binding import GgufContext, GgufModel

    model = GgufModel(path)
    ctx = GgufContext(model, n_ctx, 1)

    def close():
        ctx.close(), model.close()

    return Walker(lambda tokens: ctx.decode(tokens, all_logits=False)[-1], lambda: ctx.n_past, ctx.rollback), close
