"""The reply Markdown reader: blocks, inline styles, and draft flags kept per character."""

import random

import pytest

from specdesk.ui.markdown import (Stream, char_flags, code_block_text, code_blocks, copy_href, looks_like_code, parse,
                                  parse_copy_href)


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


def marked(source):
    """Text and per-character draft flags from a literal where ⟦…⟧ marks the drafted characters."""
    text, flags, drafted = [], [], False
    for ch in source:
        if ch in "⟦⟧":
            drafted = ch == "⟦"
            continue
        text.append(ch)
        flags.append(drafted)
    return "".join(text), flags


def tinted(blocks):
    return "".join(r.text for b in blocks for r in b.runs if r.drafted)


def test_nested_lists_keep_their_depth_and_numbering():
    # numbers count up from the first one, as CommonMark renders them; `)` starts another list
    blocks = parse("3. a\n   - b\n     - c\n4. d\n\n1) x\n1) y")
    assert kinds(blocks) == ["item"] * 6
    assert [(b.level, b.marker, b.text) for b in blocks] == [
        (0, "3.", "a"), (1, "•", "b"), (2, "•", "c"), (0, "4.", "d"), (0, "1)", "x"), (0, "2)", "y")]


def test_a_later_paragraph_of_an_item_stays_in_the_item():
    blocks = parse("- first\n\n  second\n- next")
    assert [(b.kind, b.text) for b in blocks] == [("item", "first\nsecond"), ("item", "next")]


def test_tables_are_aligned_monospace_lines_with_a_bold_header():
    (block,) = parse("| name | n |\n|:-----|--:|\n| **ab** | 7 |\n| c | 123 |")
    assert block.kind == "table"
    assert block.text.split("\n") == ["name │   n", "─────┼────", "ab   │   7", "c    │ 123"]
    assert {r.text for r in block.runs if r.bold} == {"name", "n", "ab"}


def test_strikethrough_escapes_entities_and_autolinks():
    (block,) = parse(r"~~old~~ new \*star\* &amp; <https://a.b/c>")
    assert block.text == "old new *star* & https://a.b/c"
    assert [r.text for r in block.runs if r.strike] == ["old"]
    assert [(r.text, r.link) for r in block.runs if r.link] == [("https://a.b/c", "https://a.b/c")]
    assert not any(r.italic for r in block.runs)


def test_underscores_never_mark_emphasis_but_stars_do():
    (block,) = parse("__init__ and _x_ and ***both***")
    assert block.text == "__init__ and _x_ and both"
    assert [(r.text, r.bold, r.italic) for r in block.runs if r.bold or r.italic] == [("both", True, True)]


def test_only_web_and_mail_links_are_links():
    (block,) = parse("[site](https://x.y) [mail](mailto:a@b.c) [file](notes.txt) [js](javascript:alert(1))")
    assert block.text == "site mail file [js](javascript:alert(1))"  # markdown-it refuses script links
    assert [r.link for r in block.runs if r.link] == ["https://x.y", "mailto:a@b.c"]


def test_raw_html_shows_as_text():
    blocks = parse("<div>\nhi <b>there</b>\n</div>")
    assert kinds(blocks) == ["paragraph"] and blocks[0].text == "<div>\nhi <b>there</b>\n</div>"


@pytest.mark.parametrize("source, shown_tinted", [
    ("## Ti⟦tle⟧ ##", "tle"),
    ("Set⟦ext⟧\n===", "ext"),
    ("- a\n  - b⟦ee⟧", "ee"),
    ("- two\n  mo⟦re⟧", "re"),
    ("1. ⟦1⟧", "1"),
    ("> quo⟦ted⟧\n> li⟦ne⟧", "tedne"),
    ("> > dee⟦p⟧", "p"),
    ("```py\nx = ⟦1⟧\n  y⟦⟦\n```", "1"),
    ("  ```\n  a⟦b⟧\n  ```", "b"),
    ("    in⟦dented⟧", "dented"),
    ("| ab | ⟦ab⟧ |\n|---|---|\n| ⟦c⟧ | ab |", "abc"),
    ("x ⟦**b⟧ol**d", "b"),
    ("*it⟦al⟧*", "al"),
    ("~~st⟦ri⟧ke~~", "ri"),
    ("`co⟦de⟧` and `` ⟦a`b⟧ ``", "dea`b"),
    ("[li⟦nk⟧](https://x.y) ⟦x⟧", "nkx"),
    ("![al⟦t⟧](https://x.y/p.png)", "t"),
    ("a \\⟦*⟧ b &amp; ⟦&lt;⟧", "*<"),
    ("a⟦\n⟧b", "\n"),
    ("a\r\nb⟦c⟧\r⟦d⟧", "cd"),
    ("ab ab ⟦ab⟧ *ab* ⟦ab⟧", "abab"),
])
def test_the_tint_follows_each_character_through_every_construct(source, shown_tinted):
    text, flags = marked(source)
    assert tinted(parse(text, flags)) == shown_tinted


