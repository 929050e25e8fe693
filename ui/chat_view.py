"""The centre of the Chat tab: transcript with accepted-draft highlighting, input, buttons.

Replies are shown as Markdown (ui/markdown.py) with every character keeping its draft
flag. Streamed tokens are buffered by `append_pieces` and drawn by `flush()`, which the
window calls from its repaint timer: a fast model costs one document edit per frame, not
one per token, and only the reply's last Markdown block is redrawn (the blocks before it
cannot change any more).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import (QFont, QFontDatabase, QGuiApplication, QKeySequence, QShortcut, QTextBlockFormat,
                           QTextCharFormat, QTextCursor, QTextFormat, QTextLength)
from PySide6.QtWidgets import (QCheckBox, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QSizePolicy,
                               QTextBrowser, QVBoxLayout, QWidget)

from . import markdown, theme

HEADING_SCALE = {1: 1.45, 2: 1.3, 3: 1.15}


@dataclass
class ChatMessage:
    role: str  # "user" or "assistant"
    pieces: list[str] = field(default_factory=list)  # text per token (a user message is one piece)
    from_draft: list[bool] = field(default_factory=list)  # (len(pieces),)
    db_id: Optional[int] = None
    footer: str = ""  # numbers of the run, under a reply

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def draft_spans(self) -> list[list]:
        """Run-length [n_chars, from_draft] pairs: how highlighting is stored in history."""
        spans: list[list] = []
        for piece, drafted in zip(self.pieces, self.from_draft):
            if not piece:
                continue
            if spans and spans[-1][1] == drafted:
                spans[-1][0] += len(piece)
            else:
                spans.append([len(piece), drafted])
        return spans

    @classmethod
    def from_spans(cls, role: str, text: str, spans, db_id: Optional[int] = None, footer: str = "") -> "ChatMessage":
        pieces, flags, at = [], [], 0
        for span in spans or []:
            try:
                length, drafted = int(span[0]), bool(span[1])
            except (TypeError, ValueError, IndexError):
                break
            pieces.append(text[at:at + length])
            flags.append(drafted)
            at += length
        if at < len(text):  # spans missing or shorter than the text: the rest is plain
            pieces.append(text[at:])
            flags.append(False)
        return cls(role, pieces, flags, db_id, footer)


@dataclass
class _LiveReply:
    """Where the streaming reply's Markdown blocks sit in the document."""

    message: ChatMessage
    body_start: int  # document position where the reply's first block begins
    committed_blocks: int = 0  # blocks drawn that later text cannot change
    committed_pos: int = 0  # document position after them
    code: bool = False  # drawn as one bare-code block
    drawn: Optional[markdown.Block] = None  # the last block as drawn (it ends the document)
    stream: markdown.Stream = field(default_factory=markdown.Stream)  # re-reads only the last top-level blocks


def _extension(old: markdown.Block, new: markdown.Block) -> Optional[list[markdown.Run]]:
    """The runs to append when `new` is `old` with text added at its end; None otherwise."""
    if (old.kind, old.level, old.marker, old.lang) != (new.kind, new.level, new.marker, new.lang):
        return None
    if not old.runs:
        return list(new.runs)
    n = len(old.runs)
    if len(new.runs) < n or new.runs[: n - 1] != old.runs[: n - 1]:
        return None
    last_old, last_new = old.runs[-1], new.runs[n - 1]
    same_style = replace(last_old, text="") == replace(last_new, text="")
    if not same_style or not last_new.text.startswith(last_old.text):
        return None
    tail = last_new.text[len(last_old.text):]
    return ([replace(last_new, text=tail)] if tail else []) + list(new.runs[n:])


