"""Moving text between two tokenizers at a safe boundary: what cross-vocabulary drafting
(engines/speculation/crossvocab.py) does each step, as pure functions of a tokenizer.

A tokenizer here is anything with `tokenize(text, add_bos, parse_special)` and
`token_bytes(id)` (a GgufModel or a TorchModel); control tokens stand for no bytes.
Text is handled as bytes, since a token may hold part of a UTF-8 character; a piece is
tokenized only up to its last whole character. A SentencePiece tokenizer puts a space in
front of fresh text (its dummy prefix): the encodings below measure that lead and give
every token's end as an offset in the text asked for.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

ANCHOR_TOKENS = 4  # committed target tokens re-encoded with the draft's text, to find the junction
REENCODE_TOKENS = 2  # draft tokens re-encoded with new text at least (the last one may merge with it)


def utf8_prefix(data: bytes) -> bytes:
    """The longest prefix of `data` that is whole UTF-8 characters."""
    try:
        data.decode("utf-8")
        return data
    except UnicodeDecodeError as e:
        return data[:e.start]


def starts_mid_character(data: bytes) -> bool:
    return bool(data) and 0x80 <= data[0] < 0xC0


@dataclass(frozen=True)
class Encoding:
    ids: list[int]
    ends: list[int]  # (len(ids),) each token's end, as a byte offset in the text encoded


def encode(model, data: bytes) -> Optional[Encoding]:
    """`data` (whole characters) as `model`'s tokens with no BOS, each one's end as an offset
    in `data`. A space the tokenizer put in front (SentencePiece's dummy prefix) is measured
    and left out of the offsets; None when the tokens do not spell `data` (a tokenizer that
    normalises text), since then no offset can be trusted."""
    ids = model.tokenize(data.decode("utf-8"), add_bos=False, parse_special=False)
    pieces = [model.token_bytes(token) for token in ids]
    spelled = b"".join(pieces)
    lead = len(spelled) - len(data)
    if spelled[lead:] != data or lead not in (0, 1) or spelled[:lead] not in (b"", b" "):
        return None
    ends, at = [], -lead
    for piece in pieces:
        at += len(piece)
        ends.append(at)
    while ends and ends[0] <= 0:  # the dummy prefix's own token: no text of `data`
        ids, ends = ids[1:], ends[1:]
    return Encoding(ids, ends)


def split_at(ends: Sequence[int], offset: int) -> Optional[int]:
    """How many tokens end at or before `offset` when one ends exactly there (or nothing
    does: offset 0); None when a token spans it."""
    if offset == 0:
        return 0
    for i, end in enumerate(ends):
        if end == offset:
            return i + 1
        if end > offset:
            return None
    return None


class Vocab:
    """One model's tokens by their bytes (normal tokens only: a control token stands for
    none; a duplicated piece keeps its lowest id). Built once per model."""

    def __init__(self, model):
        self.n_vocab = int(model.n_vocab)
        by_bytes: dict[bytes, int] = {}
        for token in range(self.n_vocab):
            piece = model.token_bytes(token)
            if piece:
                by_bytes.setdefault(piece, token)
        self.by_bytes = by_bytes


_vocabs: "weakref.WeakKeyDictionary[object, Vocab]" = weakref.WeakKeyDictionary()


def vocab_of(model) -> Vocab:
    vocab = _vocabs.get(model)
    if vocab is None:
        vocab = _vocabs[model] = Vocab(model)
    return vocab


@dataclass(frozen=True)
class Intersection:
    """The tokens two vocabularies share as single tokens (the same bytes): each shared
    draft id and its target id (Token-Level Intersection, Timor et al. 2025)."""

    draft_ids: np.ndarray  # (n,) int64
    target_ids: np.ndarray  # (n,) int64, the same text as draft_ids, position by position
    draft_to_target: np.ndarray  # (V_draft,) int64: the target id of each draft id, -1 where none

    @property
    def size(self) -> int:
        return int(self.draft_ids.shape[0])


_intersections: "weakref.WeakKeyDictionary[object, weakref.WeakKeyDictionary]" = weakref.WeakKeyDictionary()


def intersection(target, draft) -> Intersection:
    """The shared tokens of two models, computed once per pair."""
    per_target = _intersections.setdefault(draft, weakref.WeakKeyDictionary())
    found = per_target.get(target)
    if found is None:
        target_by_bytes = vocab_of(target).by_bytes
        pairs = sorted((d, target_by_bytes[piece]) for piece, d in vocab_of(draft).by_bytes.items()
                       if piece in target_by_bytes)
        ids = np.array(pairs, dtype=np.int64).reshape(-1, 2)
        mapping = np.full(int(draft.n_vocab), -1, dtype=np.int64)
        mapping[ids[:, 0]] = ids[:, 1]
        found = per_target[target] = Intersection(ids[:, 0].copy(), ids[:, 1].copy(), mapping)
    return found


def continuation(model, committed: Sequence[int], new: bytes) -> list[int]:
    """`model`'s tokens for text `new` that follows the committed tokens (which stay as they
    are): the last few committed tokens' text is encoded again with `new`, so a token that
    spans the junction in either tokenization is seen, and the tokens after the junction
    are the answer. When a token of the re-encoding spans the junction, the rest of its text
    is proposed as the vocabulary's longest matching tokens (one, where it has that text)."""
    anchor = _anchor(model, committed)
    joined = utf8_prefix(anchor + new)
    if len(joined) <= len(anchor):
        return []
    encoded = encode(model, joined)
    if encoded is None:
        return []
    after = split_at(encoded.ends, len(anchor))
    if after is not None:
        return encoded.ids[after:]
    spanning = next(i for i, end in enumerate(encoded.ends) if end > len(anchor))
    rest = longest_matches(vocab_of(model).by_bytes, joined[len(anchor):encoded.ends[spanning]])
    return [*rest, *encoded.ids[spanning + 1:]] if rest else []


