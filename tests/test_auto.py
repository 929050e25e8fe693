"""Method auto: the chooser on literal costs and acceptances, and on both engines greedy output
identical to baseline and sampled output distributed as plain sampling."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from specdesk.app.runtime.compare import load_prompts
from specdesk.app.storage.paths import assets_dir
from specdesk.engines.speculation import costs as cost_cache
from specdesk.engines.speculation.auto import REPROBE_EVERY, AutoProposer
from specdesk.engines.speculation.chooser import AcceptanceEstimate, Costs, choose, expected_speedup, expected_tokens
from specdesk.engines.types import GenerationRequest, SamplingParams, SpecConfig, SpecDeskError

PROMPTS = load_prompts(assets_dir() / "prompts" / "code.jsonl")


def estimate(per_position: list[float], steps: int = 10**7) -> AcceptanceEstimate:
    """An estimate that has seen `steps` steps of a method accepting each position with these
    conditional rates (expected counts, so the prior no longer matters)."""
    e = AcceptanceEstimate(len(per_position))
    reached = steps * np.concatenate([[1.0], np.cumprod(per_position)[:-1]])
    e.reached[:] = reached
    e.accepted[:] = reached * np.asarray(per_position)
    e.asked = e.drafted = steps * len(per_position)
    return e


# --- the chooser on literals ------------------------------------------------------------------
def test_expected_tokens_per_step():
    assert expected_tokens([0.5, 0.5, 0.5], 2) == 1.75
    assert expected_tokens([1.0, 1.0], 2) == 3.0
    assert expected_tokens([0.0, 1.0], 2) == 1.0


def test_picks_no_speculation_when_nothing_beats_a_plain_pass():
    # Drafting costs half a pass per token and a pass over 2 tokens costs almost two: nothing pays.
    costs = Costs((1.0, 1.9, 2.8, 3.7), {"draft": 0.5, "mtp": 0.3})
    choice = choose(costs, {"draft": estimate([0.7, 0.6, 0.5]), "mtp": estimate([0.8, 0.6, 0.5])}, 3)
    assert (choice.method, choice.k) == ("none", 0)
    assert choice.reason.startswith("no speculation: best expected 0.")
    assert choose(costs, {}, 3).reason == "no speculation: no method available"


def test_picks_the_method_and_k_with_the_most_tokens_per_second():
    costs = Costs((1.0, 1.1, 1.2, 1.3, 1.4), {"ngram": 0.0, "draft": 0.1})
    estimates = {"ngram": estimate([0.5, 0.3, 0.2, 0.1]), "draft": estimate([0.9, 0.9, 0.9, 0.5])}
    choice = choose(costs, estimates, 4)
    # draft: k = 3 gives 1 + .9 + .81 + .729 = 3.439 tokens in 0.3 + 1.3 s = 2.149x; k = 4 adds
    # .729 * .5 tokens for 0.2 s more (2.035x); ngram's best is 1.5 / 1.1 = 1.36x.
    assert (choice.method, choice.k) == ("draft", 3)
    assert choice.expected_speedup == pytest.approx(3.439 / 1.6)
    assert choice.reason == "draft, k = 3: expected 2.15x"
    # A draft that costs as much as a pass loses to the free n-gram lookup.
    expensive = Costs(costs.pass_s, {"ngram": 0.0, "draft": 1.0})
    assert choose(expensive, estimates, 4).method == "ngram"


def test_a_slow_step_that_beats_a_plain_pass_loses_to_the_rate_the_run_is_making():
    """Where the lookups found nothing, a draft model drafting 2 tokens at half a pass each
    commits 2.71 tokens in 2.2 passes' time (1.23x a plain pass), but the run makes 2.5x a plain
    pass's rate with the lookups: a plain pass and 1.2 passes of the run after it make 4 tokens
    in the same time, so the plain pass is the better step."""
    costs = Costs((1.0, 1.1, 1.2), {"draft": 0.5})
    estimates = {"draft": estimate([0.9, 0.9])}
    alone = choose(costs, estimates, 2)
    assert (alone.method, alone.k) == ("draft", 2) and alone.expected_speedup == pytest.approx(2.71 / 2.2)
    # at a plain pass's rate the choice is the same as by tokens per second
    assert (choose(costs, estimates, 2, run_rate=1.0).method, choose(costs, estimates, 2, run_rate=1.0).k) == ("draft", 2)
    behind = choose(costs, estimates, 2, run_rate=2.5)
    assert behind.method == "none"
    # (its best at that rate: k = 1, 1.9 tokens in 1.6 passes)
    assert behind.reason == "no speculation: draft, k = 1 would make 1.19x here, below the 2.50x the steps after it make"


def test_a_step_better_than_the_run_drafts_longer_than_the_best_rate_would():
    """A lookup that found 4 tokens, the first accepted at 0.9 and each after it at 0.5, on passes
    that cost 0.4 more per token: k = 1 makes the best rate (1.9 / 1.4 = 1.36x, k = 2 2.35 / 1.8 =
    1.31x), but a run making 1.1x a plain pass's rate gains more from k = 2 (2.35 - 1.98 = 0.37
    tokens against 1.9 - 1.54 = 0.36)."""
    costs = Costs((1.0, 1.4, 1.8, 2.2, 2.6), {"ngram": 0.0})
    estimates = {"ngram": estimate([0.9, 0.5, 0.5, 0.5])}
    assert choose(costs, estimates, 4, found={"ngram": 4}).k == 1
    assert choose(costs, estimates, 4, found={"ngram": 4}, run_rate=1.1).k == 2


def test_expected_speedup_counts_shorter_drafts():
    """An n-gram method that finds half the tokens it is asked for pays for half a pass's extra rows."""
    costs = Costs((1.0, 2.0, 3.0), {"ngram": 0.0})
    assert expected_speedup(costs, "ngram", [1.0, 1.0], 0.5, 2) == pytest.approx(3.0 / 2.0)


def test_acceptance_estimate_counts_positions_reached():
    e = AcceptanceEstimate(3)
    e.record(k=3, drafted=3, accepted=1)  # position 0 accepted, 1 rejected, 2 never reached
    e.record(k=3, drafted=1, accepted=1)  # drafted one token only: position 1 reached, nothing there
    assert list(e.reached) == pytest.approx([1.97, 1.97, 0.0])
    assert list(e.accepted) == pytest.approx([1.97, 0.0, 0.0])
    # where nothing was seen, the position before it: a draft cut at k says nothing about k + 1
    assert e.per_position()[2] == pytest.approx(e.per_position()[1])
    assert e.per_position()[1] == pytest.approx(2 * e.per_position()[0] / 3.97)


class Counting:
    """A proposer that always drafts k tokens of 1 and counts its proposals."""

    def __init__(self):
        self.proposed = 0

    def begin(self, prompt):
        pass

    def propose(self, context, k):
        from specdesk.engines.types import Draft

        self.proposed += 1
        return Draft((1,) * k)

    def accept(self, n_accepted, committed):
        pass


