"""The reply Markdown reader: blocks, inline styles, and draft flags kept per character."""

from specdesk.ui.markdown import char_flags, looks_like_code, parse


def kinds(blocks):
    return [b.kind for b in blocks]


def test_fenced_code_keeps_its_lines_and_language():
    text = "Here:\n\n```python\ndef f(x):\n    return x * 2\n```\nDone."
    blocks = parse(text)
    assert kinds(blocks) == ["paragraph", "code", "paragraph"]
    assert blocks[1].lang == "python"
    assert blocks[1].text == "def f(x):\n    return x * 2"
    assert blocks[2].text == "Done."


def test_an_open_fence_runs_to_the_end_while_streaming():
    blocks = parse("Start\n```\nfor i in x:\n    pri")
    assert kinds(blocks) == ["paragraph", "code"]
    assert blocks[1].text == "for i in x:\n    pri"


def test_headings_lists_quotes_and_rules():
    text = "# Title\n\n- one\n- two\n  more\n1. first\n> quoted\n\n---\nend"
    blocks = parse(text)
    assert kinds(blocks) == ["heading", "item", "item", "item", "quote", "rule", "paragraph"]
    assert blocks[0].level == 1 and blocks[0].text == "Title"
    assert [b.marker for b in blocks[1:4]] == ["•", "•", "1."]
    assert blocks[2].text == "two\nmore"
    assert blocks[4].text == "quoted"


def test_inline_styles_and_the_markup_they_drop():
    (block,) = parse("Use `parse_args()` with **care** and *style*, see [docs](https://docs.python.org).")
    styled = {(r.text, r.code, r.bold, r.italic, r.link) for r in block.runs}
    assert ("parse_args()", True, False, False, None) in styled
    assert ("care", False, True, False, None) in styled
    assert ("style", False, False, True, None) in styled
    assert ("docs", False, False, False, "https://docs.python.org") in styled
    assert "**" not in block.text and "`" not in block.text


def test_names_and_operators_are_not_emphasis():
    (block,) = parse("call __init__ with a * b and f(**kwargs)")
    assert block.text == "call __init__ with a * b and f(**kwargs)"
    assert not any(r.bold or r.italic for r in block.runs)


def test_paragraph_line_breaks_are_kept():
    (block,) = parse("first line\nsecond line")
    assert block.text == "first line\nsecond line"


def test_bare_code_is_one_code_block():
    code = "import os\n\ndef main(argv):\n    for a in argv:\n        print(a)\n"
    assert looks_like_code(code)
    blocks = parse(code)
    assert kinds(blocks) == ["code"] and blocks[0].text == code.rstrip("\n")
    assert not looks_like_code("This is prose.\nIt has two sentences.")


def test_draft_flags_follow_the_characters_they_belong_to():
    pieces = ["**", "bold", "**", " and ", "`x`"]
    drafted = [False, True, False, True, False]
    text = "".join(pieces)
    (block,) = parse(text, char_flags(pieces, drafted))
    assert [(r.text, r.drafted) for r in block.runs] == [("bold", True), (" and ", True), ("x", False)]
