"""Prompts from text: checked against the context before tokenizing, a conversation in the
model's chat template, and a conversation cut to the context (oldest turns first, the
system prompt kept). The CLI, the app (app/runtime/session.py) and the engine process share
these.
"""

from __future__ import annotations

from typing import Optional

from specdesk.engines.speculation.loop import check_prompt_text, is_prompt_too_long
from specdesk.engines.speculation.proposers import cross_vocabulary_draft
from specdesk.engines.types import SpecDeskError


def with_system_prompt(messages: list[dict], system_prompt: str) -> list[dict]:
    """The conversation as the template gets it: the system prompt first (when there is one),
    in place of any system message the conversation starts with."""
    rest = messages[1:] if messages and messages[0].get("role") == "system" else list(messages)
    return ([{"role": "system", "content": system_prompt}] if system_prompt.strip() else []) + rest


def text_tokens(engine, text: str) -> list[int]:
    """Raw text to continue (no chat template), refused before tokenizing when it cannot fit."""
    # Raw text is tokenized without recognising special-token text, so token bytes bound it.
    check_prompt_text(text, engine.n_ctx, engine.target, special=False)
    return engine.tokenize(text)


def chat_prompt(engine, messages: list[dict]) -> list[int]:
    """A conversation in the target's chat template, as tokens; refused before rendering and
    before tokenizing when its text cannot fit the context."""
    if hasattr(engine, "chat_prompt"):  # an engine host renders the template itself (a template can hang)
        return engine.chat_prompt(messages)
    from specdesk.app.chat.templates import render_chat

    model = engine.target
    # Before rendering, the messages' own text: a template shows it (a template that drops
    # most of a message is not worth rendering 50 MB for), and a template looping over the
    # lines of a huge message would be stopped by its limits with a reason that misleads.
    check_prompt_text("".join(m["content"] for m in messages if isinstance(m.get("content"), str)),
                      engine.n_ctx, model)
    text = render_chat(model.chat_template(), messages, bos_token=model.token_text(model.vocab.bos),
                       eos_token=model.token_text(model.vocab.eos), source=str(model.path))
    check_prompt_text(text, engine.n_ctx, model)  # before tokenizing: a 50 MB paste is refused at once
    return model.tokenize(text, add_bos=False, parse_special=True)


def draft_conversation(draft, messages: list[dict]) -> str:
    """The conversation as a cross-vocabulary draft reads it (`SpecConfig.draft_prompt`): in the
    draft model's own chat template, or as plain text (the messages, a blank line apart) when
    it has none. Stop tokens stay the target's: the draft's end of turn only ends its draft."""
    template = draft.chat_template()
    if not template:
        return "".join(f"{m['content']}\n\n" for m in messages if isinstance(m.get("content"), str))
    from specdesk.app.chat.templates import render_chat

    vocab = draft.vocab
    return render_chat(template, messages, bos_token=draft.token_text(vocab.bos) if vocab.bos is not None else "",
                       eos_token=draft.token_text(vocab.eos) if vocab.eos is not None else "", source=str(draft.path))


def draft_prompt(engine, spec, messages: list[dict]) -> str:
    """The conversation for a draft model with a vocabulary of its own (the cross-vocabulary
    method, or auto with such a draft): in the draft's template; "" for any other run."""
    if not spec.draft_path:
        return ""
    if hasattr(engine, "draft_prompt"):  # an engine host holds the draft (and renders: a template can hang)
        return engine.draft_prompt(spec, messages)
    draft = cross_vocabulary_draft(engine, spec)
    return draft_conversation(draft, messages) if draft is not None else ""


def fit_chat(engine, messages: list[dict], reserve: int) -> tuple[list[int], int]:
    """The conversation's prompt with room for `reserve` new tokens; the oldest turns are
    dropped until it fits, down to the last message. A system message the conversation
    starts with is always kept. Returns (tokens, turns dropped).

    Fewer turns never make a longer prompt, so the number to drop is found by bisection:
    a few renders even for a conversation of thousands of turns."""
    system = messages[:1] if len(messages) > 1 and messages[0].get("role") == "system" else []
    turns = messages[len(system):]
    if not turns:
        raise SpecDeskError("there is no message to answer")
    last = len(turns) - 1
    tried: dict[int, tuple[Optional[list[int]], Optional[SpecDeskError]]] = {}

    def attempt(dropped: int) -> tuple[Optional[list[int]], Optional[SpecDeskError]]:
        """(tokens, None) when it fits; (tokens or None, why not) when it does not."""
        if dropped not in tried:
            try:
                tokens = chat_prompt(engine, system + turns[dropped:])
            except SpecDeskError as e:
                if not is_prompt_too_long(e):
                    raise
                tried[dropped] = (None, e)
            else:
                tried[dropped] = (tokens, None if len(tokens) + reserve <= engine.n_ctx else SpecDeskError())
        return tried[dropped]

    if attempt(0)[1] is None:
        return attempt(0)[0], 0
    too_many, enough = 0, last  # keeping turns[too_many:] does not fit; turns[enough:] is the answer
    while enough - too_many > 1:
        middle = (too_many + enough) // 2
        if attempt(middle)[1] is None:
            enough = middle
        else:
            too_many = middle
    tokens, why_not = attempt(enough)
    if tokens is None:  # even the last message alone is provably too long
        raise why_not
    return tokens, enough  # the last message alone may still not fit: generate() then says by how much