def test_a_method_unused_for_a_while_is_probed_again():
    losing = Counting()
    auto = AutoProposer({"draft": losing}, Costs((1.0, 1.05, 1.1), {"draft": 0.05}), 2)
    auto.begin([1, 2, 3])
    methods, reasons = [], []
    for _ in range(100):
        auto.propose([1, 2, 3], 2)
        methods.append(auto.choice.method)
        reasons.append(auto.choice.reason)
        auto.accept(0, [5])
    # The prior (0.6) makes it worth trying; once its drafts keep failing it stops, and from
    # then on drafts once after REPROBE_EVERY steps, then after twice as many, and so on.
    used = [i for i, method in enumerate(methods) if method == "draft"]
    assert used[0] == 0 and "none" in methods[:24]
    gaps = [b - a for a, b in zip(used, used[1:])]
    assert gaps[-3:] == [REPROBE_EVERY, REPROBE_EVERY * 2, REPROBE_EVERY * 4]
    assert losing.proposed == len(used)
    # the re-probes are counted for the details view (app/runtime/chat_controller.auto_details)
    reprobed = sum(1 for i in used if i > 0 and "re-probing" in reasons[i])
    assert auto.report()["reprobe_steps"] == reprobed > 0


def test_a_method_that_could_not_beat_the_rate_the_run_is_making_is_not_probed_again():
    """Lookups that find 4 tokens a step, all accepted, make 4.2x a plain pass's rate; a draft
    model that could make at most 1.1x even at the optimistic acceptance is never re-probed beside
    them, however long it goes unused."""
    lookup, model = Counting(), Counting()  # the lookup finds k tokens every step
    auto = AutoProposer({"ngram": lookup, "draft": model}, Costs((1.0, 1.05, 1.1, 1.15, 1.2),
                                                                 {"ngram": 0.0, "draft": 0.6}), 4)
    auto.begin([1, 2, 3])
    for _ in range(3 * REPROBE_EVERY):
        auto.propose([1, 2, 3], 4)
        auto.accept(4, [1, 1, 1, 1, 5])
    assert model.proposed == 0 and lookup.proposed == 3 * REPROBE_EVERY


def test_a_catch_up_is_shared_by_the_steps_of_the_stretch_it_opens():
    """A draft model 40 tokens behind pays a catch-up of 1.17 passes before it drafts. Where it
    has drafted one step at a time, that sinks the step (2.71 tokens in 2.97 passes); where, once
    caught up, it has drafted about eight steps in a row, each step pays an eighth of it."""
    from specdesk.engines.speculation.auto import Stretch

    stretch = Stretch()
    assert stretch.mean() == 1.0
    for _ in range(3):
        for _ in range(8):
            stretch.step(True)
        stretch.step(False)
    assert stretch.current == 0 and 6.0 < stretch.mean() < 8.0

    costs = Costs((1.0, 1.1, 1.2), {"draft": 0.3})
    prompt, grown = [1, 2, 3], list(range(43))

    def first_choice(learned: dict) -> str:
        learned["draft"] = estimate([0.9, 0.9])
        auto = AutoProposer({"draft": Counting()}, costs, 2, learned=learned)
        auto.begin(prompt)
        auto.propose(grown, 2)  # the lookups (or plain passes) committed 40 tokens meanwhile
        return auto.choice.method

    assert first_choice({}) == "none"
    assert first_choice({"draft:stretch": stretch}) == "draft"


def test_where_no_draft_can_pay_auto_drafts_nothing_and_says_why_in_a_line():
    """Passes priced as llama.cpp's Q4_1 kernels cost on a 2-core Zen 4 (SmolLM2-135M: a pass over
    2 tokens 2.1x one, over 5 tokens 4.0x): even at an acceptance few methods reach, no draft
    pays, so auto never drafts, not even to re-probe, and says why."""
    from specdesk.engines.speculation.chooser import cannot_pay, could_pay, economics

    q4_1 = Costs(tuple(t * 1e-3 for t in (5.4, 11.4, 14.6, 16.2, 21.5)), {"ngram": 1e-5, "draft": 1e-3})
    assert not could_pay(q4_1, "ngram", 4) and cannot_pay(q4_1, ["ngram", "draft"], 4) == (
        "checking 2 tokens costs 2.1x one here, so no draft can pay")
    assert economics(q4_1) == "a pass over 2 tokens costs 2.1x one here, over 3 tokens 2.7x, over 5 tokens 4.0x"
    members = {"ngram": Counting(), "draft": Counting()}
    auto = AutoProposer(members, q4_1, 4, learn_costs=False)
    auto.begin([1, 2, 3])
    for _ in range(200):
        assert auto.propose([1, 2, 3], 4).tokens == ()
        assert auto.choice.reason == "no speculation: checking 2 tokens costs 2.1x one here, so no draft can pay"
        auto.accept(0, [5])
    assert sum(m.proposed for m in members.values()) == 200  # the lookup looked each step, the draft model never
    assert auto.report()["verdict"] == "checking 2 tokens costs 2.1x one here, so no draft can pay"
    # The same model in F16 (2 tokens 1.9x, 5 tokens 2.2x one): a draft accepted often enough pays.
    f16 = Costs(tuple(t * 1e-3 for t in (7.0, 13.5, 14.1, 15.0, 15.7)), {"ngram": 1e-5})
    assert could_pay(f16, "ngram", 4) and cannot_pay(f16, ["ngram"], 4) is None


def test_auto_chooses_among_the_methods_this_target_can_run_now():
    from specdesk.engines.speculation.auto import auto_plan

    available = {"ngram": None, "ngram-pool": None, "draft": None, "mtp": "no MTP layers", "dflash": None}
    plan = auto_plan(SpecConfig("auto", k=3), available)
    assert plan.methods == ("ngram", "ngram-pool") and plan.observer is None and plan.draft_path is None  # no draft file
    plan = auto_plan(SpecConfig("auto", k=3, draft_path="d.gguf"), {**available, "mtp": None})
    assert plan.methods == ("ngram", "ngram-pool", "draft", "mtp") and plan.max_k == 3
    assert (plan.observer, plan.draft_path) == ("mtp", "d.gguf")
    # The request's own list and order (the order the cost cache keys them in).
    plan = auto_plan(SpecConfig("auto", k=2, draft_path="d.gguf", auto_methods=("mtp", "ngram")), available)
    assert plan.methods == ("ngram",) and plan.draft_path is None


def test_auto_methods_are_checked():
    with pytest.raises(SpecDeskError, match="auto cannot choose 'warp'"):
        SpecConfig(method="auto", auto_methods=("warp",))


# Costs as auto keeps them on disk: fixed here, so which methods a test run drafts with does not
# depend on how loaded the machine was when auto measured it.
TEST_METHODS = ("ngram", "ngram-pool", "draft")


def pin_costs(engine, folder, k: int, draft: str, methods=TEST_METHODS) -> None:
    engine.cost_cache_dir = folder
    if draft:  # where the draft sits is part of the key: load it first, as the run will
        engine.load_draft(draft)
    costs = Costs(tuple(1.0 + 0.15 * n for n in range(k + 1)), {"ngram": 0.001, "ngram-pool": 0.002, "draft": 0.08})
    (folder / f"costs-{cost_cache.cost_key(engine, list(methods), k, draft)}.json").write_text(json.dumps(costs.to_json()))
    cost_cache._models.clear()
    engine.cost_learning = False  # the pinned costs stay what the test chose


# --- engines -------------------------------------------------------------------------------
def run(engine, prompt, spec, max_tokens=48, sampling=SamplingParams()):
    request = GenerationRequest(tuple(prompt), max_tokens=max_tokens, sampling=sampling, spec=spec)
    tokens, methods = [], []
    for event in engine.generate(request, threading.Event()):
        tokens.extend(event.tokens)
        methods.append((event.method, event.reason, event.accepted))
    return tokens, methods