def longest_matches(by_bytes: dict[bytes, int], data: bytes, longest: int = 32) -> list[int]:
    """`data` as tokens taken greedily longest first (empty when some byte has no token)."""
    ids: list[int] = []
    at = 0
    while at < len(data):
        size = next((n for n in range(min(longest, len(data) - at), 0, -1) if data[at:at + n] in by_bytes), 0)
        if not size:
            return []
        ids.append(by_bytes[data[at:at + size]])
        at += size
    return ids


def _anchor(model, committed: Sequence[int]) -> bytes:
    """The text of up to ANCHOR_TOKENS last committed tokens, none of them a control token,
    starting at a whole character."""
    pieces: list[bytes] = []
    for token in reversed(committed[-ANCHOR_TOKENS:]):
        piece = model.token_bytes(token)
        if not piece:
            break
        pieces.append(piece)
    while pieces and starts_mid_character(pieces[-1]):
        pieces.pop()
    return b"".join(reversed(pieces))


class DraftText:
    """The committed text as the draft model's tokens, kept up to date as the target
    commits: the last tokens (which may merge with the new text) are encoded again with
    it, from a boundary where the old and new encodings agree on the first token; the draft's
    cache then keeps the common prefix (rollback by position). `fixed` leading ids (BOS, the
    draft's own rendering of the prompt) are never encoded again."""

    def __init__(self, model, fixed: Sequence[int] = (), text: bytes = b""):
        self.model = model
        self.ids: list[int] = list(fixed)
        self.ends: list[int] = [0] * len(self.ids)  # byte ends in `text`
        self.fixed = len(self.ids)
        self.text = b""
        self.covered = 0  # bytes of text the ids spell (an unfinished character waits)
        self.extend(text)

    def extend(self, new: bytes) -> list[int]:
        """Add committed text; the ids for all of it."""
        if not new:
            return self.ids
        self.text += new
        back = REENCODE_TOKENS
        while True:
            keep = max(self.fixed, len(self.ids) - back)
            start = self.ends[keep - 1] if keep > self.fixed else 0
            if self._encode_from(keep, start):
                return self.ids
            back *= 2

    def _encode_from(self, keep: int, start: int) -> bool:
        """Encode text[start:] after ids[:keep]; False when the boundary is not a safe one."""
        whole = keep == self.fixed
        piece = utf8_prefix(self.text[start:])
        if not whole and starts_mid_character(self.text[start:]):
            return False
        encoded = encode(self.model, piece) if piece else Encoding([], [])
        if encoded is None:
            return whole  # nothing better to do at the start: leave the ids as they were
        old = self.ids[keep:]
        if not whole and old and (not encoded.ids or encoded.ids[0] != old[0]):
            return False  # the encodings disagree where they start: go further back
        self.ids = self.ids[:keep] + encoded.ids
        self.ends = self.ends[:keep] + [start + end for end in encoded.ends]
        self.covered = start + len(piece)
        return True
