"""The list of past chats: search, rename, export and delete, on the chat history.

The panel reads and writes the history (app/storage/history.py) itself and tells the window
what the user chose: `chat_selected(chat_id)` when a chat is opened, `chat_deleted(chat_id)`
after one is deleted. A chat is renamed in place (double-click, F2 or the context menu);
export writes Markdown (the path shown) or JSON (every branch) to a file the user picks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from PySide6.QtCore import QPoint, Qt, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (QAbstractItemView, QFileDialog, QLineEdit, QListWidget, QListWidgetItem, QMenu,
                               QVBoxLayout, QWidget)

from specdesk.app.storage.history import History, chat_title
from specdesk.engines.types import SpecDeskError

from .dialogs import ask, show_error

EXPORTS = {"markdown": ("Markdown (*.md)", ".md"), "json": ("JSON (*.json)", ".json")}
CHAT_ID = Qt.UserRole


def export_file_name(title: str, kind: str) -> str:
    """A file name from a chat's title: letters, digits, spaces, dashes and dots kept, the rest dropped."""
    kept = "".join(ch if ch.isalnum() or ch in " -_." else " " for ch in title)
    stem = " ".join(kept.split()).strip(" .") or "chat"
    return stem[:60] + EXPORTS[kind][1]


def write_export(history: History, chat_id: int, kind: str, path: Path) -> Path:
    """Write a chat's export; SpecDeskError saying why when the file cannot be written."""
    if kind not in EXPORTS:
        raise SpecDeskError(f"unknown export format {kind!r}: choose one of {', '.join(EXPORTS)}")
    text = history.export_markdown(chat_id) if kind == "markdown" else history.export_json(chat_id)
    path = Path(path)
    if not path.suffix:
        path = path.with_suffix(EXPORTS[kind][1])
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise SpecDeskError(f"the chat could not be saved to {path} ({e.strerror or e}): "
                            "choose another place") from None
    return path