def assert_greedy_identical(engine, spec, prompts, max_tokens=48):
    used = set()
    accepted = 0
    for prompt in prompts:
        tokens = engine.tokenize(prompt)
        baseline, _ = run(engine, tokens, SpecConfig(), max_tokens)
        auto, steps = run(engine, tokens, spec, max_tokens)
        assert auto == baseline, f"auto diverged on {prompt[:40]!r}: {steps}"
        assert all(reason for _, reason, _ in steps)
        used |= {method for method, _, _ in steps}
        accepted += sum(a for _, _, a in steps)
    assert accepted > 0, f"no draft token accepted ({used}): the test proved nothing"
    return used


class Fixed:
    """A proposer that always drafts the same tokens (none: a lookup that finds nothing)."""

    def __init__(self, tokens=()):
        self.tokens, self.proposed, self.accepted = tuple(tokens), 0, []

    def begin(self, prompt):
        pass

    def propose(self, context, k):
        from specdesk.engines.types import Draft

        self.proposed += 1
        return Draft(self.tokens[:k])

    def accept(self, n_accepted, committed):
        self.accepted.append(n_accepted)


def test_the_lookups_look_first_and_one_that_finds_nothing_is_not_chosen():
    costs = Costs((1.0, 1.1, 1.2, 1.3), {"ngram": 0.0, "draft": 0.2})
    lookup, model = Fixed(), Fixed((7, 7, 7))
    auto = AutoProposer({"ngram": lookup, "draft": model}, costs, 3)
    auto.begin([1, 2, 3])
    draft = auto.propose([1, 2, 3], 3)
    assert lookup.proposed == 1 and model.proposed == 1
    assert auto.choice.method == "draft" and auto.choice.fallback is None
    assert draft.tokens == (7,) * auto.choice.k
    auto.accept(1, [7, 9])
    assert model.accepted == [1] and lookup.accepted == [0]  # it learns the step's tokens all the same
    assert auto.estimates["draft"].drafted == auto.choice.k
    assert auto.estimates["ngram"].tries == 0  # looking and finding nothing says nothing of its acceptance
    # Without the look, the chooser values the lookup with its fallback on the steps it misses.
    assert choose(costs, auto.estimates, 3).fallback == ("draft", choose(costs, {"draft": auto.estimates["draft"]}, 3).k)


def test_a_lookup_that_found_a_draft_is_valued_at_no_drafting_cost_up_to_its_length():
    costs = Costs((1.0, 1.1, 1.2, 1.3), {"ngram": 0.5, "draft": 0.2})  # a lookup dear to run, already run
    estimates = {"ngram": AcceptanceEstimate(3), "draft": AcceptanceEstimate(3)}
    assert choose(costs, estimates, 3).method == "draft"
    found = choose(costs, estimates, 3, found={"ngram": 2})
    assert (found.method, found.k, found.fallback) == ("ngram", 2, None)
    assert choose(costs, estimates, 3, found={"ngram": 0}).method == "draft"
    # Through the proposer: the lookup looks once, at the step's k, and drafts the chosen prefix.
    lookup, model = Fixed((5, 6)), Fixed((7, 7, 7))
    auto = AutoProposer({"ngram": lookup, "draft": model}, costs, 3)
    auto.begin([1, 2, 3])
    draft = auto.propose([1, 2, 3], 3)
    assert (auto.choice.method, draft.tokens) == ("ngram", (5, 6)[:auto.choice.k])
    assert lookup.proposed == 1 and model.proposed == 0
    auto.accept(len(draft.tokens), [*draft.tokens, 8])
    assert auto.estimates["ngram"].drafted == len(draft.tokens) and model.accepted == []


def test_a_lookup_not_chosen_learns_what_its_draft_would_have_had_accepted():
    """Both lookups look every step; the draft of the one not chosen is scored against the
    tokens the text goes on with (a draft token is accepted exactly when the target commits it
    there), so each lookup's acceptance is measured on all the text where it found a draft, not
    only where the other found nothing."""
    costs = Costs((1.0, 1.05, 1.1, 1.15), {"ngram": 0.0, "ngram-pool": 0.0})
    chosen, other = Fixed((5, 6, 7)), Fixed((5, 9, 9))
    auto = AutoProposer({"ngram": other, "ngram-pool": chosen}, costs, 3)
    auto.estimates["ngram-pool"].record(3, 3, 3)  # the pool has shown more: it is chosen
    auto.begin([1, 2, 3])
    draft = auto.propose([1, 2, 3], 3)
    assert auto.choice.method == "ngram-pool" and draft.tokens == (5, 6, 7)
    auto.accept(3, [5, 6, 7, 8])
    # ngram's (5, 9, 9): its first token committed, its second not: 2 positions reached, 1 accepted
    assert list(auto.estimates["ngram"].reached) == pytest.approx([1, 1, 0])
    assert list(auto.estimates["ngram"].accepted) == pytest.approx([1, 0, 0])
    assert other.accepted == [0]  # and it learned the step's tokens as before
    # A draft longer than what its step committed is scored as the next steps commit the rest.
    other.tokens, chosen.tokens = (1, 2, 3), (1, 4, 4)
    context = [1, 2, 3, 5, 6, 7, 8]
    auto.propose(context, 3)
    assert auto.choice.method == "ngram-pool"
    auto.accept(1, [1, 2])  # ngram's 1, 2 right so far; its 3 not yet committed
    assert list(auto.estimates["ngram"].reached) == pytest.approx([1, 1, 0])
    other.tokens = chosen.tokens = ()
    auto.propose(context + [1, 2], 3)
    auto.accept(0, [3])
    assert list(auto.estimates["ngram"].reached) == pytest.approx([1.97, 1.97, 1])
    assert list(auto.estimates["ngram"].accepted) == pytest.approx([1.97, 1, 1])
    # A reply that ends first: what was committed of the draft counts, and nothing beyond.
    other.tokens, chosen.tokens = (9, 9, 9), (1, 4, 4)
    auto.propose(context + [1, 2, 3], 3)
    auto.accept(0, [9])
    auto.begin([1, 2, 3])
    assert list(auto.estimates["ngram"].reached) == pytest.approx([0.97 * 1.97 + 1, 0.97 * 1.97, 0.97])
    assert list(auto.estimates["ngram"].accepted) == pytest.approx([0.97 * 1.97 + 1, 0.97, 0.97])


def test_plain_steps_teach_a_lookup_that_has_not_shown_enough_to_draft():
    """Where a rejected draft costs much (a pass over 4 tokens costs 2.3 over one: a quantized
    model on a CPU), a lookup drafts only once it has surely shown it is right, and at the
    prior's acceptance no draft pays; its drafts on the plain steps before, scored against the
    text those steps committed, are what show it."""
    steep = Costs((1.0, 1.6, 2.0, 2.3, 2.6), {"ngram-pool": 0.0})
    text = [1, 2, 3, 4] * 40
    lookup = Fixed()
    auto = AutoProposer({"ngram-pool": lookup}, steep, 4)
    auto.begin(text[:8])
    context, methods = text[:8], []
    for _ in range(30):
        lookup.tokens = tuple(text[len(context):len(context) + 4])  # right every time
        draft = auto.propose(context, 4)
        methods.append(auto.choice.method)
        accepted = len(draft.tokens)
        committed = text[len(context):len(context) + accepted + 1]
        auto.accept(accepted, committed)
        context = context + committed
    assert methods[0] == "none" and "ngram-pool" in methods, methods
    first = methods.index("ngram-pool")
    assert methods[first:] == ["ngram-pool"] * (len(methods) - first), methods


