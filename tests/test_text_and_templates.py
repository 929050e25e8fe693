"""Incremental detokenization and sandboxed chat templates (pure helpers)."""

from __future__ import annotations

import pytest

from specdesk.app.chat.prompting import chat_prompt, fit_chat, with_system_prompt
from specdesk.app.chat.templates import fold_system_prompt, render_chat
from specdesk.engines.text import IncrementalDetokenizer
from specdesk.engines.types import SpecDeskError

# "é" is two bytes and "🙂" four: tokens that end mid-character must not emit half of one.
PIECES = {1: b"caf", 2: b"\xc3", 3: b"\xa9 ", 4: b"\xf0\x9f", 5: b"\x99", 6: b"\x82!", 7: b"\xff"}


def test_detokenizer_holds_back_incomplete_characters():
    detok = IncrementalDetokenizer(PIECES.__getitem__)
    assert detok.push([1, 2]) == "caf"
    assert detok.push([3]) == "é "
    assert detok.push([4]) == ""
    assert detok.push([5]) == ""
    assert detok.push([6]) == "🙂!"
    assert detok.flush() == ""


def test_detokenizer_flushes_invalid_tail_as_replacement():
    detok = IncrementalDetokenizer(PIECES.__getitem__)
    assert detok.push([1, 4]) == "caf"
    assert detok.flush() == "\ufffd"
    detok = IncrementalDetokenizer(PIECES.__getitem__)
    assert detok.push([7, 1]) == "\ufffdcaf"


def test_template_renders_messages():
    template = "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    text = render_chat(template, [{"role": "user", "content": "hi"}], bos_token="<s>")
    assert text == "<s><user>hi"


@pytest.mark.parametrize("template", [
    "{{ messages.__class__.__mro__[1].__subclasses__() }}",
    "{{ ''.__class__.__base__.__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{% set x = messages.append({'role': 'x'}) %}",
])
def test_template_reaching_for_python_internals_is_refused(template):
    with pytest.raises(SpecDeskError, match="chat template of model.gguf"):
        render_chat(template, [{"role": "user", "content": "hi"}], source="model.gguf")


def test_template_errors_are_reported():
    with pytest.raises(SpecDeskError, match="failed to render: no system role"):
        render_chat("{{ raise_exception('no system role') }}", [], source="model.gguf")


# --- system prompts ------------------------------------------------------------------------
CONVERSATION = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "sort a list"}]
SYSTEM = "You answer in rhyme."


def zoo_template(name: str) -> str:
    from benchmarks import zoo

    return (zoo.vocab_models_dir() / "templates" / name).read_text(encoding="utf-8")


def test_the_system_prompt_goes_first_and_replaces_an_old_one():
    messages = with_system_prompt(CONVERSATION, SYSTEM)
    assert messages == [{"role": "system", "content": SYSTEM}] + CONVERSATION
    assert with_system_prompt(messages, "Be brief.")[0] == {"role": "system", "content": "Be brief."}
    assert with_system_prompt(messages, "  ") == CONVERSATION
    assert with_system_prompt(CONVERSATION, "") == CONVERSATION


def test_a_system_prompt_reaches_a_real_chat_template():
    text = render_chat(zoo_template("Qwen-Qwen2.5-7B-Instruct.jinja"), with_system_prompt(CONVERSATION, SYSTEM))
    assert text.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nhi<|im_end|>")
    assert "You are Qwen" not in text  # the template's own default system prompt gave way
    llama3 = render_chat(zoo_template("meta-llama-Llama-3.2-3B-Instruct.jinja"),
                         with_system_prompt(CONVERSATION, SYSTEM), bos_token="<|begin_of_text|>")
    assert f"<|start_header_id|>system<|end_header_id|>\n\n" in llama3 and f"{SYSTEM}<|eot_id|>" in llama3


def test_a_template_without_a_system_role_gets_the_prompt_in_the_first_user_turn():
    template = zoo_template("google-gemma-2-2b-it.jinja")
    with pytest.raises(SpecDeskError, match="System role not supported"):
        render_chat(template, [{"role": "system", "content": SYSTEM}, {"role": "assistant", "content": "x"}])
    text = render_chat(template, with_system_prompt(CONVERSATION, SYSTEM), bos_token="<bos>")
    assert text.startswith(f"<bos><start_of_turn>user\n{SYSTEM}\n\nhi<end_of_turn>\n")
    assert fold_system_prompt(CONVERSATION) is CONVERSATION


def test_a_long_conversation_keeps_its_system_prompt_when_old_turns_go(demo_family):
    from specdesk.engines.llama.engine import LlamaEngine

    engine = LlamaEngine(demo_family["target_gguf"], n_ctx=256, n_threads=1)
    try:
        turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: sort the list {i}"}
                 for i in range(41)]
        messages = with_system_prompt(turns, SYSTEM)
        tokens, dropped = fit_chat(engine, messages, reserve=32)
        assert dropped > 0 and len(tokens) + 32 <= engine.n_ctx
        assert tokens == chat_prompt(engine, messages[:1] + turns[dropped:])
        assert SYSTEM in engine.detokenize(tokens) and "turn 0:" not in engine.detokenize(tokens)
    finally:
        engine.close()
