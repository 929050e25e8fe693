"""Colours that follow the palette (light or dark); the View menu's themes (system, light,
dark) and zoom (the application font against the system's)."""

from __future__ import annotations

from PySide6.QtGui import QColor, QFont, QPalette
from PySide6.QtWidgets import QApplication

from specdesk.app.storage.settings import RANGES, THEMES
from specdesk.engines.types import SpecDeskError

ZOOM_STEP = 0.1  # View > Zoom in / out: a tenth of the system font size each
_system: dict[int, tuple[str, QPalette, QFont]] = {}  # per application: its style, palette and font at start


def _remember_system(app: QApplication) -> tuple[str, QPalette, QFont]:
    """The style, palette and font the application started with (before any theme or zoom)."""
    key = id(app)
    if key not in _system:
        _system[key] = (app.style().name(), QPalette(app.palette()), QFont(app.font()))
    return _system[key]


def apply_theme(app: QApplication, name: str) -> None:
    """System (the platform's own look), light (Fusion's) or dark."""
    if name not in THEMES:
        raise SpecDeskError(f"unknown theme {name!r}: choose one of {', '.join(THEMES)}")
    style, palette, _ = _remember_system(app)
    if name == "dark":
        apply_dark_palette(app)
    elif name == "light":
        app.setStyle("Fusion")
        app.setPalette(app.style().standardPalette())
    else:
        app.setStyle(style)
        app.setPalette(palette)


def zoomed(scale: float, steps: int) -> float:
    """The font scale `steps` zoom steps from `scale` (0: back to the system's), within the
    settings' range and on whole steps."""
    if steps == 0:
        return 1.0
    low, high = RANGES["font_scale"]
    return round(min(high, max(low, scale + steps * ZOOM_STEP)), 2)


def apply_font_scale(app: QApplication, scale: float) -> None:
    """The application font at `scale` times the system's size."""
    low, high = RANGES["font_scale"]
    if not low <= scale <= high:
        raise SpecDeskError(f"font scale {scale:g} is out of range: it goes from {low:g} to {high:g}")
    font = QFont(_remember_system(app)[2])
    if font.pointSizeF() > 0:
        font.setPointSizeF(font.pointSizeF() * scale)
    else:  # a font sized in pixels
        font.setPixelSize(max(1, round(font.pixelSize() * scale)))
    app.setFont(font)


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
    _remember_system(app)  # "system" can return to it
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
