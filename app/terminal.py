"""Text for a terminal: what a server, a hub or a model file says is shown, never obeyed."""

from __future__ import annotations

import re

# ANSI escape sequences (CSI, OSC, and two-character ones), then any other control character
# but tab and newline (and the bidirectional overrides): text from elsewhere must not move the
# cursor, retitle or recolour a terminal, nor reorder what it shows.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]|\x9b[0-?]*[ -/]*[@-~]")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str, one_line: bool = False) -> str:
    """`text` without terminal escape sequences and control characters (tab and newline stay,
    unless `one_line`, which turns them into spaces)."""
    text = _CONTROLS.sub("", _ESCAPES.sub("", text))
    return re.sub(r"[\t\n]+", " ", text) if one_line else text
