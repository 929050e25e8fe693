"""The tables of the Models tab and the pairing dialog: read-only cells, row selection, and a
model's name as both show it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget, QTableWidgetItem, QWidget


def cell(text: Any, tip: Optional[str] = None, data: Any = None) -> QTableWidgetItem:
    """A read-only cell: its text, a tooltip, and data kept under Qt.UserRole (a path, a repository)."""
    item = QTableWidgetItem("" if text is None else str(text))
    item.setFlags(item.flags() & ~Qt.ItemIsEditable)
    if tip:
        item.setToolTip(tip)
    if data is not None:
        item.setData(Qt.UserRole, data)
    return item


def table(headers: list[str], parent: QWidget) -> QTableWidget:
    """A table of whole-row single selection, its last column stretched."""
    table = QTableWidget(0, len(headers), parent)
    table.setHorizontalHeaderLabels(headers)
    table.setSelectionBehavior(QAbstractItemView.SelectRows)
    table.setSelectionMode(QAbstractItemView.SingleSelection)
    table.verticalHeader().setVisible(False)
    table.horizontalHeader().setSectionResizeMode(QHeaderView.Interactive)
    table.horizontalHeader().setStretchLastSection(True)
    return table


def model_label(name: str, path: str) -> str:
    """A model's name with its file name when the name does not say it: the files of one model
    (its quantizations, a target and its drafts from one conversion) often share the name in
    their header, and only the file tells them apart."""
    file = Path(path).name
    if not file or file in name or name == file or file.startswith("sha256-"):  # Ollama blobs: the tag names them
        return name
    return f"{name} ({file})"
