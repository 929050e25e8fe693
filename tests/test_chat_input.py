"""The message box: Enter sends, Shift+Enter starts a new line (offscreen, real key events)."""

from __future__ import annotations

from PySide6.QtCore import Qt

from specdesk.ui.chat_input import ChatInput, is_send_key


def make_input(qtbot) -> tuple[ChatInput, list[str]]:
    box = ChatInput()
    qtbot.addWidget(box)
    sent: list[str] = []
    box.send.connect(sent.append)
    return box, sent


def test_enter_sends_and_clears(qtbot):
    box, sent = make_input(qtbot)
    qtbot.keyClicks(box, "  sort a list ")
    qtbot.keyClick(box, Qt.Key_Return)
    assert sent == ["sort a list"] and box.toPlainText() == ""
    qtbot.keyClicks(box, "again")
    qtbot.keyClick(box, Qt.Key_Enter, Qt.KeypadModifier)  # the keypad's Enter
    qtbot.keyClicks(box, "and once more")
    qtbot.keyClick(box, Qt.Key_Return, Qt.ControlModifier)
    assert sent == ["sort a list", "again", "and once more"]


def test_shift_enter_starts_a_new_line(qtbot):
    box, sent = make_input(qtbot)
    qtbot.keyClicks(box, "def f():")
    qtbot.keyClick(box, Qt.Key_Return, Qt.ShiftModifier)
    qtbot.keyClicks(box, "    return 1")
    assert sent == [] and box.toPlainText() == "def f():\n    return 1"
    qtbot.keyClick(box, Qt.Key_Return)
    assert sent == ["def f():\n    return 1"]


def test_nothing_is_sent_when_blank_or_while_sending_is_off(qtbot):
    box, sent = make_input(qtbot)
    qtbot.keyClick(box, Qt.Key_Return)
    qtbot.keyClicks(box, "   ")
    qtbot.keyClick(box, Qt.Key_Return)
    assert sent == []
    box.clear()
    box.set_can_send(False)  # a reply is being generated: the text waits
    qtbot.keyClicks(box, "next question")
    qtbot.keyClick(box, Qt.Key_Return)
    assert sent == [] and box.toPlainText() == "next question"
    box.set_can_send(True)
    assert box.submit() and sent == ["next question"]


def test_which_keys_send():
    assert is_send_key(Qt.Key_Return, Qt.NoModifier) and is_send_key(Qt.Key_Enter, Qt.KeypadModifier)
    assert not is_send_key(Qt.Key_Return, Qt.ShiftModifier) and not is_send_key(Qt.Key_A, Qt.NoModifier)
    assert not is_send_key(Qt.Key_Return, Qt.AltModifier)
