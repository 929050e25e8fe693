"""The message box under the chat: Enter sends, Shift+Enter starts a new line.

Ctrl+Enter sends too (it did before Enter did). While sending is off (a reply is being
generated, or no model is loaded) Enter keeps the text where it is, so nothing typed is lost.
"""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QWidget

PLACEHOLDER = "Message (Enter to send, Shift+Enter for a new line)"


def is_send_key(key: int, modifiers: Qt.KeyboardModifier) -> bool:
    """Enter or Return without Shift (and without Alt or Meta, which other shortcuts use)."""
    if key not in (Qt.Key_Return, Qt.Key_Enter):
        return False
    return not modifiers & (Qt.ShiftModifier | Qt.AltModifier | Qt.MetaModifier)


class ChatInput(QPlainTextEdit):
    send = Signal(str)  # the message, stripped of surrounding blank space; never empty

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.setPlaceholderText(PLACEHOLDER)
        self.setTabChangesFocus(True)  # Tab moves on to the Send button instead of typing a tab
        self._can_send = True

    def set_can_send(self, can_send: bool) -> None:
        self._can_send = can_send

    @property
    def can_send(self) -> bool:
        return self._can_send

    def submit(self) -> bool:
        """Send the text (what Enter and a Send button do); False when there is nothing to send
        or sending is off, and the text then stays."""
        text = self.toPlainText().strip()
        if not text or not self._can_send:
            return False
        self.clear()
        self.send.emit(text)
        return True

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if is_send_key(event.key(), event.modifiers()):
            self.submit()
            event.accept()
            return
        if event.key() in (Qt.Key_Return, Qt.Key_Enter) and event.modifiers() & Qt.ShiftModifier:
            self.insertPlainText("\n")  # a plain newline, not a paragraph break with Shift's line separator
            event.accept()
            return
        super().keyPressEvent(event)
