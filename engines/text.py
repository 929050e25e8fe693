"""Incremental detokenization that never splits a UTF-8 character."""

from __future__ import annotations

import codecs
from typing import Callable, Iterable


class IncrementalDetokenizer:
    """Turns token bytes into text as tokens arrive.

    A byte-level token can end in the middle of a multi-byte character; those bytes are
    held back until the character is complete, so every emitted string is valid text.
    """

    def __init__(self, token_bytes: Callable[[int], bytes]):
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, tokens: Iterable[int]) -> str:
        return self._decoder.decode(b"".join(self._token_bytes(t) for t in tokens))

    def flush(self) -> str:
        """What is still held back at the end of a generation (shown as U+FFFD if invalid)."""
        return self._decoder.decode(b"", final=True)
