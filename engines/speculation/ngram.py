"""Proposers that need no model: prompt lookup, and a hash-pool n-gram table that learns
across the turns of a chat (llama.cpp's "ngram-mod" idea).

Both follow the proposer interface of docs/ARCHITECTURE.md: `begin(prompt)`, `propose(context, k) ->
Draft` (probs None: verification treats q as one-hot), `accept(n_accepted, committed)`,
plus `stats() -> dict`. `propose()` is given the full context (prompt + generated); each
proposer keeps its own copy, extended by `accept()`, and resyncs from `context` when the
two disagree in length or last token, so a missed `accept()` costs time, not correctness.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

import numpy as np

from ..types import Draft
from .stats import ProposerCounters


def find_continuation(tokens: Sequence[int], n_min: int, n_max: int, k: int) -> list[int]:
    """Reference prompt lookup on a literal array (brute force; NgramProposer must agree).

    Take the longest suffix of `tokens` (n_max down to n_min tokens) that also occurs earlier
    with at least one token after it, pick its most recent such occurrence, and copy up to k
    tokens that follow it. A copy that runs into the end of `tokens` continues from the copy
    itself (LZ77-style overlap), so a repeating pattern is drafted for the full k:
    [1,2,3,4,1,2,3] -> [4,1,2] (k=3); [7,8,7,8] -> [7,8,7] (k=3).
    """
    tokens = [int(t) for t in tokens]
    length = len(tokens)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        suffix = tokens[length - n:]
        for start in range(length - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                return _copy_continuation(tokens, start + n, k)
    return []


def _copy_continuation(tokens: Sequence[int], source: int, k: int) -> list[int]:
    """Up to k tokens from tokens[source:], continuing cyclically past the end (source < len)."""
    length = len(tokens)
    out: list[int] = []
    for offset in range(k):
        position = source + offset
        out.append(tokens[position] if position < length else out[position - length])
    return out


def _check_sizes(n_min: int, n_max: int) -> None:
    if not 1 <= n_min <= n_max:
        raise ValueError(f"n-gram sizes {n_min}..{n_max} are invalid: need 1 <= n_min <= n_max")


class _Lookup:
    """What the two lookups share: counters, and learning each step's committed tokens."""

    counters: ProposerCounters

    def _extend(self, new_tokens: Sequence[int]) -> None:
        raise NotImplementedError

    def _drafted(self, draft: list[int], started: float) -> Draft:
        self.counters.record_proposal(len(draft), time.perf_counter() - started)
        return Draft(tokens=tuple(draft))

    def accept(self, n_accepted: int, committed: Sequence[int]) -> None:
        self.counters.record_accepted(n_accepted)
        self._extend(committed)


class NgramProposer(_Lookup):
    """Prompt lookup decoding: copy what followed the latest earlier occurrence of the context's
    longest matching suffix (n_max down to n_min tokens). Cyclic copy past the end, as in
    `find_continuation`.

    An index {n-gram tuple: last start position that has a follower} is built by `begin()` and
    extended per committed token, so a step costs O(n_max - n_min + k), not O(context).
    """

    def __init__(self, n_min: int = 1, n_max: int = 4) -> None:
        _check_sizes(n_min, n_max)
        self.n_min = n_min
        self.n_max = n_max
        self.counters = ProposerCounters()
        self._tokens: list[int] = []
        self._last_start: dict[tuple[int, ...], int] = {}

    def begin(self, prompt: Sequence[int]) -> None:
        self._tokens = []
        self._last_start = {}
        self._extend(prompt)

    def propose(self, context: Sequence[int], k: int) -> Draft:
        started = time.perf_counter()
        self._sync(context)
        tokens = self._tokens
        length = len(tokens)
        draft: list[int] = []
        if k > 0:
            for n in range(min(self.n_max, length - 1), self.n_min - 1, -1):
                start = self._last_start.get(tuple(tokens[length - n:]))
                if start is not None:
                    draft = _copy_continuation(tokens, start + n, k)
                    break
        return self._drafted(draft, started)

    def stats(self) -> dict:
        return {"method": "ngram", "n_min": self.n_min, "n_max": self.n_max, **self.counters.as_dict()}

    def _extend(self, new_tokens: Sequence[int]) -> None:
        tokens = self._tokens
        for token in new_tokens:
            tokens.append(int(token))
            follower_at = len(tokens) - 1
            # every n-gram ending just before the new token now has a follower
            for n in range(self.n_min, min(self.n_max, follower_at) + 1):
                self._last_start[tuple(tokens[follower_at - n:follower_at])] = follower_at - n

    def _sync(self, context: Sequence[int]) -> None:
        have = len(self._tokens)
        if _extends(context, self._tokens):
            if len(context) > have:
                self._extend(context[have:])
        else:
            self.begin(context)


def _extends(context: Sequence[int], known: list[int]) -> bool:
    """Cheap check that `context` is `known` plus maybe more (compares the last known token)."""
    have = len(known)
    if len(context) < have:
        return False
    return have == 0 or int(context[have - 1]) == known[-1]


_EMPTY = -1
_COUNT_CAP = 100