def test_where_a_rejected_draft_costs_a_whole_pass_only_a_lookup_right_step_after_step_drafts():
    """SmolLM2's Q4_1 costs on a CPU: a pass over 4 tokens costs 3.37 passes over one, so a
    k = 3 draft pays only if its tokens are nearly always right (4 tokens in 3.37 passes: 1.19x),
    and a rejected one costs 2.4 passes more. A lookup whose mean acceptance says 1.08x after 8
    right steps has not shown it surely: no speculation; after 12 it drafts. A k = 2 draft
    (3 tokens in 2.86 passes) would gain less than the costs' noise however often it was right.
    On flat costs a fresh lookup drafts at once."""
    steep = Costs((1.0, 2.1, 2.86, 3.37, 4.24), {"ngram-pool": 0.0})
    estimate = AcceptanceEstimate(4)
    for _ in range(8):
        estimate.record(4, 4, 4)
    assert expected_speedup(steep, "ngram-pool", estimate.per_position(), 1.0, 3) > 1.05
    choice = choose(steep, {"ngram-pool": estimate}, 4, found={"ngram-pool": 4})
    assert choice.method == "none" and "not yet surely shown" in choice.reason, choice.reason
    for _ in range(4):
        estimate.record(4, 4, 4)
    assert choose(steep, {"ngram-pool": estimate}, 4, found={"ngram-pool": 4}).method == "ngram-pool"
    for _ in range(60):
        estimate.record(4, 4, 4)
    assert choose(steep, {"ngram-pool": estimate}, 4, found={"ngram-pool": 2}).method == "none"
    flat = Costs((1.0, 1.1, 1.2, 1.3, 1.4), {"ngram-pool": 0.0})
    assert choose(flat, {"ngram-pool": AcceptanceEstimate(4)}, 4, found={"ngram-pool": 3}).method == "ngram-pool"


def test_acceptance_learned_in_one_reply_starts_the_next():
    costs = Costs((1.0, 1.1, 1.2), {"draft": 0.05})
    learned: dict = {}
    first = AutoProposer({"draft": Fixed((5, 5))}, costs, 2, learned=learned)
    first.begin([1])
    for _ in range(20):
        first.propose([1], 2)
        first.accept(0, [4])
    second = AutoProposer({"draft": Fixed((5, 5))}, costs, 2, learned=learned)
    assert second.estimates["draft"] is first.estimates["draft"]
    # (drafting stops as soon as the acceptance it has surely shown no longer pays: few steps recorded)
    assert second.estimates["draft"].per_position()[0] < 0.35  # the prior was 0.6
    assert AutoProposer({"draft": Fixed()}, costs, 2).estimates["draft"].per_position()[0] == pytest.approx(0.6)


def test_llama_greedy_auto_equals_baseline(demo_family, tmp_path):
    from specdesk.engines.llama.engine import LlamaEngine

    engine = LlamaEngine(demo_family["target_gguf"], n_ctx=256, n_threads=2)
    pin_costs(engine, tmp_path, 4, demo_family["draft_gguf"])
    try:
        spec = SpecConfig("auto", k=4, draft_path=demo_family["draft_gguf"], auto_methods=TEST_METHODS)
        used = assert_greedy_identical(engine, spec, PROMPTS[:3], 32)
        assert len(used - {"none"}) >= 1
    finally:
        engine.close()


def test_llama_greedy_auto_on_mtp_alone_equals_baseline(demo_family, demo_cache_dir, tmp_path, monkeypatch):
    """Limited to MTP and no speculation, auto keeps the MTP drafter fed on steps it does not
    draft, so the drafts it makes after a pause are right. The costs are those of a machine
    where MTP pays only when most of its drafts are accepted (a cost file as auto keeps them),
    and it is never let go, so runs mix plain steps and MTP steps after them."""
    import json

    from specdesk.app.demo.export_native_gguf import build_native
    from specdesk.engines.llama.engine import LlamaEngine
    from specdesk.engines.speculation import auto

    native = build_native(demo_family, demo_cache_dir / "native")
    engine = LlamaEngine(native["mtp_gguf"], n_ctx=256, n_threads=2)
    engine.cost_cache_dir = tmp_path
    costs = Costs((1.0, 1.7, 2.4, 3.1), {"mtp": 0.05}, {"mtp": 0.0})
    monkeypatch.setattr(auto, "RETIRE_AFTER", 10**6)  # kept fed through its pauses, re-probed after them
    (tmp_path / f"costs-{cost_cache.cost_key(engine, ['mtp'], 3, None)}.json").write_text(json.dumps(costs.to_json()))
    cost_cache._models.clear()
    engine.cost_learning = False  # the pinned costs stay what the test chose
    try:
        used = assert_greedy_identical(engine, SpecConfig("auto", k=3, auto_methods=("mtp",)), PROMPTS[:3], 64)
        assert {"mtp", "none"} <= used
    finally:
        cost_cache._models.clear()
        engine.close()


def test_the_cost_probe_is_a_job_of_its_own_before_the_run(demo_family, demo_cache_dir, tmp_path):
    """`prepare` measures auto's costs (here with a hidden-state drafter, timed over verified
    steps of its own) without running the engine's loop; the factory only reads what it left."""
    from specdesk.app.demo.export_native_gguf import build_native
    from specdesk.engines.llama.engine import LlamaEngine
    from specdesk.engines.speculation.proposers import make_proposer, prepare

    native = build_native(demo_family, demo_cache_dir / "native")
    engine = LlamaEngine(native["mtp_gguf"], n_ctx=256, n_threads=2)
    engine.cost_cache_dir = tmp_path
    spec = SpecConfig("auto", k=3, auto_methods=("ngram", "mtp"))
    cost_cache._models.clear()
    try:
        with pytest.raises(SpecDeskError, match="method auto has no costs for these models yet"):
            make_proposer(engine, spec, SamplingParams(), np.random.default_rng(0))
        prepare(engine, spec)
        assert engine.last_proposer is None  # no run went through the loop
        costs = cost_cache.measured(engine, ["ngram", "mtp"], 3, None).costs()
        assert len(costs.pass_s) == 4 and costs.draft_token_s["mtp"] > 0 and costs.observe_s["mtp"] >= 0
        assert set(costs.draft_token_s) == {"ngram", "mtp"} and len(list(tmp_path.glob("costs-*.json"))) == 1
        tokens = engine.tokenize(PROMPTS[0])
        baseline, _ = run(engine, tokens, SpecConfig(), 24)
        auto, steps = run(engine, tokens, spec, 24)
        assert auto == baseline, steps
        assert engine.last_proposer.report()["costs"]["observe_ms"].keys() == {"mtp"}
    finally:
        cost_cache._models.clear()
        engine.close()


def test_a_hidden_state_drafter_that_cannot_pay_for_its_catch_up_is_not_fed():
    from specdesk.engines.speculation.chooser import worth_feeding

    assert worth_feeding(Costs((1.0, 1.1, 1.2), {"mtp": 0.05}, {"mtp": 0.1}), "mtp", 2)
    # with a catch-up of 0.8 passes, 80% acceptance gives at best 2.44 tokens per 2.6 passes (k = 2)
    assert not worth_feeding(Costs((1.0, 1.1, 1.2), {"mtp": 0.3}, {"mtp": 0.8}), "mtp", 2)
    assert worth_feeding(Costs((1.0, 1.1, 1.2), {"mtp": 0.3}, {"mtp": 0.5}), "mtp", 2)  # 2.44 / 2.3


