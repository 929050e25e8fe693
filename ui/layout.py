"""Layout helpers that keep the window usable when it is small or its font is large.

`FoldingSplitter` puts its two panes side by side while both fit at their minimum width and
one above the other when they do not (the Chat tab's charts fold under the transcript).
What a user would see cut is listed by ui/clipping.clipped.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtWidgets import QSplitter, QWidget


def side_by_side_width(widths: list[int], handle: int) -> int:
    """The width a row of panes needs: their minimum widths and the handles between them."""
    return sum(widths) + handle * max(0, len(widths) - 1)


class FoldingSplitter(QSplitter):
    """Side by side when wide enough for every pane's minimum width, else stacked.

    Its minimum width is the widest pane's, so the window can be narrower than the panes side
    by side; its minimum height is what the current orientation needs. `folded` says when it
    stacks (True) or unstacks, for panes that arrange themselves for it."""

    folded = Signal(bool)

    def __init__(self, parent: QWidget | None = None, share: float = 0.6):
        super().__init__(Qt.Horizontal, parent)
        self.share = share  # the first pane's part of the room after a fold or unfold

    def _pane_mins(self) -> list[QSize]:
        return [self.widget(i).minimumSizeHint().expandedTo(self.widget(i).minimumSize())
                for i in range(self.count()) if not self.widget(i).isHidden()]

    def wide_enough(self, width: int) -> bool:
        return width >= side_by_side_width([m.width() for m in self._pane_mins()], self.handleWidth())

    def minimumSizeHint(self) -> QSize:
        mins = self._pane_mins()
        if not mins:
            return super().minimumSizeHint()
        if self.orientation() == Qt.Horizontal:
            height = max(m.height() for m in mins)
        else:
            height = side_by_side_width([m.height() for m in mins], self.handleWidth())
        return QSize(max(m.width() for m in mins), height)

    def fit(self, width: int, height: int) -> None:
        """The orientation for this size; after a change, the first pane gets `share` of the room."""
        orientation = Qt.Horizontal if self.wide_enough(width) else Qt.Vertical
        if orientation == self.orientation():
            return
        self.setOrientation(orientation)
        self.folded.emit(orientation == Qt.Vertical)
        room = width if orientation == Qt.Horizontal else height
        first = int(room * self.share)
        self.setSizes([first, max(0, room - first)])
        self.updateGeometry()

    def resizeEvent(self, event) -> None:
        self.fit(event.size().width(), event.size().height())
        super().resizeEvent(event)


def quiet_focus(root: QWidget) -> None:
    """Charts and read-only text take focus only when clicked: Tab skips them."""
    from PySide6.QtWidgets import QGraphicsView, QPlainTextEdit, QTextEdit

    for widget in root.findChildren(QWidget):
        if isinstance(widget, QGraphicsView):  # pyqtgraph's plots
            widget.setFocusPolicy(Qt.NoFocus)
        elif isinstance(widget, (QTextEdit, QPlainTextEdit)) and widget.isReadOnly():
            widget.setFocusPolicy(Qt.ClickFocus)


def focus_chain(widgets: list[QWidget]) -> None:
    """Tab visits `widgets` in this order."""
    for first, second in zip(widgets, widgets[1:]):
        QWidget.setTabOrder(first, second)