def test_streaming_reads_the_same_blocks_as_a_whole_parse_at_every_length():
    text, flags = marked("# Plan\n\nSome ⟦**bold**⟧ text\nand more.\n\n- one\n- t⟦wo⟧\n\n  still two\n"
                         "  1. nested\n\n> a quote\ncontinued\n\n| a | b |\n|---|--:|\n| 1 | ⟦2⟧ |\n\n"
                         "```python\ndef f(x):\n    return ⟦x⟧\n```\nSetext\n---\n***\nEnd `code`.\n"
                         "A table ends\nthis paragraph:\n| x | y |\n|---|---|\n| ⟦3⟧ | 4 |\n"
                         "A line\n#\\ that is not a heading\n\n1. lazy\n\n1. numbering\n\nend\n")
    for step in (1, 7, 16):  # a character at a time, and tokens of several characters
        stream = Stream()
        for n in list(range(0, len(text), step)) + [len(text)]:
            assert stream.parse(text[:n], flags[:n]) == parse(text[:n], flags[:n]), text[:n]
    assert stream.parse("# Other", None) == parse("# Other")  # a new reply, not a longer one


def test_random_markdown_never_raises_and_streams_like_a_whole_parse():
    pieces = list("ab _*`~[]()!<>|#-+=.:\\&;\n\n\n   \t1") + [
        "```", "**", "](https://x)", "&amp;", "| --- |", "\r\n", "    ", "- ", "1. ", "> ", "é", "漢"]
    rng = random.Random(7)
    for _ in range(200):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 60)))
        flags = [rng.random() < 0.5 for _ in text]
        whole = parse(text, flags)
        stream = Stream()
        for n in range(0, len(text), 3):
            stream.parse(text[:n], flags[:n])
        assert stream.parse(text, flags) == whole, repr(text)


def drawn_characters(view):
    """Each character of the transcript with the formats that show its Markdown and its tint."""
    out = []
    block = view.transcript.document().begin()
    while block.isValid():
        iterator = block.begin()
        while not iterator.atEnd():
            fragment = iterator.fragment()
            fmt = fragment.charFormat()
            style = (fmt.fontWeight(), fmt.fontItalic(), fmt.fontStrikeOut(), fmt.anchorHref(),
                     tuple(fmt.fontFamilies() or ()), fmt.background().color().name())
            out.extend((ch, style) for ch in fragment.text())
            iterator += 1
        out.append(("\n", block.blockFormat().leftMargin()))
        block = block.next()
    return out


def test_a_streamed_reply_is_drawn_as_the_whole_reply_is(qtbot):
    pytest.importorskip("PySide6")
    from specdesk.ui.chat_view import ChatMessage, ChatView

    text = ("# Plan\n\nKeep ~~old~~ **new** `code` and [docs](https://d.e).\n\n1. one\n   - nested\n2. two\n\n"
            "| name | n |\n|:--|--:|\n| ab | 7 |\n| c | 123 |\n\n```py\ndef f(x):\n    return x\n```\n"
            "A line\n#\\ not a heading\n\n> quoted\n\nEnd.")
    pieces = [text[i:i + 5] for i in range(0, len(text), 5)]
    drafted = [n % 3 == 1 for n in range(len(pieces))]
    streamed = ChatView()
    qtbot.addWidget(streamed)
    streamed.add_message(ChatMessage("user", ["Plan it."], [False]))
    reply = streamed.add_message(ChatMessage("assistant"))
    for piece, flag in zip(pieces, drafted):
        streamed.append_pieces(reply, [piece], [flag])
        streamed.flush()
    streamed.end_reply(reply, "")
    whole = ChatView()
    qtbot.addWidget(whole)
    whole.set_messages([ChatMessage("user", ["Plan it."], [False]), ChatMessage("assistant", pieces, drafted)])
    assert drawn_characters(streamed) == drawn_characters(whole)
    from PySide6.QtGui import QTextTable

    (table,) = [f for f in streamed.transcript.document().rootFrame().childFrames() if isinstance(f, QTextTable)]
    cells = [[table.cellAt(r, c).firstCursorPosition().block().text() for c in range(table.columns())]
             for r in range(table.rows())]
    assert cells == [["name", "n"], ["ab", "7"], ["c", "123"]]  # a table is drawn as a table, cell by cell
    assert "".join(ch for ch, style in drawn_characters(streamed) if isinstance(style, tuple) and style[2]) == "old"


