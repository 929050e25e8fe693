"""Colours that follow the palette (light or dark), and a dark palette for screenshots."""

from __future__ import annotations

from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication


def is_dark(palette: QPalette | None = None) -> bool:
    palette = palette or QApplication.palette()
    return palette.color(QPalette.Window).lightness() < 128


def draft_tint(palette: QPalette | None = None) -> QColor:
    """Background of a token that came from an accepted draft."""
    return QColor("#1f5f3a") if is_dark(palette) else QColor("#c8f0d2")


def divergence_tint(palette: QPalette | None = None) -> QColor:
    return QColor("#8a2b2b") if is_dark(palette) else QColor("#ffb3b3")


def accent(palette: QPalette | None = None) -> QColor:
    return QColor("#5fb3ff") if is_dark(palette) else QColor("#1f6fbf")


def secondary(palette: QPalette | None = None) -> QColor:
    return QColor("#7fd18b") if is_dark(palette) else QColor("#2e8b3e")


def muted(palette: QPalette | None = None) -> QColor:
    return QColor("#9a9a9a") if is_dark(palette) else QColor("#777777")


def apply_dark_palette(app: QApplication) -> None:
    app.setStyle("Fusion")
    palette = QPalette()
    colours = {
        QPalette.Window: "#2b2b2b", QPalette.WindowText: "#e6e6e6", QPalette.Base: "#1e1e1e",
        QPalette.AlternateBase: "#2b2b2b", QPalette.ToolTipBase: "#3a3a3a", QPalette.ToolTipText: "#e6e6e6",
        QPalette.Text: "#e6e6e6", QPalette.Button: "#353535", QPalette.ButtonText: "#e6e6e6",
        QPalette.BrightText: "#ff6b6b", QPalette.Highlight: "#3d7bd9", QPalette.HighlightedText: "#ffffff",
        QPalette.Link: "#5fb3ff", QPalette.PlaceholderText: "#8a8a8a",
    }
    for role, colour in colours.items():
        palette.setColor(role, QColor(colour))
    for role in (QPalette.Text, QPalette.ButtonText, QPalette.WindowText):
        palette.setColor(QPalette.Disabled, role, QColor("#7a7a7a"))
    app.setPalette(palette)


def code_background(palette: QPalette | None = None) -> QColor:
    """Behind code blocks and `inline code` in replies."""
    return QColor("#262b33") if is_dark(palette) else QColor("#f0f2f5")