def test_torch_greedy_auto_equals_baseline(demo_family, tmp_path):
    pytest.importorskip("torch")
    from specdesk.engines.torch.engine import TorchEngine

    engine = TorchEngine(demo_family["target_hf"], n_ctx=256, device="cpu", dtype="float32", n_threads=1)
    pin_costs(engine, tmp_path, 4, demo_family["draft_hf"])
    try:
        spec = SpecConfig("auto", k=4, draft_path=demo_family["draft_hf"], auto_methods=TEST_METHODS)
        used = assert_greedy_identical(engine, spec, PROMPTS[:3], 32)
        assert len(used - {"none"}) >= 1
    finally:
        engine.close()


def test_llama_sampled_auto_matches_plain_sampling(demo_family, tmp_path):
    """The distribution test of the other methods (tests/test_llama_engine.py), on auto over
    the n-gram methods and the draft model.
    Property of the shipped small family relied on: on the repetitive prompt auto's methods get at least
    50 draft tokens accepted over the runs."""
    from specdesk.engines.llama.engine import LlamaEngine
    from sampling_stats import assert_follows_plain_sampling, gguf_exact
    from test_llama_engine import REPETITIVE

    engine = LlamaEngine(demo_family["target_gguf"], n_ctx=256, n_threads=1)
    pin_costs(engine, tmp_path, 4, demo_family["draft_gguf"])
    try:
        sampling = SamplingParams(temperature=0.8, top_p=0.95)
        prompt = engine.tokenize(REPETITIVE)
        spec = SpecConfig("auto", k=4, draft_path=demo_family["draft_gguf"], auto_methods=TEST_METHODS)
        exact = gguf_exact(demo_family["target_gguf"], prompt, sampling)
        # fewer runs than the per-method tests, which test the methods auto runs
        assert_follows_plain_sampling(engine, exact, prompt, spec, sampling, runs=1500, label="auto")
    finally:
        engine.close()


def test_costs_are_kept_per_target_and_threads(demo_family, tmp_path):
    import json

    from specdesk.engines.llama.engine import LlamaEngine
    from specdesk.engines.speculation.ngram import NgramProposer

    engine = LlamaEngine(demo_family["target_gguf"], n_ctx=256, n_threads=1)
    engine.cost_cache_dir = tmp_path
    try:
        cost_cache._models.clear()
        proposers = {"ngram": NgramProposer()}
        measured = cost_cache.load_or_measure(engine, proposers, 2, None).costs()
        assert len(measured.pass_s) == 3 and all(s > 0 for s in measured.pass_s)
        [stored] = tmp_path.glob("costs-*.json")
        # A later process reads the file instead of measuring.
        stored.write_text(json.dumps({"pass_s": [1.0, 2.0, 3.0], "draft_token_s": {"ngram": 0.5}}))
        cost_cache._models.clear()
        assert cost_cache.load_or_measure(engine, proposers, 2, None).costs() == Costs((1.0, 2.0, 3.0), {"ngram": 0.5})
        # A damaged file is measured again; other threads are another machine state.
        stored.write_text("{not json")
        cost_cache._models.clear()
        assert cost_cache.load_or_measure(engine, proposers, 2, None).costs().pass_s[0] != 1.0
        engine.set_threads(2)
        cost_cache.load_or_measure(engine, proposers, 2, None)
        assert len(list(tmp_path.glob("costs-*.json"))) == 2
    finally:
        cost_cache._models.clear()
        engine.close()


def test_a_losing_hidden_state_drafter_is_let_go():
    """MTP costs a catch-up on every pass even when it does not draft: when it has not been
    chosen on its merits for RETIRE_AFTER steps, auto stops feeding it for the rest of the run."""
    from specdesk.engines.speculation.auto import RETIRE_AFTER
    from specdesk.engines.types import Draft

    from specdesk.engines.speculation.protocols import ChoosingProposer, Proposer, target_observer

    class Fed:
        taps = ()

        def __init__(self):
            self.fed = 0

        def observe(self, output, tokens, start):
            pass

        def stats(self):
            return {}

        def begin(self, prompt):
            pass

        def propose(self, context, k):
            return Draft((1,) * k)

        def accept(self, n_accepted, committed):
            self.fed += 1

    mtp = Fed()
    auto = AutoProposer({"mtp": mtp}, Costs((1.0, 1.9, 2.8), {"mtp": 0.5}), 2, observer="mtp")
    assert isinstance(auto, Proposer) and isinstance(auto, ChoosingProposer)
    assert target_observer(auto) is mtp and target_observer(mtp) is mtp  # what the engines feed
    auto.begin([1, 2, 3])
    for _ in range(RETIRE_AFTER + 10):
        auto.propose([1, 2, 3], 2)
        auto.accept(0, [5])
    assert auto.observer is None and "mtp" not in auto.proposers and target_observer(auto) is None
    assert mtp.fed == RETIRE_AFTER and auto.choice.method == "none"


def test_torch_sampled_auto_matches_plain_sampling(demo_family, tmp_path):
    """Property of the shipped small family relied on: on the repetitive prompt auto's methods get at least
    50 draft tokens accepted over the runs."""
    pytest.importorskip("torch")
    from specdesk.engines.torch.engine import TorchEngine
    from sampling_stats import assert_follows_plain_sampling
    from test_llama_engine import REPETITIVE
    from test_torch_engine import torch_exact

    engine = TorchEngine(demo_family["target_hf"], n_ctx=256, device="cpu", dtype="float32", n_threads=1)
    pin_costs(engine, tmp_path, 4, demo_family["draft_hf"])
    try:
        sampling = SamplingParams(temperature=0.8, top_p=0.95)
        prompt = engine.tokenize(REPETITIVE)
        spec = SpecConfig("auto", k=4, draft_path=demo_family["draft_hf"], auto_methods=TEST_METHODS)
        exact = torch_exact(demo_family["target_hf"], prompt, sampling)
        assert_follows_plain_sampling(engine, exact, prompt, spec, sampling, runs=600, label="auto")
    finally:
        engine.close()


# --- costs learned from the passes auto runs ----------------------------------------------------
def test_learned_costs_follow_the_passes_and_keep_the_probes_shape():
    from specdesk.engines.speculation.costs import CostModel

    probe = Costs((1.0, 1.2, 1.4, 1.6, 1.8), {"draft": 0.1})
    model = CostModel(probe)
    assert model.costs() == probe
    for _ in range(3):  # the machine got twice as slow: sizes 1 and 5 measured, 2-4 follow the probe's shape
        model.record_pass(1, 2.0)
        model.record_pass(5, 3.6)
    assert model.costs().pass_s == pytest.approx((2.0, 2.4, 2.8, 3.2, 3.6))
    assert model.learned_sizes() == [1, 5]
    model.record_pass(1, 50.0)  # one slow pass (a scheduling hiccup) moves nothing
    assert model.costs().pass_s[0] == 2.0
    for _ in range(3):  # one draft length: the probe's cost per token, the rest a cost per step
        model.record_drafting("draft", 4, 1.2)
    assert model.costs().draft_token_s == {"draft": 0.1}
    assert model.costs().draft_step_s["draft"] == pytest.approx(0.8)
    for drafted, seconds in ((2, 0.7), (2, 0.7), (4, 1.1)):  # two lengths: a line through them
        model.record_drafting("draft", drafted, seconds)
    costs = model.costs()
    assert costs.drafting_cost("draft", 2) == pytest.approx(costs.draft_step_s["draft"] + 2 * costs.draft_token_s["draft"])
    assert 0.1 < costs.draft_token_s["draft"] < 0.3 and costs.draft_step_s["draft"] > 0.2
    for _ in range(16):  # a longer pass measured cheaper than a shorter one: noise; never cheaper
        model.record_pass(2, 5.0)
    assert model.costs().pass_s[0] <= model.costs().pass_s[1] <= model.costs().pass_s[2]