class ChatsPanel(QWidget):
    chat_selected = Signal(int)
    chat_deleted = Signal(int)

    def __init__(self, history: History, parent: Optional[QWidget] = None,
                 ask_export_path: Optional[Callable[[QWidget, str, str], str]] = None):
        super().__init__(parent)
        self.history = history
        self._current: Optional[int] = None
        self._filling = False
        # Where an export goes: (parent, suggested file name, file filter) -> path, "" when cancelled.
        self.ask_export_path = ask_export_path or _ask_save_path

        self.search_box = QLineEdit(self)
        self.search_box.setPlaceholderText("Search chats")
        self.search_box.setClearButtonEnabled(True)
        self.search_box.textChanged.connect(lambda _text: self.refresh())
        self.list = QListWidget(self)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.ElideRight)
        self.list.setEditTriggers(QAbstractItemView.DoubleClicked | QAbstractItemView.EditKeyPressed)
        self.list.setContextMenuPolicy(Qt.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._context_menu)
        self.list.itemActivated.connect(self._activated)
        self.list.itemClicked.connect(self._activated)
        self.list.itemChanged.connect(self._renamed_in_place)
        delete = QAction("Delete chat", self.list)
        delete.setShortcut(QKeySequence.Delete)
        delete.setShortcutContext(Qt.WidgetShortcut)
        delete.triggered.connect(lambda: self.delete_chat(self.selected_id(), confirm=True))
        self.list.addAction(delete)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.search_box)
        layout.addWidget(self.list, 1)
        self.refresh()

    # --- what is shown ----------------------------------------------------------------
    def refresh(self, current: Optional[int] = None) -> None:
        """List the chats that match the search (all when it is empty), newest first; `current`
        (or the chat open until now) stays selected."""
        if current is not None:
            self._current = current
        hits = self.history.search(self.search_box.text()) if self.history.is_open else []
        self._filling = True
        try:
            self.list.clear()
            for hit in hits:
                item = QListWidgetItem(hit.chat.title)
                item.setData(CHAT_ID, hit.chat.id)
                item.setFlags(item.flags() | Qt.ItemIsEditable)
                item.setToolTip(hit.snippet or hit.chat.title)
                self.list.addItem(item)
                if hit.chat.id == self._current:
                    self.list.setCurrentItem(item)
        finally:
            self._filling = False

    def set_current(self, chat_id: Optional[int]) -> None:
        """The chat the window shows (None: a new one not saved yet), selected in the list."""
        self._current = chat_id
        item = self._item(chat_id) if chat_id is not None else None
        self._filling = True
        try:
            self.list.setCurrentItem(item) if item is not None else self.list.clearSelection()
        finally:
            self._filling = False

    def shown_ids(self) -> list[int]:
        return [self.list.item(i).data(CHAT_ID) for i in range(self.list.count())]

    def selected_id(self) -> Optional[int]:
        item = self.list.currentItem()
        return item.data(CHAT_ID) if item is not None else None

    def _item(self, chat_id: int) -> Optional[QListWidgetItem]:
        for i in range(self.list.count()):
            if self.list.item(i).data(CHAT_ID) == chat_id:
                return self.list.item(i)
        return None

    # --- actions ----------------------------------------------------------------------
    def rename_chat(self, chat_id: int, title: str) -> bool:
        """Rename a chat; a blank name is refused with a message and the old name stays."""
        try:
            self.history.rename_chat(chat_id, title)
        except SpecDeskError as e:
            show_error(self, str(e))
            self._show_title(chat_id)
            return False
        self._show_title(chat_id)
        return True

    def _show_title(self, chat_id: int) -> None:
        """The stored title on the chat's row (the list is not rebuilt: an edit may be closing)."""
        item, chat = self._item(chat_id), self.history.chat(chat_id)
        if item is None or chat is None:
            return
        self._filling = True
        try:
            item.setText(chat.title)
        finally:
            self._filling = False

    def start_rename(self, chat_id: int) -> None:
        item = self._item(chat_id)
        if item is not None:
            self.list.setCurrentItem(item)
            self.list.editItem(item)

    def export_chat(self, chat_id: int, kind: str) -> Optional[Path]:
        """Ask where, then write; None when cancelled or when it failed (after saying why)."""
        chat = self.history.chat(chat_id)
        if chat is None:
            return None
        path = self.ask_export_path(self, export_file_name(chat.title, kind), EXPORTS[kind][0])
        if not path:
            return None
        try:
            return write_export(self.history, chat_id, kind, Path(path))
        except SpecDeskError as e:
            show_error(self, str(e))
            return None

    def delete_chat(self, chat_id: Optional[int], confirm: bool = True) -> bool:
        chat = self.history.chat(chat_id) if chat_id is not None else None
        if chat is None:
            return False
        if confirm and not ask(self, f"Delete the chat “{chat_title(chat.title)}” and all its messages?"):
            return False
        self.history.delete_chat(chat_id)
        if self._current == chat_id:
            self._current = None
        self.refresh()
        self.chat_deleted.emit(chat_id)
        return True

    # --- events -----------------------------------------------------------------------
    def _activated(self, item: QListWidgetItem) -> None:
        chat_id = item.data(CHAT_ID)
        if chat_id != self._current:
            self._current = chat_id
            self.chat_selected.emit(chat_id)

    def _renamed_in_place(self, item: QListWidgetItem) -> None:
        if self._filling:
            return
        chat = self.history.chat(item.data(CHAT_ID))
        if chat is not None and item.text() != chat.title:
            self.rename_chat(chat.id, item.text())

    def _context_menu(self, position: QPoint) -> None:
        item = self.list.itemAt(position)
        if item is None:
            return
        self.context_menu(item.data(CHAT_ID)).exec(self.list.viewport().mapToGlobal(position))

    def context_menu(self, chat_id: int) -> QMenu:
        menu = QMenu(self)
        menu.addAction("Rename", lambda: self.start_rename(chat_id))
        menu.addAction("Export as Markdown…", lambda: self.export_chat(chat_id, "markdown"))
        menu.addAction("Export as JSON…", lambda: self.export_chat(chat_id, "json"))
        menu.addSeparator()
        menu.addAction("Delete", lambda: self.delete_chat(chat_id, confirm=True))
        return menu


def _ask_save_path(parent: QWidget, suggested: str, file_filter: str) -> str:
    path, _chosen = QFileDialog.getSaveFileName(parent, "Export chat", str(Path.home() / suggested), file_filter)
    return path
