"""Model-free proposers on literal token arrays."""

from __future__ import annotations

import random

import pytest

from specdesk.engines.speculation.ngram import NgramPoolProposer, NgramProposer, find_continuation
from specdesk.engines.types import Draft

# --- find_continuation (the reference) -----------------------------------------------------------


@pytest.mark.parametrize(
    "tokens, n_min, n_max, k, expected",
    [
        ([1, 2, 3, 4, 1, 2, 3], 1, 4, 3, [4, 1, 2]),
        ([1, 2, 3], 1, 4, 3, []),  # nothing repeats
        ([2, 1, 7, 3, 1, 8, 2, 1], 1, 4, 2, [7, 3]),  # [2,1] beats the more recent [1]
        ([2, 1, 7, 3, 1, 8, 2, 1], 1, 1, 2, [8, 2]),  # only unigrams: the latest [1]
        ([1, 5, 1, 6, 1], 1, 4, 2, [6, 1]),  # most recent earlier occurrence
        ([1, 2, 3, 1], 2, 4, 3, []),  # the unigram match is below n_min
        ([7, 8, 7, 8], 1, 4, 5, [7, 8, 7, 8, 7]),  # runs into the end: copies cyclically
        ([5, 5], 1, 4, 3, [5, 5, 5]),
        ([1, 2, 3, 4, 1, 2, 3], 1, 4, 0, []),
        ([], 1, 4, 3, []),
        ([9], 1, 4, 3, []),
    ],
)
def test_find_continuation(tokens, n_min, n_max, k, expected):
    assert find_continuation(tokens, n_min, n_max, k) == expected


# --- NgramProposer -----------------------------------------------------------------------


def test_prompt_lookup_proposes_from_the_prompt():
    proposer = NgramProposer(n_min=1, n_max=4)
    proposer.begin([1, 2, 3, 4, 1, 2, 3])
    draft = proposer.propose([1, 2, 3, 4, 1, 2, 3], 3)
    assert draft == Draft(tokens=(4, 1, 2), probs=None)


def test_prompt_lookup_without_a_match_proposes_nothing():
    proposer = NgramProposer()
    proposer.begin([1, 2, 3])
    assert proposer.propose([1, 2, 3], 4).tokens == ()


def test_prompt_lookup_index_stays_right_after_incremental_accepts():
    rng = random.Random(1)
    proposer = NgramProposer(n_min=1, n_max=3)
    context = [rng.randrange(6) for _ in range(20)]
    proposer.begin(context)
    while len(context) < 400:
        k = rng.randrange(0, 6)
        draft = proposer.propose(context, k)
        assert list(draft.tokens) == find_continuation(context, 1, 3, k)
        committed = [rng.randrange(6) for _ in range(rng.randrange(1, 5))]
        proposer.accept(rng.randrange(len(committed)), committed)
        context += committed


def test_prompt_lookup_resyncs_when_the_context_is_not_what_it_saw():
    proposer = NgramProposer(n_min=1, n_max=2)
    proposer.begin([1, 2, 3, 1, 2])
    proposer.accept(0, [9])  # the engine's context moved on without this token
    assert proposer.propose([4, 5, 6, 4], 2).tokens == (5, 6)
    proposer.begin([1, 2])  # a missed accept(): the longer context is picked up
    assert proposer.propose([1, 2, 8, 1], 1).tokens == (2,)


def test_prompt_lookup_keeps_counters():
    proposer = NgramProposer()
    proposer.begin([1, 2, 3, 1, 2])
    proposer.propose([1, 2, 3, 1, 2], 2)
    proposer.accept(1, [3, 9])
    proposer.propose([1, 2, 3, 1, 2, 3, 9], 2)  # [9] never seen before: empty draft
    stats = proposer.stats()
    assert (stats["proposals"], stats["drafted"], stats["accepted"]) == (2, 2, 1)
    assert stats["acceptance"] == 0.5 and stats["propose_s"] >= 0.0


def test_prompt_lookup_rejects_bad_sizes():
    with pytest.raises(ValueError, match="n-gram sizes 3..2"):
        NgramProposer(n_min=3, n_max=2)


# --- NgramPoolProposer --------------------------------------------------------------------------


