"""Tables drawn as tables, code tokens in color and copy links, in a real QTextDocument (offscreen)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QTextCharFormat, QTextCursor, QTextDocument
from PySide6.QtWidgets import QTextBrowser

from specdesk.ui import highlight
from specdesk.ui.markdown import code_block_text, parse, parse_copy_href
from specdesk.ui.rich_text import insert_copy_link, insert_table, with_token_color

TINT = QColor("#ffe9a8")


def run_format(run) -> QTextCharFormat:
    fmt = QTextCharFormat()
    if run.bold:
        fmt.setFontWeight(QFont.Bold)
    if run.drafted:
        fmt.setBackground(TINT)
    return fmt


def test_a_table_is_drawn_as_a_table_with_its_alignment_and_tint(qtbot):
    text = "| name | n |\n|:--|--:|\n| ab | 7 |\n| c | 123 |"
    flags = [False] * len(text)
    flags[text.index("123")] = True
    (block,) = parse(text, flags)
    document = QTextDocument()
    cursor = QTextCursor(document)
    insert_table(cursor, block, run_format, QColor("#888888"))
    cursor.insertText("after")
    table = QTextCursor(document.findBlockByNumber(1)).currentTable()
    assert table is not None and (table.rows(), table.columns()) == (3, 2)
    cells = [[table.cellAt(r, c).firstCursorPosition().block().text() for c in range(2)] for r in range(3)]
    assert cells == [["name", "n"], ["ab", "7"], ["c", "123"]]
    header = table.cellAt(0, 0).firstCursorPosition()
    header.movePosition(QTextCursor.NextCharacter)
    assert header.charFormat().fontWeight() == QFont.Bold
    assert table.cellAt(2, 1).firstCursorPosition().blockFormat().alignment() & Qt.AlignRight
    assert table.cellAt(2, 0).firstCursorPosition().blockFormat().alignment() & Qt.AlignLeft
    tinted = table.cellAt(2, 1).firstCursorPosition()
    tinted.movePosition(QTextCursor.NextCharacter)
    assert tinted.charFormat().background().color() == TINT
    assert document.toPlainText().endswith("after")  # the cursor went on after the table
    assert QTextCursor(document.findBlock(document.characterCount() - 2)).currentTable() is None


def test_code_tokens_take_their_color_on_light_and_dark_backgrounds():
    (block,) = parse("```py\nreturn x\n```")
    keyword, plain = block.runs
    assert with_token_color(QTextCharFormat(), keyword, dark=False).foreground().color().name() == \
        highlight.TOKEN_COLORS["keyword"][0]
    assert with_token_color(QTextCharFormat(), keyword, dark=True).foreground().color().name() == \
        highlight.TOKEN_COLORS["keyword"][1]
    assert not with_token_color(QTextCharFormat(), plain, dark=False).hasProperty(QTextCharFormat.ForegroundBrush)


def test_a_copy_link_names_its_block_and_gives_its_text_back(qtbot):
    reply = "```sh\necho one\n```\n\n```py\nprint(2)\n```"
    browser = QTextBrowser()
    qtbot.addWidget(browser)
    cursor = QTextCursor(browser.document())
    insert_copy_link(cursor, block_index=1, message_index=3, fmt=QTextCharFormat())
    cursor.movePosition(QTextCursor.Start)
    cursor.movePosition(QTextCursor.NextCharacter)
    href = cursor.charFormat().anchorHref()
    assert browser.toPlainText() == "Copy" and href == "copy:3.1"
    message, block = parse_copy_href(href)
    assert message == 3 and code_block_text(reply, block) == "print(2)"