class ChatView(QWidget):
    send_requested = Signal(str)
    stop_requested = Signal()
    regenerate_requested = Signal()
    new_chat_requested = Signal()

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.messages: list[ChatMessage] = []
        self.highlight = True
        self._pending = False  # the live reply has text not drawn yet
        self._live: Optional[_LiveReply] = None

        self.transcript = QTextBrowser(self)
        self.transcript.setOpenExternalLinks(True)
        self.transcript.setPlaceholderText("Type a message below. Tokens the target accepted from the draft "
                                           "are highlighted as they stream in.")
        self._mono = QFontDatabase.systemFont(QFontDatabase.FixedFont)

        self.highlight_box = QCheckBox("Highlight", self)
        self.highlight_box.setToolTip("Tint the tokens the target accepted from the draft")
        self.highlight_box.setChecked(True)
        self.highlight_box.toggled.connect(self.set_highlight)
        self.legend = QLabel(self)
        self.legend.setWordWrap(True)  # a narrow window wraps it rather than growing
        self._update_legend()
        self.copy_button = QPushButton("Copy", self)
        self.copy_button.setToolTip("Copy the last reply to the clipboard")
        self.copy_button.clicked.connect(self.copy_last_reply)
        self.regenerate_button = QPushButton("Regenerate", self)
        self.regenerate_button.setToolTip("Answer the last message again")
        self.regenerate_button.clicked.connect(self.regenerate_requested)
        self.new_chat_button = QPushButton("New chat", self)
        self.new_chat_button.clicked.connect(self.new_chat_requested)
        tools = QHBoxLayout()
        tools.addWidget(self.highlight_box)
        tools.addWidget(self.legend, 1)  # the room between the check box and the buttons: one line when it fits
        for button in (self.copy_button, self.regenerate_button, self.new_chat_button):
            tools.addWidget(button)

        self.input = QPlainTextEdit(self)
        self.input.setPlaceholderText("Message (Ctrl+Enter to send)")
        self.input.setFixedHeight(72)
        self.send_button = QPushButton("Send", self)
        self.send_button.setDefault(True)
        self.send_button.clicked.connect(self._send)
        self.stop_button = QPushButton("Stop", self)
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.stop_requested)
        for button in (self.send_button, self.stop_button):
            button.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Expanding)
        QShortcut(QKeySequence("Ctrl+Return"), self.input, activated=self._send)
        QShortcut(QKeySequence(Qt.Key_Escape), self, activated=self.stop_requested)
        row = QHBoxLayout()
        row.addWidget(self.input, 1)
        row.addWidget(self.send_button)
        row.addWidget(self.stop_button)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.transcript, 1)
        layout.addLayout(tools)
        layout.addLayout(row)

    # --- state --------------------------------------------------------------------
    def set_generating(self, generating: bool, can_send: bool = True) -> None:
        self.send_button.setEnabled(can_send and not generating)
        self.stop_button.setEnabled(generating)
        self.regenerate_button.setEnabled(can_send and not generating and self.last_user_index() is not None)
        self.new_chat_button.setEnabled(True)

    def last_user_index(self) -> Optional[int]:
        for i in range(len(self.messages) - 1, -1, -1):
            if self.messages[i].role == "user":
                return i
        return None

    def _send(self) -> None:
        text = self.input.toPlainText().strip()
        if text and self.send_button.isEnabled():
            self.input.clear()
            self.send_requested.emit(text)

    def copy_last_reply(self) -> None:
        for message in reversed(self.messages):
            if message.role == "assistant":
                QGuiApplication.clipboard().setText(message.text)
                return

    # --- content --------------------------------------------------------------------
    def set_messages(self, messages: list[ChatMessage]) -> None:
        self.messages = list(messages)
        self._pending = False
        self._render_all()

    def add_message(self, message: ChatMessage) -> ChatMessage:
        self.flush()
        self.messages.append(message)
        cursor = self._end_cursor()
        self._render_message(cursor, message, first=len(self.messages) == 1)
        self._scroll_to_end()
        return message

    def remove_last(self) -> Optional[ChatMessage]:
        if not self.messages:
            return None
        message = self.messages.pop()
        self._pending = False
        self._render_all()
        return message

    def append_pieces(self, message: ChatMessage, pieces, from_draft) -> None:
        """Add streamed tokens to a reply; if it is the one on screen, they show at the next flush()."""
        message.pieces.extend(pieces)
        message.from_draft.extend(from_draft)
        if self.showing(message):
            self._pending = True

    def showing(self, message: ChatMessage) -> bool:
        return bool(self.messages) and self.messages[-1] is message

    def flush(self) -> bool:
        live = self._live
        if not self._pending or live is None or not self.showing(live.message):
            self._pending = False
            return False
        follow = self._at_end()
        message = live.message
        blocks = live.stream.parse(message.text, markdown.char_flags(message.pieces, message.from_draft))
        code = len(blocks) == 1 and blocks[0].kind == "code" and not blocks[0].lang and markdown.looks_like_code(
            message.text)
        if code != live.code or live.committed_blocks >= len(blocks):
            live.committed_blocks, live.committed_pos, live.code, live.drawn = 0, live.body_start, code, None
        pending = blocks[live.committed_blocks:]
        grown = _extension(live.drawn, pending[0]) if live.drawn is not None and pending else None
        if grown is not None:  # the usual case: text was added to the last block
            cursor = self._end_cursor()
            self._insert_runs(cursor, pending[0], grown)
            starts = [live.committed_pos] + self._render_blocks(cursor, pending[1:])
        else:
            cursor = QTextCursor(self.transcript.document())
            cursor.setPosition(live.committed_pos)
            cursor.movePosition(QTextCursor.End, QTextCursor.KeepAnchor)
            cursor.removeSelectedText()
            starts = self._render_blocks(cursor, pending)
        if starts:
            live.committed_pos = starts[-1]
            live.committed_blocks = len(blocks) - 1
            live.drawn = blocks[-1]
        self._pending = False
        if follow:
            self._scroll_to_end()
        return True

    def end_reply(self, message: ChatMessage, footer: str) -> None:
        message.footer = footer
        if self.showing(message):
            self._pending = True
            self.flush()
            self._live = None
            self._render_footer(self._end_cursor(), footer)
            self._scroll_to_end()

    def set_highlight(self, on: bool) -> None:
        self.highlight = on
        if self.highlight_box.isChecked() != on:
            self.highlight_box.setChecked(on)
        self._render_all()

    def plain_text(self) -> str:
        return self.transcript.toPlainText()

    # --- rendering ------------------------------------------------------------------
    def _update_legend(self) -> None:
        tint = theme.draft_tint(self.palette()).name()
        self.legend.setText(f'<span style="background:{tint}">&nbsp;accepted draft token&nbsp;</span>'
                            f'&nbsp; target token')
        self.legend.setToolTip("Tinted: drafted, then accepted by the target's verification pass (a token the "
                               "target did not have to generate on its own). Plain: the target's own token.")

    def _end_cursor(self) -> QTextCursor:
        cursor = QTextCursor(self.transcript.document())
        cursor.movePosition(QTextCursor.End)
        return cursor

    def _at_end(self) -> bool:
        bar = self.transcript.verticalScrollBar()
        return bar.value() >= bar.maximum() - 4

    def _scroll_to_end(self) -> None:
        bar = self.transcript.verticalScrollBar()
        bar.setValue(bar.maximum())

    def _header_format(self) -> QTextCharFormat:
        fmt = QTextCharFormat()
        fmt.setFontWeight(QFont.Bold)
        fmt.setForeground(theme.accent(self.palette()))
        return fmt

    def _body_format(self, role: str, drafted: bool) -> QTextCharFormat:
        fmt = QTextCharFormat()
        fmt.setForeground(self.palette().text().color())
        if drafted and self.highlight:
            fmt.setBackground(theme.draft_tint(self.palette()))
        return fmt

    def _render_footer(self, cursor: QTextCursor, footer: str) -> None:
        if not footer:
            return
        fmt = QTextCharFormat()
        fmt.setForeground(theme.muted(self.palette()))
        fmt.setFontItalic(True)
        cursor.insertBlock(QTextBlockFormat())
        cursor.insertText(footer, fmt)

    def _render_message(self, cursor: QTextCursor, message: ChatMessage, first: bool) -> None:
        if not first:
            cursor.insertBlock(QTextBlockFormat())
            cursor.insertBlock(QTextBlockFormat())
        cursor.insertText("You" if message.role == "user" else "Model", self._header_format())
        if message.role == "user":
            cursor.insertBlock(QTextBlockFormat())
            cursor.insertText(message.text.replace("\n", "\u2028"), self._body_format("user", False))
            self._live = None
            return
        live = _LiveReply(message, cursor.position())
        live.committed_pos = live.body_start
        blocks = live.stream.parse(message.text, markdown.char_flags(message.pieces, message.from_draft))
        self._render_blocks(cursor, blocks)
        if message.footer:
            self._render_footer(cursor, message.footer)
            self._live = None
        else:
            self._live = live
            self._pending = bool(message.pieces)

    def _render_blocks(self, cursor: QTextCursor, blocks: list[markdown.Block]) -> list[int]:
        """Draw Markdown blocks at the cursor; returns the document position each one starts at."""
        starts = []
        for block in blocks:
            starts.append(cursor.position())
            fmt, base = self._block_formats(block)
            cursor.insertBlock(fmt, base)
            if block.kind == "item":
                cursor.insertText(block.marker + " ", base)
            self._insert_runs(cursor, block, runs=block.runs, formats=(fmt, base))
        return starts

    def _insert_runs(self, cursor: QTextCursor, block: markdown.Block, runs, formats=None) -> None:
        """Code lines become document blocks of their own, so appending to a long listing lays
        out only its last line; elsewhere a line break stays inside the paragraph."""
        fmt, base = formats or self._block_formats(block)
        for run in runs:
            char_format = self._run_format(base, run)
            if block.kind not in ("code", "table"):
                cursor.insertText(run.text.replace("\n", "\u2028"), char_format)
                continue
            for n, line in enumerate(run.text.split("\n")):
                if n:
                    cursor.insertBlock(fmt, base)
                if line:
                    cursor.insertText(line, char_format)

    def _block_formats(self, block: markdown.Block) -> tuple[QTextBlockFormat, QTextCharFormat]:
        palette = self.palette()
        fmt = QTextBlockFormat()
        fmt.setTopMargin(3)
        fmt.setBottomMargin(3)
        base = QTextCharFormat()
        base.setForeground(palette.text().color())
        if block.kind in ("code", "table"):  # one document block per line: no gaps between them
            fmt.setTopMargin(0)
            fmt.setBottomMargin(0)
            fmt.setBackground(theme.code_background(palette))
            fmt.setLeftMargin(6)
            fmt.setRightMargin(6)
            fmt.setNonBreakableLines(True)
            base.setFont(self._mono)
        elif block.kind == "heading":
            base.setFontWeight(QFont.Bold)
            base.setFontPointSize(self.font().pointSizeF() * HEADING_SCALE.get(block.level, 1.0))
        elif block.kind == "item":
            fmt.setLeftMargin(22 + 18 * block.level)
            fmt.setTextIndent(-16 if block.marker == "•" else -22)
            fmt.setTopMargin(0)
            fmt.setBottomMargin(0)
        elif block.kind == "quote":
            fmt.setLeftMargin(18)
            base.setForeground(theme.muted(palette))
            base.setFontItalic(True)
        elif block.kind == "rule":
            fmt.setProperty(QTextFormat.BlockTrailingHorizontalRulerWidth,
                            QTextLength(QTextLength.PercentageLength, 100))
        return fmt, base

    def _run_format(self, base: QTextCharFormat, run: markdown.Run) -> QTextCharFormat:
        fmt = QTextCharFormat(base)
        if run.bold:
            fmt.setFontWeight(QFont.Bold)
        if run.italic:
            fmt.setFontItalic(True)
        if run.strike:
            fmt.setFontStrikeOut(True)
        if run.code:
            fmt.setFontFamilies(self._mono.families())
            fmt.setBackground(theme.code_background(self.palette()))
        if run.link:
            fmt.setAnchor(True)
            fmt.setAnchorHref(run.link)
            fmt.setForeground(theme.accent(self.palette()))
            fmt.setFontUnderline(True)
        if run.drafted and self.highlight:
            fmt.setBackground(theme.draft_tint(self.palette()))
        return fmt

    def _render_all(self) -> None:
        self.transcript.clear()
        self._live = None
        cursor = self._end_cursor()
        for i, message in enumerate(self.messages):
            self._render_message(cursor, message, first=i == 0)
        self._pending = False
        self._scroll_to_end()