# --- highlighting, copy links, tables as cells -----------------------------------------------
def tokens(block):
    return [(r.text, r.token) for r in block.runs if r.token]


def test_fenced_code_is_highlighted_by_its_language():
    (block,) = parse('```python\ndef f(x):  # say "hi"\n    return "a # b", 0x1F\n```')
    assert tokens(block) == [("def", "keyword"), ('# say "hi"', "comment"), ("return", "keyword"),
                             ('"a # b"', "string"), ("0x1F", "number")]
    assert block.text == 'def f(x):  # say "hi"\n    return "a # b", 0x1F'
    (js,) = parse("```ts\nconst s = `x`; // done\n/* a\nb */ let n = 2\n```")
    assert tokens(js) == [("const", "keyword"), ("`x`", "string"), ("// done", "comment"),
                          ("/* a\nb */", "comment"), ("let", "keyword"), ("2", "number")]
    (sql,) = parse("```sql\nSELECT id FROM chats -- all\n```")
    assert tokens(sql) == [("SELECT", "keyword"), ("FROM", "keyword"), ("-- all", "comment")]
    (plain,) = parse("```\ndef f(): return 1\n```")  # no language: shown plain
    (unknown,) = parse("```brainfuck\n+[-]\n```")
    assert tokens(plain) == [] and tokens(unknown) == []


def test_an_unclosed_string_runs_to_the_end_while_streaming():
    (block,) = parse('```py\nx = """doc\nstill doc')
    assert tokens(block) == [('"""doc\nstill doc', "string")]


def test_highlighting_keeps_the_tint_of_every_character():
    text, flags = marked("```py\nre⟦turn \"ab⟧c\" # n⟦o⟧\n```")
    (block,) = parse(text, flags)
    assert [(r.text, r.token, r.drafted) for r in block.runs] == [
        ("re", "keyword", False), ("turn", "keyword", True), (" ", "", True), ('"ab', "string", True),
        ('c"', "string", False), (" ", "", False), ("# n", "comment", False), ("o", "comment", True)]


def test_code_blocks_are_numbered_and_copy_links_give_their_text_back():
    reply = "One:\n\n```py\nprint(1)\n```\n\nTwo:\n\n~~~\n  indented\n~~~\n\n    four spaces\n"
    blocks = parse(reply)
    assert [(b.kind, b.index) for b in blocks] == [("paragraph", -1), ("code", 0), ("paragraph", -1), ("code", 1),
                                                  ("code", 2)]
    assert code_blocks(reply) == ["print(1)", "  indented", "four spaces"]
    assert code_block_text(reply, 1) == "  indented" and code_block_text(reply, 3) == ""
    assert copy_href(2) == "copy:2" and parse_copy_href("copy:2") == (None, 2)
    assert copy_href(1, message_index=4) == "copy:4.1" and parse_copy_href("copy:4.1") == (4, 1)
    assert parse_copy_href("https://example.com") is None and parse_copy_href("copy:x") is None
    assert parse_copy_href("copy:1.x") is None
    stream = Stream()  # a streamed reply numbers its blocks as a whole parse does
    for n in range(0, len(reply) + 1, 4):
        assert [b.index for b in stream.parse(reply[:n])] == [b.index for b in parse(reply[:n])]


def test_tables_keep_their_cells_and_alignment():
    (block,) = parse("| name | n | note |\n|:-----|--:|:-:|\n| **ab** | 7 |\n| c | 123 | ok |")
    assert [[cell.text for cell in row] for row in block.rows] == [["name", "n", "note"], ["ab", "7", ""],
                                                                   ["c", "123", "ok"]]
    assert [cell.align for cell in block.rows[0]] == ["left", "right", "center"]
    assert block.rows[1][0].runs[0].bold and not block.rows[2][0].runs[0].bold
    text, flags = marked("| a | b |\n|---|---|\n| ⟦x⟧y | z |")
    (tinted_table,) = parse(text, flags)
    assert [(r.text, r.drafted) for r in tinted_table.rows[1][0].runs] == [("x", True), ("y", False)]
