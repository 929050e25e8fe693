"""Prompts from text: checked against the context before tokenizing, and a conversation cut
to the context (oldest turns first). The CLI chat, compare and the app share these.
"""

from __future__ import annotations

from specdesk.engines.spec.loop import check_prompt_text, is_prompt_too_long
from specdesk.engines.types import SpecDeskError


def text_tokens(engine, text: str) -> list[int]:
    """Raw text to continue (no chat template), refused before tokenizing when it cannot fit."""
    # Raw text is tokenized without recognising special-token text, so token bytes bound it.
    check_prompt_text(text, engine.n_ctx, engine.target, special=False)
    return engine.tokenize(text)


def fit_chat(engine, messages: list[dict], reserve: int) -> tuple[list[int], int]:
    """The conversation's prompt with room for `reserve` new tokens; the oldest turns are
    dropped until it fits, down to the last message. Returns (tokens, turns dropped)."""
    from specdesk.app.main import chat_prompt

    if not messages:
        raise SpecDeskError("there is no message to answer")
    dropped = 0
    while True:
        window = messages[dropped:]
        try:
            tokens = chat_prompt(engine, window)
        except SpecDeskError as e:
            if len(window) > 1 and is_prompt_too_long(e):
                dropped += 1
                continue
            raise
        if len(tokens) + reserve > engine.n_ctx and len(window) > 1:
            dropped += 1
            continue
        return tokens, dropped
