"""What a user would see cut, listed as lines of text (empty when nothing is): the screenshot
command refuses a size where something is, and the layout tests hold the window to it.

`clipped(root)` looks at every visible widget under `root`:

- a widget given less room than its minimum (Qt's own rule, `smallest_size`);
- a label whose text does not fit it: wider than the label on one line, or taller when it
  wraps (Qt draws what fits and drops the rest, with no "…" to say so);
- placeholder text that does not fit its field;
- a widget reaching out of its parent (the parent cuts it), and a widget marked with
  `must_be_seen` lying outside its scroll area's viewport (a list one would have to scroll
  a panel to find);
- in pyqtgraph plots: titles, axis labels and legend text that the plot's edge or an item
  that clips its children (a ViewBox) cuts, and the category labels `charts.integer_ticks`
  asked for that the axis left out for want of room.

Scrolled content is not cut by its scroll area (it scrolls), so only the scroll area itself
is held to its minimum size.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, QRectF, QSize, Qt
from PySide6.QtGui import QFontMetrics, QImage, QPainter
from PySide6.QtWidgets import (QAbstractButton, QAbstractScrollArea, QAbstractSpinBox, QComboBox, QGraphicsItem,
                               QGraphicsTextItem, QGraphicsView, QLabel, QLineEdit, QPlainTextEdit, QSizePolicy,
                               QTextEdit, QWidget)

from .status_line import ELIDED

MUST_BE_SEEN = "specdeskMustBeSeen"  # widget property: in view without scrolling its panel
TOLERANCE = 1  # pixels: rounding between Qt's own measures


def must_be_seen(widget: QWidget) -> None:
    """Mark `widget` as something the user must find without scrolling the panel it sits in."""
    widget.setProperty(MUST_BE_SEEN, True)


def clipped(root: QWidget) -> list[str]:
    """Every cut thing under `root`, one line each: "what 'its text' shows WxH of WxH"."""
    lines: list[str] = []
    for widget in [root, *root.findChildren(QWidget)]:
        if widget is not root and (not widget.isVisibleTo(root) or widget.isWindow()):
            continue
        if not _inside_scroll_area(widget, root) and not _part_of_control(widget):
            lines += _squeezed(widget)
        lines += _text_cut(widget)
        lines += _outside(widget, root)
        if isinstance(widget, QGraphicsView) and widget.scene() is not None:
            lines += plot_cut(widget)
    return lines


def _part_of_control(widget: QWidget) -> bool:
    """A spin box's or a combo box's own line edit, which the style sizes inside it."""
    return isinstance(widget.parentWidget(), (QAbstractSpinBox, QComboBox))


def _name(widget: QWidget) -> str:
    text = widget.text() if hasattr(widget, "text") and callable(widget.text) else widget.objectName()
    return f"{type(widget).__name__} {str(text)[:40]!r}"


def _squeezed(widget: QWidget) -> list[str]:
    need, size = smallest_size(widget), widget.size()
    if size.width() < need.width() or size.height() < need.height():
        return [f"{_name(widget)} {size.width()}x{size.height()} < {need.width()}x{need.height()}"]
    return []


def smallest_size(widget: QWidget) -> QSize:
    """The least room a layout gives `widget` (Qt's own rule, qSmartMinSize): its minimum size
    hint where its size policy may shrink, else its size hint; nothing where the policy is
    Ignored; at most its maximum size, and its minimum size where one is set."""
    policy = widget.sizePolicy()
    hint, least = widget.sizeHint(), widget.minimumSizeHint()

    def side(direction, hinted: int, least_hinted: int) -> int:
        if direction == QSizePolicy.Ignored:
            return 0
        return least_hinted if direction.value & QSizePolicy.ShrinkFlag.value else max(hinted, least_hinted)

    need = QSize(side(policy.horizontalPolicy(), hint.width(), least.width()),
                 side(policy.verticalPolicy(), hint.height(), least.height())).boundedTo(widget.maximumSize())
    if widget.minimumWidth() > 0:
        need.setWidth(widget.minimumWidth())
    if widget.minimumHeight() > 0:
        need.setHeight(widget.minimumHeight())
    return need.expandedTo(QSize(0, 0))


# --- text in widgets -----------------------------------------------------------------------
def _text_cut(widget: QWidget) -> list[str]:
    if isinstance(widget, QLabel) and not isinstance(widget, QAbstractButton):
        return _label_cut(widget)
    if isinstance(widget, QLineEdit) and not widget.text() and widget.placeholderText():
        room = widget.contentsRect().width() - 8  # the frame's and the text's own margins
        need = widget.fontMetrics().horizontalAdvance(widget.placeholderText())
        if need > room + TOLERANCE:
            return [f"{_name(widget)} placeholder {widget.placeholderText()[:40]!r} needs {need} px of {room}"]
    if isinstance(widget, (QPlainTextEdit, QTextEdit)) and widget.document().isEmpty() and widget.placeholderText():
        return _placeholder_cut(widget)
    return []


def _label_cut(label: QLabel) -> list[str]:
    """A label's text against its room: on one line its natural width, wrapped the height its width needs."""
    if not label.text() or label.pixmap() is not None and not label.pixmap().isNull():
        return []
    if label.property(ELIDED):  # a label that shortens its own text with "…" (ui/status_line.py)
        return [f"{_name(label)} is shortened to fit {label.width()} px"]
    size = label.size()
    if label.wordWrap():
        need = label.heightForWidth(size.width())
        if need > size.height() + TOLERANCE:
            return [f"{_name(label)} wraps to {need} px high in {size.height()}"]
        return []
    need = label.sizeHint()
    if need.width() > size.width() + TOLERANCE or need.height() > size.height() + TOLERANCE:
        return [f"{_name(label)} shows {size.width()}x{size.height()} of {need.width()}x{need.height()}"]
    return []


def _placeholder_cut(edit: QPlainTextEdit | QTextEdit) -> list[str]:
    """A plain text box draws its placeholder word-wrapped from the top of its viewport (cut
    when the wrapped text is taller than the viewport); a rich one (QTextEdit, QTextBrowser) on
    one line (cut when wider)."""
    margin = int(edit.document().documentMargin())
    room = edit.viewport().rect().adjusted(margin, margin, -margin, -margin)
    text = edit.placeholderText()
    metrics = QFontMetrics(edit.font())
    if isinstance(edit, QTextEdit):
        need = metrics.horizontalAdvance(text)
        if need > room.width() + TOLERANCE:
            return [f"{_name(edit)} placeholder {text[:40]!r} needs {need} px of {room.width()}"]
        return []
    need = metrics.boundingRect(QRect(0, 0, max(1, room.width()), 1 << 20), int(Qt.AlignTop | Qt.TextWordWrap), text)
    if need.height() > room.height() + TOLERANCE:
        return [f"{_name(edit)} placeholder {text[:40]!r} wraps to {need.height()} px high in {room.height()}"]
    return []


# --- widgets out of sight ------------------------------------------------------------------
def _outside(widget: QWidget, root: QWidget) -> list[str]:
    if widget is root:
        return []
    parent = widget.parentWidget()
    if parent is None:
        return []
    scroll = parent.parentWidget()
    if isinstance(scroll, QAbstractScrollArea) and parent is scroll.viewport():
        return []  # the scrolled content itself: its scroll area shows a part of it by design
    lines = []
    if not parent.rect().contains(widget.geometry()):
        g = widget.geometry()
        lines.append(f"{_name(widget)} at {g.x()},{g.y()} {g.width()}x{g.height()} reaches out of its "
                     f"{parent.width()}x{parent.height()} parent")
    if widget.property(MUST_BE_SEEN):
        area = _scroll_area_of(widget, root)
        if area is not None:
            viewport = area.viewport()
            seen = QRect(widget.mapTo(viewport, QPoint(0, 0)), widget.size())
            if not viewport.rect().contains(seen):
                lines.append(f"{_name(widget)} lies outside the {type(area).__name__}'s view "
                             f"({seen.y()}..{seen.bottom()} of 0..{viewport.height()}): one has to scroll to find it")
    return lines


def _scroll_area_of(widget: QWidget, root: QWidget):
    parent = widget.parentWidget()
    while parent is not None and parent is not root:
        if isinstance(parent, QAbstractScrollArea) and not isinstance(parent, QGraphicsView):
            return parent
        parent = parent.parentWidget()
    return None


def _inside_scroll_area(widget: QWidget, root: QWidget) -> bool:
    parent = widget.parentWidget()
    while parent is not None and parent is not root:
        if isinstance(parent, QAbstractScrollArea) and widget is not parent:
            return True
        parent = parent.parentWidget()
    return False


# --- pyqtgraph plots -----------------------------------------------------------------------
def plot_cut(view: QGraphicsView) -> list[str]:
    """Text in a plot's scene that the plot does not show whole, and category ticks left out."""
    seen = view.mapToScene(view.viewport().rect()).boundingRect()
    lines = []
    for item in view.scene().items():
        if isinstance(item, QGraphicsTextItem) and item.isVisible() and item.toPlainText().strip():
            margin = item.document().documentMargin()
            text = item.sceneBoundingRect().adjusted(margin, margin, -margin, -margin)
            room = _clip_of(item, seen)
            if not room.adjusted(-TOLERANCE, -TOLERANCE, TOLERANCE, TOLERANCE).contains(text):
                shown = text.intersected(room)
                lines.append(f"plot text {item.toPlainText()[:50]!r} shows {shown.width():.0f}x{shown.height():.0f} "
                             f"of {text.width():.0f}x{text.height():.0f}")
    for axis in _axes(view):
        lines += _ticks_left_out(axis)
    return lines


def _clip_of(item: QGraphicsItem, seen: QRectF) -> QRectF:
    """The scene area `item` can show in: the view's, cut by every ancestor that clips its children."""
    room = QRectF(seen)
    parent = item.parentItem()
    while parent is not None:
        if parent.flags() & QGraphicsItem.ItemClipsChildrenToShape:
            room = room.intersected(parent.sceneBoundingRect())
        parent = parent.parentItem()
    return room


def _axes(view: QGraphicsView) -> list:
    import pyqtgraph as pg

    return [item for item in view.scene().items() if isinstance(item, pg.AxisItem) and item.isVisible()]


def _ticks_left_out(axis) -> list[str]:
    """The labels `charts.integer_ticks` gave `axis`, within its range, that it does not draw
    (pyqtgraph leaves out a label that would overlap another or run past the axis's end)."""
    wanted = getattr(axis, "category_ticks", None)
    if not wanted or axis.width() <= 0 or axis.height() <= 0:
        return []
    low, high = sorted(axis.range)
    wanted = [label for value, label in wanted if low <= value <= high]
    image = QImage(1, 1, QImage.Format_ARGB32)
    painter = QPainter(image)
    try:
        specs = axis.generateDrawSpecs(painter)
    finally:
        painter.end()
    drawn = {text for _, _, text in specs[2]} if specs else set()
    missing = [label for label in wanted if label not in drawn]
    if missing:
        return [f"axis {axis.labelText or axis.orientation!r} leaves out the tick label{'s' * (len(missing) > 1)} "
                f"{', '.join(missing)} of {', '.join(wanted)}"]
    return []