class NgramPoolProposer(_Lookup):
    """A fixed-size hash table {hash(last n tokens): the token that followed}, learned from
    every token seen (prompts and generated text) and kept across `begin()` calls (chat turns);
    `reset()` clears it. Levels n, n-1, ..., n_min share the table (default 8..2: on code
    edits the long levels keep drafts long and right, the short ones keep some drafting on
    fresh text). Memory: 14 bytes per slot (15 MB at the default 2^20 slots).

    Drafting chains lookups: t1 from the last tokens, t2 from the last tokens + t1, ... until
    a miss or k tokens, so drafts have variable length. At each step the longest level whose
    n-gram is in the table decides (shorter levels are tried only when it is absent).

    Confidence rule: a slot counts how many times in a row its n-gram was followed by the
    stored token (0 right after a different follower replaced it); the chain stops at a slot
    whose count is below `min_count` (default 1: never draft across a fresh disagreement).
    Slots store the full 64-bit key, so a colliding n-gram evicts instead of misleading.
    """

    def __init__(self, n: int = 8, pool_size: int = 1 << 20, n_min: Optional[int] = None, min_count: int = 1) -> None:
        n_min = min(2, n) if n_min is None else n_min
        _check_sizes(n_min, n)
        if pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {pool_size}")
        if min_count < 0:
            raise ValueError(f"min_count must be >= 0, got {min_count}")
        self.n = n
        self.n_min = n_min
        self.pool_size = pool_size
        self.min_count = min_count
        self.counters = ProposerCounters()
        self._levels = tuple(range(n, n_min - 1, -1))  # longest first
        self._context: list[int] = []
        self.reset()

    def reset(self) -> None:
        """Forget everything learned (a new chat)."""
        # Read and written one slot at a time, several times per committed token: through
        # memoryviews, whose elements are plain ints (numpy's per-element indexing was most of a
        # step's learning), over numpy's arrays (allocated lazily: a new chat costs nothing).
        self._keys = memoryview(np.zeros(self.pool_size, dtype=np.int64))
        self._followers = memoryview(np.full(self.pool_size, _EMPTY, dtype=np.int32))
        self._counts = memoryview(np.zeros(self.pool_size, dtype=np.int16))
        self._context = []
        self._used = 0
        self._evictions = 0
        self._conflicts = 0

    def begin(self, prompt: Sequence[int]) -> None:
        """Start a turn: learn the prompt, skipping the prefix it shares with the last turn's
        context (already learned), so a chat's history is not counted twice."""
        prompt = [int(t) for t in prompt]
        learned = _common_prefix_len(prompt, self._context)
        self._context = prompt
        self._learn_from(max(learned, 1))

    def propose(self, context: Sequence[int], k: int) -> Draft:
        started = time.perf_counter()
        if _extends(context, self._context):
            self._extend(context[len(self._context):])
        else:
            self.begin(context)
        window = self._context[-self.n:]
        draft: list[int] = []
        while len(draft) < k:
            token = self._lookup(window)
            if token is None:
                break
            draft.append(token)
            window = window[1:] + [token] if len(window) >= self.n else window + [token]
        return self._drafted(draft, started)

    def stats(self) -> dict:
        return {
            "method": "ngram-pool",
            "n": self.n,
            "n_min": self.n_min,
            "pool_size": self.pool_size,
            "pool_used": self._used,
            "pool_evictions": self._evictions,
            "pool_conflicts": self._conflicts,
            **self.counters.as_dict(),
        }

    def _extend(self, new_tokens: Sequence[int]) -> None:
        first_new = len(self._context)
        self._context.extend(int(t) for t in new_tokens)
        self._learn_from(first_new)

    def _learn_from(self, first_follower: int) -> None:
        """Learn (n-gram -> follower) for every follower position >= first_follower."""
        tokens = self._context
        for position in range(max(first_follower, 1), len(tokens)):
            follower = tokens[position]
            for n in self._levels:
                if n <= position:
                    self._learn_one(hash(tuple(tokens[position - n:position])), follower)

    def _learn_one(self, key: int, follower: int) -> None:
        slot = key % self.pool_size
        stored = self._followers[slot]
        if stored == _EMPTY or self._keys[slot] != key:
            self._used += stored == _EMPTY
            self._evictions += stored != _EMPTY
            self._keys[slot] = key
            self._followers[slot] = follower
            self._counts[slot] = 1
        elif stored == follower:
            self._counts[slot] = min(self._counts[slot] + 1, _COUNT_CAP)
        else:
            self._conflicts += 1
            self._followers[slot] = follower
            self._counts[slot] = 0

    def _lookup(self, window: list[int]) -> Optional[int]:
        for n in self._levels:
            if n > len(window):
                continue
            key = hash(tuple(window[len(window) - n:]))
            slot = key % self.pool_size
            if self._followers[slot] == _EMPTY or self._keys[slot] != key:
                continue  # unseen at this length: try a shorter one
            return self._followers[slot] if self._counts[slot] >= self.min_count else None
        return None


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    shared = min(len(a), len(b))
    if shared == 0:
        return 0
    differ = np.flatnonzero(np.asarray(a[:shared], dtype=np.int64) != np.asarray(b[:shared], dtype=np.int64))
    return int(differ[0]) if differ.size else shared


# --- the method table's shared proposers (engines/methods.py: ngram's and ngram-pool's `shared`) ---
def lookup(engine, spec) -> NgramProposer:
    """Method ngram: a fresh lookup in the prompt and reply, for one run."""
    return NgramProposer(spec.ngram_min, spec.ngram_max)


def pool(engine, spec) -> NgramPoolProposer:
    """Method ngram-pool: the engine's own pool, which learns across the turns of a chat."""
    return engine.pool