def test_a_size_priced_in_a_busy_moment_is_priced_again_once_it_has_not_run_for_a_while():
    """Passes over 4 and 5 tokens measured while the machine was busy priced them at 10x: auto
    shuns those sizes, so no pass of theirs would ever correct it. Once they have not run for
    STALE_AFTER passes they follow the probe's shape again (scaled by the sizes run lately),
    and when one runs again it starts a window of its own."""
    from specdesk.engines.speculation.costs import MIN_SAMPLES, STALE_AFTER, CostModel

    probe = Costs((1.0, 1.1, 1.2, 1.3, 1.4), {"ngram": 0.0})
    model = CostModel(probe)
    for _ in range(MIN_SAMPLES):
        model.record_pass(4, 13.0)
        model.record_pass(5, 14.0)
    assert model.costs().pass_s[3:] == pytest.approx((13.0, 14.0))
    for i in range(STALE_AFTER - 1):  # the machine is quiet again: the short passes at the probe's level
        model.record_pass(1 + i % 3, probe.pass_s[i % 3])
    assert model.costs().pass_s[4] == pytest.approx(14.0)  # not run for a while yet
    model.record_pass(1, 1.0)
    assert model.learned_sizes() == [1, 2, 3]
    assert model.costs().pass_s == pytest.approx(probe.pass_s)
    model.record_pass(5, 1.5)  # runs again: the busy passes are gone from its window
    assert list(model.passes[4]) == [1.5] and model.costs().pass_s[4] == pytest.approx(1.4)


def test_learned_costs_are_saved_every_so_many_passes(monkeypatch):
    saved = []
    monkeypatch.setattr(cost_cache, "SAVE_EVERY", 4)
    model = cost_cache.CostModel(Costs((1.0, 2.0), {}), on_update=saved.append)
    for _ in range(8):
        model.record_pass(2, 1.5)
    assert len(saved) == 2 and saved[-1].pass_s == (0.75, 1.5)  # size 1 scaled as size 2 moved


