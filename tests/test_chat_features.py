"""The chat's everyday features in the window, driven with pytest-qt on the small demo family
(real llama.cpp, real Qt offscreen): branches from an edited message or a regenerated reply,
a system prompt per chat, Enter to send, the chat list's rename, search and export, copy
links, code colors and tables."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")
pytest.importorskip("pytestqt")

from PySide6.QtCore import QUrl, Qt  # noqa: E402
from PySide6.QtGui import QGuiApplication, QTextTable  # noqa: E402

from specdesk.app.storage.history import History  # noqa: E402
from specdesk.ui import highlight, markdown, theme  # noqa: E402
from specdesk.ui.chat_view import ChatMessage, ChatView, action_href, message_actions, parse_action_href  # noqa: E402

from test_ui import dialogs, no_threads_or_timers_left, open_window, user_dirs, wait_for  # noqa: E402,F401

CODE_REPLY = "Like this:\n\n```python\ndef add(a, b):\n    return a + b\n```\n\nand then:\n\n```\nls -l\n```\n"
TABLE_REPLY = "| name | size |\n|:-----|-----:|\n| a | 1 |\n| bb | 22 |\n"


def anchors(view: ChatView) -> list[str]:
    """Every link in the transcript, in order."""
    hrefs = []
    block = view.transcript.document().begin()
    while block.isValid():
        iterator = block.begin()
        while not iterator.atEnd():
            fmt = iterator.fragment().charFormat()
            if fmt.isAnchor() and (not hrefs or hrefs[-1] != fmt.anchorHref()):
                hrefs.append(fmt.anchorHref())
            iterator += 1
        block = block.next()
    return hrefs


def click(view: ChatView, href: str) -> None:
    assert href in anchors(view), f"{href} is not shown; links: {anchors(view)}"
    view.transcript.anchorClicked.emit(QUrl(href))


def reply_to(qtbot, window, act):
    """Run `act` (which starts a reply) and wait for the reply's outcome."""
    with wait_for(qtbot, window, "chat") as blocker:
        assert act() is not None
    qtbot.wait(60)  # two repaint ticks
    return blocker.args[0].value


def send(qtbot, window, text: str):
    window.chat_view.input.setPlainText(text)
    return reply_to(qtbot, window, lambda: window.chat_view.send_button.click() or window.chat.turn)


# --- pure pieces -------------------------------------------------------------------------


def test_message_actions_and_their_links():
    assert message_actions("assistant", 0, 1) == [("copy", "Copy"), ("regenerate", "Regenerate")]
    assert message_actions("user", 0, 1) == [("edit", "Edit")]
    assert message_actions("user", 0, 2) == [("", "1/2"), ("next", "›"), ("edit", "Edit")]
    assert message_actions("assistant", 2, 3)[:3] == [("previous", "‹"), ("", "3/3"), ("copy", "Copy")]
    assert message_actions("assistant", 1, 3)[:3] == [("previous", "‹"), ("", "2/3"), ("next", "›")]
    assert parse_action_href(action_href("regenerate", 12)) == ("regenerate", 12)
    assert parse_action_href("message:explode:1") is None
    assert parse_action_href("message:copy:x") is None
    assert parse_action_href("https://example.com") is None


# --- the transcript alone ------------------------------------------------------------------


