"""Message boxes in one place, so every error a user sees looks the same (and tests can
record them by replacing QMessageBox's static functions)."""

from __future__ import annotations

from typing import Optional

from PySide6.QtWidgets import QMessageBox, QWidget


def show_error(parent: Optional[QWidget], message: str, title: str = "SpecDesk") -> None:
    QMessageBox.critical(parent, title, message)


def ask(parent: Optional[QWidget], question: str, title: str = "SpecDesk") -> bool:
    answer = QMessageBox.question(parent, title, question, QMessageBox.Yes | QMessageBox.No, QMessageBox.Yes)
    return answer == QMessageBox.Yes