def test_a_probe_the_passes_drifted_far_from_is_taken_again_before_the_next_reply(monkeypatch):
    """A probe taken in a busy moment priced every size and the drafting for that moment;
    replies then measure only the sizes they run. Once the passes they measured moved more
    than DRIFT from it, the next reply's preparation takes the probe again, keeping what the
    passes measured; a probe they agree with is kept."""
    class Target:
        path = "target.gguf"

    class Engine:
        name, target, n_threads = "fake", Target(), 2

    busy = Costs((0.020, 0.030, 0.150, 0.150), {"draft": 0.100})
    quiet = Costs((0.010, 0.015, 0.017, 0.018), {"draft": 0.001})
    probes = [busy, quiet]
    monkeypatch.setattr(cost_cache, "measure_costs", lambda *args, **kwargs: probes.pop(0))
    monkeypatch.setattr(cost_cache, "_models", {})
    engine, members = Engine(), {"draft": object()}
    model = cost_cache.load_or_measure(engine, members, 3, None)
    assert model.costs() == busy and not model.drifted()
    for _ in range(cost_cache.REPROBE_AFTER // 2 - 1):  # quiet now: plain and 2-token passes at half the probe's
        model.record_pass(1, 0.010)
        model.record_pass(2, 0.015)
    assert model.costs().pass_s[2] == pytest.approx(0.075) and not model.drifted()  # too few passes yet
    model.record_pass(1, 0.010)
    model.record_pass(2, 0.015)
    assert model.drifted()
    assert cost_cache.load_or_measure(engine, members, 3, None) is model and model.probes == 2
    assert model.costs().pass_s == pytest.approx(quiet.pass_s) and model.costs().draft_token_s == {"draft": 0.001}
    assert model.learned_sizes() == [1, 2] and not model.drifted()
    for _ in range(cost_cache.REPROBE_AFTER):  # within DRIFT of the new probe: kept
        model.record_pass(1, 0.012)
    assert not model.drifted() and cost_cache.load_or_measure(engine, members, 3, None).probes == 2


def test_a_machine_that_got_busy_makes_auto_draft_longer():
    """Under load a long pass costs little more than a short one (scheduling dominates), so
    drafts that did not pay on the probe's costs pay now: auto follows what its passes measure."""
    probe = Costs((1.0, 1.8, 2.6, 3.4, 4.2), {"draft": 0.05})
    proposer = AutoProposer({"draft": Fixed((5, 5, 5, 5))}, probe, 4)
    proposer.estimates["draft"] = estimate([0.5] * 4)
    assert proposer.decide(4).method == "none"
    for n, seconds in ((1, 3.0), (5, 3.3)):
        for _ in range(3):
            proposer.record_timing(n, seconds, 0.0, 0.0)
    choice = proposer.decide(4)
    assert choice.method == "draft" and choice.k >= 3, choice


def test_a_plain_pass_is_measured_before_auto_relies_on_it():
    """Every speedup is counted against a plain pass. Priced only from drafted passes (which
    carry a fed drafter's catch-up) it drifts and, never run, is never corrected: auto runs one
    every REPROBE_EVERY steps until three are measured, then only drafts."""
    probe = Costs((1.0, 1.05, 1.1, 1.15, 1.2), {"draft": 0.0})
    auto = AutoProposer({"draft": Fixed((5, 5, 5, 5))}, probe, 4)
    auto.estimates["draft"] = estimate([0.9] * 4)
    auto.begin([1, 2, 3])
    plain = []
    for step in range(1, 60):
        draft = auto.propose([1, 2, 3], 4)
        if not draft.tokens:
            plain.append(step)
        auto.record_timing(1 + len(draft.tokens), 2.0 if draft.tokens else 1.0, 0.0, 0.0)
        auto.accept(len(draft.tokens), [5] * (1 + len(draft.tokens)))
    assert plain[:3] == [REPROBE_EVERY, 2 * REPROBE_EVERY, 3 * REPROBE_EVERY], plain
    assert len(plain) == 3 and 1 in auto.cost_model.learned_sizes()
    assert auto.choice.reason.startswith("draft")


def test_a_draft_model_behind_the_text_pays_its_catch_up_before_it_is_chosen():
    """Coming back to the draft model after lookups drafted costs it a batch over the tokens it
    has not seen; the chooser counts that, so a small edge does not make auto switch back and forth."""
    costs = Costs((10e-3, 12e-3, 14e-3, 16e-3, 18e-3), {"draft": 1e-3, "ngram": 0.0})
    assert costs.catch_up_cost("draft", 1) == 0.0 and costs.catch_up_cost("ngram", 40) == 0.0
    assert costs.catch_up_cost("draft", 3) == pytest.approx(1e-3 * (14 / 10 - 1))
    assert costs.catch_up_cost("draft", 9) == pytest.approx(1e-3 * ((18 + 4 * 2) / 10 - 1))
    estimates = {"ngram": estimate([0.5] * 4), "draft": estimate([0.8] * 4)}
    assert choose(costs, estimates, 4).method == "draft"
    assert choose(costs, estimates, 4, method_s={"draft": costs.catch_up_cost("draft", 40)}).method == "ngram"

    auto = AutoProposer({"ngram": Fixed((5, 5, 5, 5)), "draft": Fixed((5, 5, 5, 5))}, costs, 4)
    auto.begin(list(range(10)))
    assert auto.catch_up_s() == {"draft": 0.0}
    auto._seen["draft"] = 10
    auto._context_len = 50
    assert auto.catch_up_s()["draft"] == pytest.approx(costs.catch_up_cost("draft", 40))


def test_auto_reports_its_choices_and_costs_on_a_real_run(demo_family, tmp_path):
    from specdesk.engines.llama.engine import LlamaEngine

    engine = LlamaEngine(demo_family["target_gguf"], n_ctx=256, n_threads=1)
    engine.cost_cache_dir = tmp_path
    cost_cache._models.clear()
    try:
        tokens = engine.tokenize(PROMPTS[0])
        run(engine, tokens, SpecConfig("auto", k=4, draft_path=demo_family["draft_gguf"]), 32)
        report = engine.last_proposer.report()
        assert report["steps"] > 0 and sum(report["steps_by_choice"].values()) == pytest.approx(1.0, abs=0.01)
        # every step's pass was recorded, and the last, one-token pass (the report's passes_recorded
        # is what the windows hold, at most 16 a size, so it says less once a size ran 16 times)
        assert engine.last_proposer.cost_model.passes_seen >= report["steps"]
        assert len(report["costs"]["pass_ms"]) == 5
    finally:
        cost_cache._models.clear()
        engine.close()


def test_compare_json_and_the_compare_tab_say_what_auto_chose(demo_family, tmp_path):
    from specdesk.app.runtime.compare import compare
    from specdesk.engines.llama.engine import LlamaEngine
    from specdesk.ui.compare_view import auto_rows

    engine = LlamaEngine(demo_family["target_gguf"], n_ctx=256, n_threads=1)
    engine.cost_cache_dir = tmp_path
    cost_cache._models.clear()
    try:
        spec = SpecConfig("auto", k=4, draft_path=demo_family["draft_gguf"])
        report = compare(engine, PROMPTS[:2], spec, SamplingParams(), 24, engine.tokenize, warm=False).to_json()
    finally:
        cost_cache._models.clear()
        engine.close()
    summary = report["auto"]
    assert summary["steps"] > 0 and sum(summary["steps_by_choice"].values()) == pytest.approx(1.0, abs=0.01)
    assert len(summary["costs"]["pass_ms"]) == 5 and summary["costs"]["passes_recorded"] > 0
    rows = dict(auto_rows(summary))
    assert "pass over 1 token" in rows and rows["pass over 5 tokens"].endswith(")")
    assert all(text.endswith("of steps") for label, text in rows.items() if label in summary["steps_by_choice"])


def test_the_servers_specdesk_field_carries_autos_report():
    from specdesk.engines.speculation.stats import StatsAccumulator
    from specdesk.app.serving.protocol import speculation_summary

    report = {"steps": 3, "steps_by_choice": {"draft k=4": 1.0}, "costs": {"pass_ms": [1.0, 1.2]}}
    summary = speculation_summary(StatsAccumulator(4).finish(), 3, SpecConfig("auto", k=4), report)
    assert summary["auto"] == report and summary["method"] == "auto"
    assert "auto" not in speculation_summary(StatsAccumulator(4).finish(), 3, SpecConfig("ngram", k=4))


class BusyClock:
    """perf_counter for the cost probe, plus whatever busy moments the wrapped passes add."""

    def __init__(self):
        import time

        self.real, self.added = time.perf_counter, 0.0

    def perf_counter(self) -> float:
        return self.real() + self.added


def _busy_passes(engine, clock: BusyClock, size: int, calls: int, seconds: float):
    """Passes over `size` tokens take `seconds` longer for their first `calls` times: a busy moment."""
    real, seen = engine.target_pass, {"n": 0}

    def target_pass(tokens, observer):
        if len(tokens) == size and seen["n"] < calls:
            seen["n"] += 1
            clock.added += seconds
        return real(tokens, observer)

    engine.target_pass = target_pass


@pytest.mark.parametrize("calls, repaired", [(2, "measured again"), (10**6, "priced at n passes")])
def test_a_probe_that_caught_a_busy_moment_is_taken_again_or_priced_at_n_passes(demo_family, monkeypatch,
                                                                               calls, repaired):
    """A pass over 4 tokens measured at far more than 4 passes over one (68x was seen on a busy
    machine) is the machine's load, not its arithmetic: the probe measures again, and when every
    round caught it, prices the size at 4 passes over one, so auto drafts nothing there."""
    from specdesk.engines.llama.engine import LlamaEngine
    from specdesk.engines.speculation.chooser import implausible_size

    clock = BusyClock()
    monkeypatch.setattr(cost_cache, "time", clock)
    engine = LlamaEngine(demo_family["target_gguf"], n_ctx=256, n_threads=1)
    try:
        _busy_passes(engine, clock, size=4, calls=calls, seconds=5.0)
        measured = cost_cache.measure_costs(engine, {}, 3)
    finally:
        engine.close()
    assert implausible_size(measured.pass_s) is None and max(measured.pass_s) < 5.0
    if repaired == "measured again":
        assert measured.pass_s[3] < 4 * measured.pass_s[0]
    else:
        assert measured.pass_s[3] == pytest.approx(4 * measured.pass_s[0])
    assert implausible_size([0.005, 0.3425]) == 2 and implausible_size([0.005, 0.0105, 0.0146]) is None


def test_a_recorded_busy_probe_is_never_quoted_as_this_machines_costs(tmp_path):
    from specdesk.app.runtime import measurements

    log, target = tmp_path / "measurements.jsonl", str(tmp_path / "m.gguf")
    measurements.record_pass_costs(target, "llama.cpp", {"pass_ms": [5.4, 11.4, 14.6]}, log)
    measurements.record_pass_costs(target, "llama.cpp", {"pass_ms": [5.4, 370.0, 380.0]}, log)  # 68.5x: refused
    assert measurements.pass_costs_for(target, records=measurements.read(log, pass_costs=True)) == [5.4, 11.4, 14.6]


class Confident(Counting):
    """A model drafter's knobs: drafts k tokens, with the draft_p_min auto sets on it."""

    def __init__(self, p_min: float = 0.0):
        super().__init__()
        self.p_min = p_min


def test_auto_cuts_unlikely_draft_tails_by_what_a_row_costs_to_verify_here():
    """Where a pass over one more token costs nearly one more pass (Q4_1 on a CPU without a
    batched kernel), a draft row must be likely to pay; where passes are flat, a long tail is
    cheap; and the draft_p_min a run asked for is never lowered."""
    from specdesk.engines.speculation.chooser import MAX_TAIL_P_MIN, tail_p_min

    flat = Costs((0.010, 0.0102, 0.0104, 0.0106, 0.0108), {"draft": 1e-4})
    steep = Costs((0.010, 0.0115, 0.013, 0.0145, 0.016), {"draft": 1e-4})
    assert tail_p_min(flat, "draft", 4, 2.0) == pytest.approx((0.0002 + 1e-4) * 2.0 / 0.010)
    assert tail_p_min(steep, "draft", 4, 1.3) == pytest.approx((0.0015 + 1e-4) * 1.3 / 0.010)
    assert tail_p_min(steep, "draft", 4, 9.0) == MAX_TAIL_P_MIN and tail_p_min(steep, "draft", 1, 1.3) == 0.0
    for costs, asked in ((flat, 0.0), (steep, 0.0), (flat, 0.5)):
        drafter = Confident(asked)
        auto = AutoProposer({"draft": drafter}, costs, 4, learn_costs=False)
        auto.begin([1, 2, 3])
        auto.propose([1, 2, 3], 4)
        assert auto.choice.method == "draft"
        expected = max(asked, tail_p_min(costs, "draft", auto.choice.k, auto.choice.expected_speedup))
        assert drafter.p_min == pytest.approx(expected) and auto.report()["draft_p_min"]["draft"] == round(expected, 3)
        assert auto.choice.k >= 2 and drafter.p_min > 0.0  # a tail was priced, not left uncut
    assert Confident().p_min == 0.0


class Unsure(Counting):
    """A model drafter whose rows after the first carry these confidences in turn, and stop at
    the first below its draft_p_min (as drafting.ModelDraftProposer does); it reports them."""

    def __init__(self, confidences=(0.6, 0.25)):
        super().__init__()
        self.p_min = 0.0
        self.confidences = confidences
        self.row_confidence = None

    def propose(self, context, k):
        from specdesk.engines.types import Draft

        self.proposed += 1
        rows = [self.confidences[i % len(self.confidences)] for i in range(k - 1)]
        kept = next((i for i, c in enumerate(rows) if c < self.p_min), len(rows))
        self.row_confidence = rows[:kept]
        return Draft((1,) * (1 + kept))


def test_tail_calibration_fits_the_rows_the_target_reached():
    from specdesk.engines.speculation.chooser import TailCalibration

    calibration = TailCalibration()
    assert calibration.shift() == 0.0 and calibration.confidence_for(0.4) == pytest.approx(0.4)  # at its word
    calibration.record([0.5, 0.5, 0.5], 2)  # rows 1, 2 reached (row 1 accepted, row 2 rejected); row 3 not
    assert len(calibration.rows) == 2 and calibration.shift() == pytest.approx(0.0, abs=1e-6)
    for _ in range(50):
        calibration.record([0.3, 0.3], 3)  # every row accepted at a confidence of 0.3
    assert calibration.shift() > 2.0 and calibration.confidence_for(0.6) < 0.2
    sure = TailCalibration()
    for step in range(100):  # rows at 0.7 accepted 7 times in 10: calibrated
        sure.record([0.7], 2 if step % 10 < 7 else 1)
    assert abs(sure.shift()) < 0.15 and calibration.confidence_for(0.0) == 0.0


def test_auto_learns_that_an_unsure_drafter_is_right_and_stops_cutting_its_tails():
    """The tail cut prices a row at its drafter's confidence. A draft model that is right more
    often than its softmax says (the demo draft) would have every tail cut, and each cut, counted
    as a rejection, would lower the k the next step asks for: auto talked itself into drafts of
    one or two tokens where a fixed k = 4 was 1.9x. Measured against what the target accepts,
    the cut moves to where rows stop paying, and cut rows count neither way."""
    costs = Costs((0.010, 0.013, 0.016, 0.019, 0.022), {"draft": 1e-4})
    drafter = Unsure((0.5, 0.35))
    auto = AutoProposer({"draft": drafter}, costs, 4, learn_costs=False)
    auto.begin([1, 2, 3])
    lengths, p_mins = [], []
    for _ in range(60):
        draft = auto.propose([1, 2, 3], 4)
        lengths.append(len(draft.tokens))
        p_mins.append(drafter.p_min)
        auto.accept(len(draft.tokens), [1] * (len(draft.tokens) + 1))  # the target accepts every row
    cut = next(i for i, p in enumerate(p_mins) if p > 0.35)
    assert lengths[cut] == 2  # its 0.35 rows are cut at first
    assert p_mins[-1] < 0.35 and lengths[-1] == 4  # then they are drafted, and pay
    assert auto.report()["tail_calibration"]["draft"] > 1.0
    assert min(auto.estimates["draft"].per_position()) > 0.9  # the cuts were never counted as rejections


def test_a_drafter_as_sure_as_it_says_keeps_its_tails_cut():
    costs = Costs((0.010, 0.013, 0.016, 0.019, 0.022), {"draft": 1e-4})
    drafter = Unsure((0.6, 0.25))
    auto = AutoProposer({"draft": drafter}, costs, 4, learn_costs=False)
    auto.begin([1, 2, 3])
    for step in range(80):
        draft = auto.propose([1, 2, 3], 4)
        # its rows are accepted as often as their confidence says: 0.6 rows 3 times in 5, 0.25 rows 1 in 4
        accepted = 1
        for row, confidence in enumerate(drafter.row_confidence, start=1):
            if (step % 20) / 20 >= confidence:
                break
            accepted = row + 1
        accepted = min(accepted, len(draft.tokens))
        auto.accept(accepted, [1] * (accepted + 1))
    assert abs(auto.report()["tail_calibration"]["draft"]) < 0.5
    assert drafter.p_min > 0.25  # the unlikely tails stay cut


def test_a_draft_models_catch_up_is_priced_at_what_it_took():
    """After other methods committed tokens, a draft model first catches up on them in one
    batch. Its price (the drafter's per-token cost scaled by the target's pass shape) was about
    a ninth of what the demo draft took, and auto switched to it after runs of lookups as if that
    were nearly free: what such steps take beyond their drafting now sets the price."""
    from specdesk.engines.speculation.auto import CatchUpScale

    costs = Costs((0.010, 0.0105, 0.011, 0.0115, 0.012), {"draft": 1e-3})
    auto = AutoProposer({"draft": Counting()}, costs, 4)
    auto.begin([1, 2, 3])
    context = [1, 2, 3]
    for _ in range(4):
        context = context + [7] * 20  # committed while another method drafted
        behind = len(context) - auto._seen["draft"]
        unscaled = costs.catch_up_cost("draft", behind)
        draft = auto.propose(context, 4)
        assert auto.choice.method == "draft" and unscaled > 0
        drafting = costs.drafting_cost("draft", len(draft.tokens))
        auto.record_timing(1 + len(draft.tokens), 0.012, 0.0, drafting + 4 * unscaled)  # caught up at 4x its price
        auto.accept(len(draft.tokens), [7] * (len(draft.tokens) + 1))
        context = context + [7] * (len(draft.tokens) + 1)
    assert auto.catch_up["draft"].scale() == pytest.approx(4.0)
    assert auto.report()["catch_up_scale"] == {"draft": 4.0}
    behind = len(context) + 20 - auto._seen["draft"]
    auto._context_len = len(context) + 20
    assert auto.catch_up_s()["draft"] == pytest.approx(4.0 * costs.catch_up_cost("draft", behind))
    scale = CatchUpScale()
    assert scale.scale() == 1.0  # at its price until measured
    for ratio in (100.0, 100.0, 100.0):
        scale.record(ratio, 1.0)
    assert scale.scale() == 20.0  # bounded


def test_the_details_say_how_the_tails_were_cut_and_the_catch_up_priced():
    from specdesk.app.runtime.chat_controller import auto_details

    report = {"costs": {"pass_ms": [10.0, 11.0]}, "draft_p_min": {"draft": 0.034},
              "tail_calibration": {"draft": 1.7}, "catch_up_scale": {"draft": 9.3}, "steps": 10,
              "steps_by_choice": {"draft k=4": 1.0}}
    text = auto_details(report)
    assert "draft p = 0.03 (its rows accepted more often than its confidence says)" in text
    assert "draft 9.3x the price its drafting speed suggests" in text
    plain = auto_details({**report, "tail_calibration": {"draft": 0.0}, "catch_up_scale": {"draft": 1.0}})
    assert "confidence" not in plain and "catching up" not in plain
