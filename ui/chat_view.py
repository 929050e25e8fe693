"""The centre of the Chat tab: transcript with accepted-draft highlighting, input, buttons.

Replies are shown as Markdown (ui/markdown.py) with every character keeping its draft
flag: code tokens in their colors, tables as tables, and a "Copy" link over each code
block. Under each message a line of links acts on it: Copy and Regenerate for a reply,
Edit for the user's message, and "‹ 2/3 ›" to step through a message's alternatives (the
chat's branches, app/storage/history.py). The chat controller (app/runtime/chat_controller.py)
does what they ask, through the window, and this view draws its transcript (it is the
controller's `ChatDisplay`). Enter sends (ui/chat_input.py).

Streamed tokens are marked by `reply_grew` (or added by `append_pieces`) and drawn by
`flush()`, which the window calls from its repaint timer: a fast model costs one document
edit per frame, not one per token, and only the reply's last Markdown block is redrawn (the
blocks before it cannot change any more).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import (QDesktopServices, QFont, QFontDatabase, QGuiApplication, QKeySequence, QShortcut,
                           QTextBlockFormat, QTextCharFormat, QTextCursor, QTextFormat, QTextLength)
from PySide6.QtWidgets import (QCheckBox, QHBoxLayout, QLabel, QPushButton, QSizePolicy, QTextBrowser, QVBoxLayout,
                               QWidget)

from specdesk.app.runtime.chat_controller import ChatMessage

from . import markdown, theme
from .chat_input import ChatInput
from .rich_text import insert_copy_link, insert_table, with_token_color

HEADING_SCALE = {1: 1.45, 2: 1.3, 3: 1.15}
ACTION_SCHEME = "message:"  # links under a message: message:<action>:<index in the transcript>
ACTIONS = ("copy", "regenerate", "edit", "previous", "next")


def action_href(action: str, index: int) -> str:
    return f"{ACTION_SCHEME}{action}:{index}"


def parse_action_href(href: str) -> Optional[tuple[str, int]]:
    """(action, message index) from an `action_href` link; None for any other link."""
    if not href.startswith(ACTION_SCHEME):
        return None
    action, _, index = href[len(ACTION_SCHEME):].partition(":")
    if action not in ACTIONS or not index.isdigit():
        return None
    return action, int(index)


def message_actions(role: str, alternative: int, alternatives: int) -> list[tuple[str, str]]:
    """The (action, label) links under a finished message: its place among its alternatives
    first (when it has any), then what can be done with it."""
    links = []
    if alternatives > 1:
        if alternative > 0:
            links.append(("previous", "‹"))
        links.append(("", f"{alternative + 1}/{alternatives}"))
        if alternative < alternatives - 1:
            links.append(("next", "›"))
    links += [("copy", "Copy"), ("regenerate", "Regenerate")] if role == "assistant" else [("edit", "Edit")]
    return links


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
    if new.kind == "table":  # a new cell can widen any column: the table is drawn again
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
    regenerate_requested = Signal()  # the last reply
    regenerate_at = Signal(int)  # the reply at this index of `messages`
    edit_requested = Signal(int)  # the user's message at this index
    switch_requested = Signal(int, int)  # (index, -1 or +1): show the message's previous or next alternative
    new_chat_requested = Signal()

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.messages: list[ChatMessage] = []
        self.highlight = True
        self._pending = False  # the live reply has text not drawn yet
        self._live: Optional[_LiveReply] = None

        self.transcript = QTextBrowser(self)
        self.transcript.setOpenLinks(False)  # every link is handled by _link_clicked
        self.transcript.anchorClicked.connect(self._link_clicked)
        # One short line: a rich text box draws its placeholder unwrapped, and the legend under
        # the transcript says what the tint means.
        self.transcript.setPlaceholderText("Type a message below.")
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

        self.input = ChatInput(self)
        self.input.setFixedHeight(72)
        self.input.send.connect(self.send_requested)
        self.send_button = QPushButton("Send", self)
        self.send_button.setDefault(True)
        self.send_button.clicked.connect(self.input.submit)
        self.stop_button = QPushButton("Stop", self)
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.stop_requested)
        for button in (self.send_button, self.stop_button):
            button.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Expanding)
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
        self.input.set_can_send(can_send and not generating)
        self.stop_button.setEnabled(generating)
        self.regenerate_button.setEnabled(can_send and not generating and self.last_user_index() is not None)
        self.new_chat_button.setEnabled(True)

    def last_user_index(self) -> Optional[int]:
        for i in range(len(self.messages) - 1, -1, -1):
            if self.messages[i].role == "user":
                return i
        return None

    def copy_last_reply(self) -> None:
        for index in range(len(self.messages) - 1, -1, -1):
            if self.messages[index].role == "assistant":
                self.copy_message(index)
                return

    def copy_message(self, index: int) -> None:
        QGuiApplication.clipboard().setText(self.messages[index].text)

    def copy_code_block(self, message_index: int, block_index: int) -> None:
        QGuiApplication.clipboard().setText(markdown.code_block_text(self.messages[message_index].text, block_index))

    def _link_clicked(self, url: QUrl) -> None:
        """A code block's Copy, a message's action, or a link in a reply (opened by the system)."""
        href = url.toString()
        copy = markdown.parse_copy_href(href)
        action = parse_action_href(href)
        if copy is not None:
            message, block = copy
            if message is not None and message < len(self.messages):
                self.copy_code_block(message, block)
        elif action is not None:
            name, index = action
            if index >= len(self.messages):
                return
            if name == "copy":
                self.copy_message(index)
            elif name == "regenerate":
                self.regenerate_at.emit(index)
            elif name == "edit":
                self.edit_requested.emit(index)
            else:
                self.switch_requested.emit(index, -1 if name == "previous" else 1)
        elif url.scheme() in ("http", "https", "mailto"):
            QDesktopServices.openUrl(url)

    # --- content --------------------------------------------------------------------
    def set_messages(self, messages: list[ChatMessage]) -> None:
        self.messages = list(messages)
        self._pending = False
        self._render_all()

    def add_message(self, message: ChatMessage) -> ChatMessage:
        self.flush()
        self.messages.append(message)
        cursor = self._end_cursor()
        self._render_message(cursor, message, len(self.messages) - 1)
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
        self.reply_grew(message)

    def reply_grew(self, message: ChatMessage) -> None:
        """A reply got tokens (the chat controller added them): shown at the next flush() if on screen."""
        if self.showing(message):
            self._pending = True

    def offer_input(self, text: str) -> bool:
        """A rolled-back turn's text back in the input, unless something was typed there since."""
        if self.input.toPlainText().strip():
            return False
        self.input.setPlainText(text)
        return True

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
            starts = [live.committed_pos] + self._render_blocks(cursor, pending[1:], len(self.messages) - 1)
        else:
            cursor = QTextCursor(self.transcript.document())
            cursor.setPosition(live.committed_pos)
            kept = cursor.blockFormat()  # the line the redrawn blocks follow (after a table, its own)
            cursor.movePosition(QTextCursor.End, QTextCursor.KeepAnchor)
            cursor.removeSelectedText()
            cursor.setBlockFormat(kept)
            starts = self._render_blocks(cursor, pending, len(self.messages) - 1)
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
            if footer:  # a finished reply, as _render_message draws one
                cursor = self._end_cursor()
                self._render_footer(cursor, footer)
                self._render_actions(cursor, len(self.messages) - 1)
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

    def _render_actions(self, cursor: QTextCursor, index: int) -> None:
        """The line of links under a finished message (message_actions)."""
        message = self.messages[index]
        fmt = QTextCharFormat()
        fmt.setForeground(theme.muted(self.palette()))
        cursor.insertBlock(QTextBlockFormat())
        for n, (action, label) in enumerate(message_actions(message.role, message.alternative, message.alternatives)):
            if n:
                cursor.insertText("  ", fmt)
            if not action:
                cursor.insertText(label, fmt)
                continue
            link = QTextCharFormat(fmt)
            link.setAnchor(True)
            link.setAnchorHref(action_href(action, index))
            link.setForeground(theme.accent(self.palette()))
            cursor.insertText(label, link)

    def _render_message(self, cursor: QTextCursor, message: ChatMessage, index: int) -> None:
        """Message `index` of `messages` at the cursor (the first one without the gap above it)."""
        if index:
            cursor.insertBlock(QTextBlockFormat())
            cursor.insertBlock(QTextBlockFormat())
        cursor.insertText("You" if message.role == "user" else "Model", self._header_format())
        if message.role == "user":
            cursor.insertBlock(QTextBlockFormat())
            cursor.insertText(message.text.replace("\n", "\u2028"), self._body_format("user", False))
            if message.db_id is not None:
                self._render_actions(cursor, index)
            self._live = None
            return
        live = _LiveReply(message, cursor.position())
        live.committed_pos = live.body_start
        blocks = live.stream.parse(message.text, markdown.char_flags(message.pieces, message.from_draft))
        self._render_blocks(cursor, blocks, index)
        if message.footer:
            self._render_footer(cursor, message.footer)
            self._render_actions(cursor, index)
            self._live = None
        else:
            self._live = live
            self._pending = bool(message.pieces)

    def _render_blocks(self, cursor: QTextCursor, blocks: list[markdown.Block], message_index: int) -> list[int]:
        """Draw Markdown blocks of message `message_index` at the cursor; returns the document
        position each one starts at. A code block has its "Copy" link on a line above it."""
        starts = []
        for block in blocks:
            starts.append(cursor.position())
            fmt, base = self._block_formats(block)
            if block.kind == "table":
                cursor.insertBlock(QTextBlockFormat(), base)
                insert_table(cursor, block, lambda run, base=base: self._run_format(base, run),
                             theme.muted(self.palette()))
                continue
            if block.kind == "code" and block.index >= 0:
                link_line = QTextBlockFormat()
                link_line.setTopMargin(3)
                cursor.insertBlock(link_line, base)
                link = QTextCharFormat()
                link.setForeground(theme.accent(self.palette()))
                insert_copy_link(cursor, block.index, message_index, link)
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
        if run.token:
            fmt = with_token_color(fmt, run, theme.is_dark(self.palette()))
        if run.drafted and self.highlight:
            fmt.setBackground(theme.draft_tint(self.palette()))
        return fmt

    def _render_all(self) -> None:
        self.transcript.clear()
        self._live = None
        cursor = self._end_cursor()
        for i, message in enumerate(self.messages):
            self._render_message(cursor, message, i)
        self._pending = False
        self._scroll_to_end()
