"""Starting the desktop app: `specdesk` with no arguments calls `run_gui()`."""

from __future__ import annotations

import os
import sys
from typing import Optional


def display_available() -> bool:
    """Whether Qt can open a window here (a desktop session, or an explicit QPA platform)."""
    if os.environ.get("QT_QPA_PLATFORM"):
        return True
    if sys.platform.startswith("linux") or sys.platform.startswith("freebsd"):
        return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    return True  # Windows and macOS always have a window server for a logged-in user


def make_app(argv: Optional[list[str]] = None, dark: Optional[bool] = None):
    from PySide6.QtWidgets import QApplication

    from .theme import apply_dark_palette

    app = QApplication.instance() or QApplication(argv if argv is not None else sys.argv[:1])
    app.setApplicationName("SpecDesk")
    app.setOrganizationName("SpecDesk")
    if dark:
        apply_dark_palette(app)
    return app


def open_window(target: Optional[str] = None, **kwargs):
    """The main window, on the saved models or, with `target` (`specdesk gui --target PATH`), on
    that target with the draft that fits it (the saved draft only if it does), as File > Open does."""
    from .main_window import MainWindow

    window = MainWindow(autoload=target is None, **kwargs)
    if target is not None:
        window.open_target(os.path.abspath(target))
    return window


def run_gui(dark: Optional[bool] = None, target: Optional[str] = None) -> int:
    app = make_app(dark=dark)
    window = open_window(target)
    window.resize(1280, 800)
    window.show()
    return app.exec()