def test_code_blocks_get_colors_and_copy_links_that_copy_them(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.set_messages([ChatMessage("user", ["show me"], [False], db_id=1),
                       ChatMessage.from_spans("assistant", CODE_REPLY, None, 2, "done")])
    links = anchors(view)
    assert [h for h in links if h.startswith("copy:")] == ["copy:1.0", "copy:1.1"]
    for n, expected in enumerate(("def add(a, b):\n    return a + b", "ls -l")):
        QGuiApplication.clipboard().clear()
        click(view, f"copy:1.{n}")
        assert QGuiApplication.clipboard().text().rstrip("\n") == expected
    # the keyword "def" is drawn in the keyword color, the rest of the code is not
    keyword = highlight.token_color("keyword", theme.is_dark(view.palette()))
    colored = set()
    block = view.transcript.document().begin()
    while block.isValid():
        iterator = block.begin()
        while not iterator.atEnd():
            fragment = iterator.fragment()
            if fragment.charFormat().foreground().color().name().lower() == keyword.lower():
                colored.add(fragment.text())
            iterator += 1
        block = block.next()
    assert "def" in colored and "ls -l" not in colored
    # the message links: Edit under the user's message, Copy and Regenerate under the reply
    assert action_href("edit", 0) in links and action_href("copy", 1) in links and action_href("regenerate", 1) in links


def tables(view: ChatView) -> list[QTextTable]:
    found = []
    for frame in view.transcript.document().rootFrame().childFrames():
        if isinstance(frame, QTextTable):
            found.append(frame)
    return found


def cell_texts(table: QTextTable) -> list[list[str]]:
    return [[table.cellAt(r, c).firstCursorPosition().block().text() for c in range(table.columns())]
            for r in range(table.rows())]


def test_tables_are_drawn_as_tables_also_while_they_stream(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    reply = view.add_message(ChatMessage("assistant"))
    for n in range(0, len(TABLE_REPLY), 3):  # three characters a frame: cells and rows grow
        view.append_pieces(reply, [TABLE_REPLY[n:n + 3]], [n % 2 == 0])
        view.flush()
    view.end_reply(reply, "done")
    shown = tables(view)
    assert len(shown) == 1, "the table is redrawn, not extended into a second one"
    assert cell_texts(shown[0]) == [["name", "size"], ["a", "1"], ["bb", "22"]]
    view.set_messages(list(view.messages))  # drawn again from scratch: the same table
    assert [cell_texts(t) for t in tables(view)] == [[["name", "size"], ["a", "1"], ["bb", "22"]]]


# --- in the window -------------------------------------------------------------------------


def test_enter_sends_and_shift_enter_starts_a_new_line(qtbot, open_window):
    window = open_window(method="ngram", max_tokens=8)
    box = window.chat_view.input
    box.setFocus()
    qtbot.keyClicks(box, "first line")
    qtbot.keyClick(box, Qt.Key_Return, Qt.ShiftModifier)
    qtbot.keyClicks(box, "second line")
    assert box.toPlainText() == "first line\nsecond line" and window.chat.turn is None
    with wait_for(qtbot, window, "chat"):
        qtbot.keyClick(box, Qt.Key_Return)
        assert box.toPlainText() == ""
    assert [m.content for m in window.history.messages(window.chat_id)][0] == "first line\nsecond line"


def test_edit_and_regenerate_keep_both_branches_and_the_arrows_switch(qtbot, open_window):
    window = open_window(method="ngram", max_tokens=12, temperature=0.9, seed=3)
    view = window.chat_view
    send(qtbot, window, "def parse_args(argv):")
    first_user, first_reply = view.messages[0].db_id, view.messages[1].text
    # Edit: the text goes to the input; Send answers the new version under it
    click(view, action_href("edit", 0))
    assert view.input.toPlainText() == "def parse_args(argv):"
    view.stop_requested.emit()  # Esc: not an edit any more
    assert view.input.toPlainText() == "" and window.chat.editing is None
    click(view, action_href("edit", 0))
    view.input.setPlainText("def main():")
    reply_to(qtbot, window, lambda: view.send_button.click() or window.chat.turn)
    assert [m.text for m in view.messages][0] == "def main():"
    assert (view.messages[0].alternative, view.messages[0].alternatives) == (1, 2)
    edited_reply = view.messages[1].text
    assert len(window.history.alternatives(first_user)) == 2
    # Regenerate the reply under the edit: a second version of it, the first kept
    window.controls.seed_spin.setValue(4)
    reply_to(qtbot, window, lambda: click(view, action_href("regenerate", 1)) or window.chat.turn)
    assert (view.messages[1].alternative, view.messages[1].alternatives) == (1, 2)
    assert action_href("previous", 1) in anchors(view)
    every = window.history.all_messages(window.chat_id)
    assert [m.role for m in every] == ["user", "assistant", "user", "assistant", "assistant"]
    # the arrows: back to the first version of the user's message, with its own reply
    click(view, action_href("previous", 0))
    assert [m.text for m in view.messages] == ["def parse_args(argv):", first_reply]
    assert view.messages[0].alternative == 0 and action_href("next", 0) in anchors(view)
    click(view, action_href("next", 0))
    assert view.messages[0].text == "def main():" and view.messages[1].alternatives == 2
    click(view, action_href("previous", 1))
    assert view.messages[1].text == edited_reply
    # the conversation the model is given follows the branch on screen
    outcome = send(qtbot, window, "and then?")
    assert [m.content for m in window.history.messages(window.chat_id)][:2] == ["def main():", edited_reply]
    assert outcome.result.text == view.messages[-1].text


def test_regenerate_and_copy_a_reply_that_is_not_the_last(qtbot, open_window):
    window = open_window(method="ngram", max_tokens=10, temperature=0.9, seed=7)
    view = window.chat_view
    send(qtbot, window, "first question")
    send(qtbot, window, "second question")
    first = view.messages[1]
    QGuiApplication.clipboard().clear()
    click(view, action_href("copy", 1))
    assert QGuiApplication.clipboard().text() == first.text
    window.controls.seed_spin.setValue(8)
    outcome = reply_to(qtbot, window, lambda: click(view, action_href("regenerate", 1)) or window.chat.turn)
    # the second version answers the first question; the first version and the turn after it stay
    assert [m.role for m in view.messages] == ["user", "assistant"]
    assert view.messages[1].text == outcome.result.text and view.messages[1].alternatives == 2
    assert len(window.history.all_messages(window.chat_id)) == 5
    click(view, action_href("previous", 1))
    assert [m.text for m in view.messages][2] == "second question"


def test_the_system_prompt_reaches_the_template_and_stays_with_its_chat(qtbot, open_window):
    window = open_window(method="ngram", max_tokens=6)
    plain = send(qtbot, window, "hello")
    window.new_chat()
    system = "You are a careful assistant who answers in one short sentence about Python programs."
    window.controls.system_prompt_edit.setPlainText(system)  # for the new chat
    prompted = send(qtbot, window, "hello")
    job_messages = window.history.chat(window.chat_id)
    assert job_messages.system_prompt == system
    # the rendered prompt the engine got is longer by the system prompt's tokens
    assert prompted.prompt_tokens - plain.prompt_tokens >= 10
    # each chat shows (and keeps) its own system prompt
    chats = [c.id for c in window.history.chats()]
    window.open_chat(chats[1])
    assert window.controls.system_prompt() == ""
    window.open_chat(chats[0])
    assert window.controls.system_prompt() == system
    window.controls.system_prompt_edit.setPlainText("Answer in French.")
    assert window.history.chat(chats[0]).system_prompt == "Answer in French."


def test_a_preset_sets_sampling_and_the_system_prompt(qtbot, open_window):
    window = open_window(method="ngram", max_tokens=6)
    presets = window.settings.all_presets()
    chosen = next((p for p in presets if p.system_prompt), presets[-1])
    window.controls.use_preset(chosen.name)
    assert window.controls.temperature_spin.value() == pytest.approx(chosen.temperature)
    assert window.controls.max_tokens() == chosen.max_tokens
    assert window.controls.system_prompt() == chosen.system_prompt == window.settings.system_prompt
    assert window.controls.preset_combo.currentData() == chosen.name


def test_rename_search_and_export_from_the_window(qtbot, open_window, tmp_path):
    window = open_window(method="ngram", max_tokens=6)
    history: History = window.history
    ids = {}
    for title, text in (("Sorting", "How do I sort a list of tuples?"), ("Files", "How do I read a file?")):
        ids[title] = history.create_chat(title)
        history.add_message(ids[title], "user", text)
        history.add_message(ids[title], "assistant", f"Answer to: {text}\n\n```python\nprint(1)\n```")
    panel = window.chats_panel
    panel.refresh()
    panel.list.setCurrentRow(panel.shown_ids().index(ids["Sorting"]))
    panel.list.itemClicked.emit(panel.list.currentItem())
    assert window.chat_id == ids["Sorting"] and window.chat_view.messages[0].text.startswith("How do I sort")
    # rename in place
    panel.list.currentItem().setText("Sorting tuples")
    assert history.chat(ids["Sorting"]).title == "Sorting tuples"
    # search: a message's text finds its chat
    panel.search_box.setText("read a file")
    assert panel.shown_ids() == [ids["Files"]]
    panel.search_box.setText("")
    assert set(panel.shown_ids()) == set(ids.values())
    # export, Markdown and JSON, to the file the user picked
    panel.ask_export_path = lambda parent, name, kind: str(tmp_path / name)
    written = panel.export_chat(ids["Sorting"], "markdown")
    assert written.name == "Sorting tuples.md" and "How do I sort a list of tuples?" in written.read_text()
    data = json.loads(panel.export_chat(ids["Sorting"], "json").read_text())
    assert "How do I sort a list of tuples?" in json.dumps(data)
    # deleting the open chat from the list leaves a new, empty one on screen
    assert panel.delete_chat(ids["Sorting"], confirm=False)
    assert window.chat_id is None and window.chat_view.messages == []
    assert panel.shown_ids() == [ids["Files"]]


def test_switching_chats_resets_the_charts(qtbot, open_window):
    window = open_window(method="ngram", max_tokens=8)
    send(qtbot, window, "def parse_args(argv):")
    assert window.charts.series.steps > 0
    window.new_chat()
    assert window.charts.series.steps == 0 and window.charts.status.text() == "no run yet"
