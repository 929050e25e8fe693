"""Incremental detokenization and sandboxed chat templates (pure helpers)."""

from __future__ import annotations

import pytest

from specdesk.app.chat.templates import render_chat
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