def test_pool_learns_across_turns():
    pool = NgramPoolProposer(n=2, pool_size=1024)
    pool.begin([10, 11, 12, 13, 14])
    pool.accept(0, [15, 16])
    second_turn = [20, 21, 10, 11]  # a new prompt that does not repeat the first one
    pool.begin(second_turn)
    assert pool.propose(second_turn, 4).tokens == (12, 13, 14, 15)


def test_pool_drafts_variable_length_until_a_miss():
    pool = NgramPoolProposer(n=2, pool_size=1024)
    pool.begin([1, 2, 3, 4, 5, 1, 2])
    assert pool.propose([1, 2, 3, 4, 5, 1, 2], 8).tokens == (3, 4, 5, 1, 2, 3, 4, 5)
    pool.reset()
    pool.begin([6, 7, 8, 9])
    pool.begin([0, 6, 7])
    assert pool.propose([0, 6, 7], 8).tokens == (8, 9)  # (8, 9) has no follower yet


def test_pool_reset_forgets_everything():
    pool = NgramPoolProposer(n=2, pool_size=1024)
    pool.begin([1, 2, 3, 1, 2])
    pool.reset()
    pool.begin([1, 2])
    assert pool.propose([1, 2], 3).tokens == ()


def test_pool_stops_at_a_fresh_disagreement():
    pool = NgramPoolProposer(n=2, pool_size=1024)
    pool.begin([1, 2, 3, 1, 2, 4, 1, 2])  # (1, 2) was followed by 3, then by 4
    assert pool.propose([1, 2, 3, 1, 2, 4, 1, 2], 3).tokens == ()
    pool.accept(0, [4])  # confirmed: (1, 2) -> 4 twice in a row
    pool.accept(0, [1, 2])
    assert pool.propose([1, 2, 3, 1, 2, 4, 1, 2, 4, 1, 2], 3).tokens == (4, 1, 2)


def test_pool_prefers_the_longest_known_context():
    pool = NgramPoolProposer(n=3, n_min=1, pool_size=4096)
    pool.begin([5, 1, 2, 7, 9, 1, 2, 8, 5, 1, 2])  # (1, 2) -> 7 then 8, (5, 1, 2) -> 7
    assert pool.propose([5, 1, 2, 7, 9, 1, 2, 8, 5, 1, 2], 1).tokens == (7,)
    assert pool.propose([5, 1, 2, 7, 9, 1, 2, 8, 5, 1, 2, 7, 3, 1, 2], 1).tokens == ()  # (3,1,2) unseen, (1,2) disputed


def test_pool_does_not_count_a_repeated_chat_history_twice():
    pool = NgramPoolProposer(n=2, pool_size=1024, min_count=2)
    pool.begin([1, 2, 3, 5])
    pool.begin([1, 2, 3, 5, 6])  # the next turn repeats the history: learned once only
    assert pool.propose([1, 2, 3, 5, 6, 1, 2], 1).tokens == ()
    pool.accept(0, [3])
    pool.accept(0, [1, 2])
    assert pool.propose([1, 2, 3, 5, 6, 1, 2, 3, 1, 2], 1).tokens == (3,)


def test_pool_collisions_evict_instead_of_misleading():
    pool = NgramPoolProposer(n=1, pool_size=1)  # every n-gram shares the one slot
    pool.begin([1, 2, 5, 5])  # (1,) -> 2 and (2,) -> 5 are evicted; the slot holds (5,) -> 5
    assert pool.propose([1, 2, 5, 5], 2).tokens == (5, 5)
    assert pool.propose([1, 2, 5, 5, 1], 1).tokens == ()  # (5,)'s entry is never read as (1,)'s
    stats = pool.stats()
    assert (stats["pool_used"], stats["pool_evictions"]) == (1, 2)


def test_pool_keeps_counters():
    pool = NgramPoolProposer(n=2, pool_size=1024)
    pool.begin([1, 2, 3, 1, 2])
    pool.propose([1, 2, 3, 1, 2], 2)
    pool.accept(2, [3, 1, 2])
    stats = pool.stats()
    assert (stats["proposals"], stats["drafted"], stats["accepted"]) == (1, 2, 2)
    assert stats["method"] == "ngram-pool"
