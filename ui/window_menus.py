"""The main window's menus and look: File, View (theme, zoom), Settings and Help, and the theme
and zoom kept in settings.

`WindowMenus` is the part of MainWindow (ui/main_window.py) that does this; it uses the
window's settings, status line, left panel and actions (new chat, open a model, close).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from PySide6.QtCore import QUrl
from PySide6.QtGui import QAction, QActionGroup, QDesktopServices, QKeySequence
from PySide6.QtWidgets import QApplication, QMessageBox

from specdesk.app.storage.settings import THEMES

from .theme import apply_font_scale, apply_theme, zoomed


def docs_location() -> Optional[Path]:
    """The user guide in this install's docs folder (a source checkout or an editable install), or None."""
    path = Path(__file__).resolve().parents[1] / "docs" / "usage.md"
    return path if path.is_file() else None


class WindowMenus:
    """Mixed into MainWindow: its menu bar, theme and zoom, and Help."""

    def _build_menus(self) -> None:
        """File, View and Settings before the Servers menu, Help at the end."""
        bar = self.menuBar()
        first = bar.actions()[0] if bar.actions() else None
        file_menu = bar.addMenu("&File")
        self._add_action(file_menu, "New chat", self.new_chat, QKeySequence.New)
        self._add_action(file_menu, "Open GGUF file…", lambda: self.open_model(folder=False), QKeySequence.Open)
        self._add_action(file_menu, "Open model folder…", lambda: self.open_model(folder=True))
        file_menu.addSeparator()
        self._add_action(file_menu, "Quit", self.close, QKeySequence.Quit)

        view = bar.addMenu("&View")
        themes = view.addMenu("Theme")
        group = QActionGroup(self)
        self.theme_actions: dict[str, QAction] = {}
        for name in THEMES:
            action = themes.addAction(name.capitalize())
            action.setCheckable(True)
            action.setChecked(name == self.settings.theme)
            action.triggered.connect(lambda checked, name=name: self.set_theme(name))
            group.addAction(action)
            self.theme_actions[name] = action
        view.addSeparator()
        self._add_action(view, "Zoom in", lambda: self.zoom(1), QKeySequence("Ctrl+="), QKeySequence.ZoomIn)
        self._add_action(view, "Zoom out", lambda: self.zoom(-1), QKeySequence("Ctrl+-"), QKeySequence.ZoomOut)
        self._add_action(view, "Reset zoom", lambda: self.zoom(0), QKeySequence("Ctrl+0"))

        settings_menu = bar.addMenu("&Settings")
        self.settings_panel_action = self._add_action(settings_menu, "Models, sampling and hardware",
                                                      self.show_settings_panel, QKeySequence("Ctrl+,"))
        self.settings_panel_action.setCheckable(True)
        self.settings_panel_action.setChecked(True)
        self.settings_panel_action.setToolTip("show or hide the left panel, where these settings are")
        for menu in (file_menu, view, settings_menu):
            if first is not None:  # before Servers
                bar.removeAction(menu.menuAction())
                bar.insertMenu(first, menu)

        help_menu = bar.addMenu("&Help")
        self.docs_action = self._add_action(help_menu, "Documentation", self.open_docs, QKeySequence.HelpContents)
        self.docs_action.setEnabled(docs_location() is not None)
        self.about_action = self._add_action(help_menu, "About SpecDesk…", self.show_about)

    def _add_action(self, menu, text: str, slot, *shortcuts) -> QAction:
        action = menu.addAction(text)
        action.triggered.connect(lambda checked=False: slot())
        if shortcuts:
            action.setShortcuts([QKeySequence(s) for s in shortcuts])
        return action

    def _apply_look(self) -> None:
        """The theme and zoom kept in settings, before any widget is built."""
        app = QApplication.instance()
        if self.settings.theme != "system":
            apply_theme(app, self.settings.theme)
        if self.settings.font_scale != 1.0:
            apply_font_scale(app, self.settings.font_scale)

    def set_theme(self, name: str) -> None:
        apply_theme(QApplication.instance(), name)
        self.settings.theme = name
        self.theme_actions[name].setChecked(True)
        self.status_label.setText(f"theme: {name} (the charts take its colours from the next start)")

    def zoom(self, steps: int) -> float:
        """View > Zoom in (1), out (-1) or reset (0); kept in settings. Returns the new scale."""
        scale = zoomed(self.settings.font_scale, steps)
        apply_font_scale(QApplication.instance(), scale)
        self.settings.font_scale = scale
        self.status_label.setText(f"zoom {scale:.0%}")
        return scale

    def show_settings_panel(self) -> None:
        """Settings: the left panel (models, sampling, limits, placement) shown and focused, or hidden."""
        show = self.settings_panel_action.isChecked()
        self._left.setVisible(show)
        if show:
            self.controls.target_combo.setFocus()

    def open_docs(self) -> None:
        location = docs_location()
        if location is not None:
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(location)))

    def about_text(self) -> str:
        from PySide6 import __version__ as pyside_version

        from specdesk.app.about import about_text

        return f"{about_text()}\nQt (PySide6) {pyside_version}"

    def show_about(self) -> None:
        """Versions and the llama.cpp build: which backend, which CPU code, whether GPU offload works."""
        QMessageBox.about(self, "About SpecDesk", self.about_text().replace("\n", "<br>"))
