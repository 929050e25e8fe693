"""The chat list on a real history: search, rename in place, export and delete (offscreen)."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLineEdit, QMessageBox

from specdesk.app.storage.history import History
from specdesk.ui.chats_panel import ChatsPanel, export_file_name, write_export
from specdesk.engines.types import SpecDeskError


@pytest.fixture
def history(tmp_path):
    history = History(tmp_path / "history.sqlite3")
    yield history
    history.close()


@pytest.fixture
def answers(monkeypatch):
    """Message boxes recorded instead of shown; questions answered Yes."""
    shown = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text, *a, **k: shown.append(text))
    monkeypatch.setattr(QMessageBox, "question",
                        lambda parent, title, text, *a, **k: shown.append(text) or QMessageBox.Yes)
    return shown


def three_chats(history: History) -> dict[str, int]:
    ids = {}
    for title, user, reply in [("Parse args", "def parse_args(argv):", "use argparse"),
                               ("Sorting", "sort a list of tuples", "sorted(items, key=...)"),
                               ("Poem", "a haiku about rain", "Grey clouds, softly fall")]:
        ids[title] = history.create_chat(title)
        history.add_message(ids[title], "user", user)
        history.add_message(ids[title], "assistant", reply)
    return ids


def make_panel(qtbot, history, paths=None) -> ChatsPanel:
    asked = []

    def ask_path(parent, suggested, file_filter):
        asked.append((suggested, file_filter))
        return str(paths.pop(0)) if paths else ""

    panel = ChatsPanel(history, ask_export_path=ask_path)
    panel.asked = asked
    qtbot.addWidget(panel)
    return panel


def test_the_list_shows_chats_newest_first_and_says_which_was_opened(qtbot, history):
    ids = three_chats(history)
    panel = make_panel(qtbot, history)
    assert panel.shown_ids() == [ids["Poem"], ids["Sorting"], ids["Parse args"]]
    with qtbot.waitSignal(panel.chat_selected) as opened:
        qtbot.mouseClick(panel.list.viewport(), Qt.LeftButton,
                         pos=panel.list.visualItemRect(panel.list.item(1)).center())
    assert opened.args == [ids["Sorting"]] and panel.selected_id() == ids["Sorting"]


def test_search_filters_by_title_and_message_text(qtbot, history):
    ids = three_chats(history)
    panel = make_panel(qtbot, history)
    qtbot.keyClicks(panel.search_box, "ARGPARSE")  # in a reply, not the title
    assert panel.shown_ids() == [ids["Parse args"]]
    assert panel.list.item(0).toolTip() == "use argparse"
    panel.search_box.clear()
    qtbot.keyClicks(panel.search_box, "po")
    assert panel.shown_ids() == [ids["Poem"]]
    qtbot.keyClicks(panel.search_box, "zzz")
    assert panel.shown_ids() == []
    panel.search_box.clear()
    assert len(panel.shown_ids()) == 3


def test_rename_in_place_by_double_click(qtbot, history, answers):
    ids = three_chats(history)
    panel = make_panel(qtbot, history)
    panel.show()
    item = panel.list.item(2)
    rect = panel.list.visualItemRect(item)
    qtbot.mouseClick(panel.list.viewport(), Qt.LeftButton, pos=rect.center())  # a double click: click, then again
    qtbot.mouseDClick(panel.list.viewport(), Qt.LeftButton, pos=rect.center())
    editor = panel.list.viewport().findChild(QLineEdit)
    assert editor is not None and editor.text() == "Parse args"
    editor.selectAll()
    qtbot.keyClicks(editor, "Command-line parsing")
    qtbot.keyClick(editor, Qt.Key_Return)  # the item view commits the edit from its event loop
    qtbot.waitUntil(lambda: history.chat(ids["Parse args"]).title == "Command-line parsing", timeout=5000)
    assert panel.list.item(2).text() == "Command-line parsing"
    assert panel.rename_chat(ids["Poem"], "   ") is False  # refused, said, the old name kept
    assert answers == ["a chat's name cannot be empty"] and history.chat(ids["Poem"]).title == "Poem"


def test_rename_and_export_from_the_context_menu(qtbot, history, tmp_path, answers):
    ids = three_chats(history)
    panel = make_panel(qtbot, history, paths=[tmp_path / "out" / "poem.md", tmp_path / "poem"])
    (tmp_path / "out").mkdir()
    menu = panel.context_menu(ids["Poem"])
    actions = {a.text(): a for a in menu.actions() if a.text()}
    assert list(actions) == ["Rename", "Export as Markdown…", "Export as JSON…", "Delete"]
    actions["Export as Markdown…"].trigger()
    assert (tmp_path / "out" / "poem.md").read_text(encoding="utf-8") == (
        "# Poem\n\n## You\n\na haiku about rain\n\n## Model\n\nGrey clouds, softly fall\n")
    actions["Export as JSON…"].trigger()  # no suffix typed: the format's is added
    exported = json.loads((tmp_path / "poem.json").read_text(encoding="utf-8"))
    assert [m["content"] for m in exported["messages"]] == ["a haiku about rain", "Grey clouds, softly fall"]
    assert panel.asked == [("Poem.md", "Markdown (*.md)"), ("Poem.json", "JSON (*.json)")]
    actions["Export as JSON…"].trigger()  # cancelled: nothing written, nothing said
    assert answers == []
    panel.show()
    actions["Rename"].trigger()
    editor = panel.list.viewport().findChild(QLineEdit)
    editor.selectAll()
    qtbot.keyClicks(editor, "Rain")
    qtbot.keyClick(editor, Qt.Key_Return)
    qtbot.waitUntil(lambda: history.chat(ids["Poem"]).title == "Rain", timeout=5000)


def test_an_export_that_cannot_be_written_says_why(qtbot, history, tmp_path, answers):
    ids = three_chats(history)
    panel = make_panel(qtbot, history, paths=[tmp_path / "missing" / "x.md"])
    assert panel.export_chat(ids["Poem"], "markdown") is None
    assert len(answers) == 1 and "could not be saved to" in answers[0] and "choose another place" in answers[0]
    with pytest.raises(SpecDeskError, match="unknown export format 'pdf'"):
        write_export(history, ids["Poem"], "pdf", tmp_path / "x.pdf")


def test_delete_asks_and_says_which_chat_went(qtbot, history, answers):
    ids = three_chats(history)
    panel = make_panel(qtbot, history)
    panel.set_current(ids["Sorting"])
    with qtbot.waitSignal(panel.chat_deleted) as deleted:
        assert panel.delete_chat(ids["Sorting"])
    assert deleted.args == [ids["Sorting"]] and history.chat(ids["Sorting"]) is None
    assert answers == ["Delete the chat “Sorting” and all its messages?"]
    assert panel.shown_ids() == [ids["Poem"], ids["Parse args"]]


def test_export_file_names_come_from_titles():
    assert export_file_name("Parse args: v2/final?", "markdown") == "Parse args v2 final.md"
    assert export_file_name("///", "json") == "chat.json"
