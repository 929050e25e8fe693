"""Markdown blocks into a QTextDocument where plain runs are not enough: tables as tables,
code tokens in their colors, and a code block's "Copy" link.

The chat view keeps the formats of its runs (draft tint, bold, links); these helpers take
them from it as a function of the run, so a table cell shows the same tint as a paragraph.
"""

from __future__ import annotations

from typing import Callable

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor, QTextCharFormat, QTextCursor, QTextFrameFormat, QTextLength, QTextTableFormat

from . import highlight
from .markdown import Block, Run, copy_href

ALIGNMENT = {"left": Qt.AlignLeft, "center": Qt.AlignHCenter, "right": Qt.AlignRight, "": Qt.AlignLeft}


def with_token_color(fmt: QTextCharFormat, run: Run, dark: bool) -> QTextCharFormat:
    """`fmt` in the color of the run's code token (unchanged for text that is not a token)."""
    color = highlight.token_color(run.token, dark)
    if color:
        fmt = QTextCharFormat(fmt)
        fmt.setForeground(QColor(color))
    return fmt


def insert_table(cursor: QTextCursor, block: Block, run_format: Callable[[Run], QTextCharFormat],
                 border: QColor) -> None:
    """A table block as a QTextTable at the cursor, header row bold (from the runs), each
    column aligned as the Markdown says; the cursor ends after the table."""
    rows = block.rows
    columns = max((len(row) for row in rows), default=0)
    if not rows or not columns:
        return
    table_format = QTextTableFormat()
    table_format.setBorderStyle(QTextFrameFormat.BorderStyle_Solid)
    table_format.setBorder(1)
    table_format.setBorderBrush(QBrush(border))
    table_format.setBorderCollapse(True)
    table_format.setCellPadding(4)
    table_format.setCellSpacing(0)
    table_format.setHeaderRowCount(1)
    table_format.setWidth(QTextLength(QTextLength.VariableLength, 0))
    table = cursor.insertTable(len(rows), columns, table_format)
    for r, row in enumerate(rows):
        for c, cell in enumerate(row):
            cell_cursor = table.cellAt(r, c).firstCursorPosition()
            block_format = cell_cursor.blockFormat()
            block_format.setAlignment(ALIGNMENT.get(cell.align, Qt.AlignLeft))
            cell_cursor.setBlockFormat(block_format)
            for run in cell.runs:
                cell_cursor.insertText(run.text.replace("\n", " "), run_format(run))
    cursor.setPosition(table.lastPosition() + 1)


def insert_copy_link(cursor: QTextCursor, block_index: int, message_index: int, fmt: QTextCharFormat,
                     label: str = "Copy") -> None:
    """A "Copy" link for code block `block_index` of message `message_index` (markdown.copy_href)."""
    link = QTextCharFormat(fmt)
    link.setAnchor(True)
    link.setAnchorHref(copy_href(block_index, message_index))
    link.setFontUnderline(True)
    link.setToolTip("Copy this code block")
    cursor.insertText(label, link)
