"""The window's status line: whole phrases only, and at most one change a second while a
reply streams.

A status is phrases joined by " · ", most important first ("SmolLM2: no draft model, … ·
llama.cpp · target … · context 2048 · 2 threads"). `StatusLine` shows as many whole phrases
as its width holds and puts the whole text in its tooltip, so a narrow window drops the
last details instead of cutting a word in half. Only a first phrase too long for the line
is shortened with "…"; it then says so (`ELIDED`), for the clipping check (ui/clipping.py).

What auto decides can change every step; `set_live` changes the line at most once per
`LIVE_INTERVAL_S`. A live text after a quiet second shows at once and opens a window of that
length; texts arriving within it wait, and when it ends the one that came most often in it
is shown (the latest among equals) and the next window opens, so a choice that holds most
steps stays on screen and another that comes now and then never flickers in. Anything set
with `setText` (an error, a finished load) shows at once.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Callable, Optional

from PySide6.QtCore import QSize, Qt, QTimer, Signal
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget

SEPARATOR = " · "
LIVE_INTERVAL_S = 1.0
ELIDED = "specdeskElided"  # property: the text shown is cut short (the clipping check reports it)


class StatusLine(QLabel):
    changed = Signal(str)  # the whole text, each time it changes

    def __init__(self, parent: Optional[QWidget] = None, clock: Callable[[], float] = time.monotonic):
        super().__init__(parent)
        self._clock = clock
        self._full = ""
        self._detail = ""  # a tooltip set by the caller: why, at length
        self._changed_at = float("-inf")
        self._waiting: list[str] = []  # live texts that came within the interval
        self._timer = QTimer(self)  # the end of the window live texts wait in
        self._timer.setSingleShot(True)
        self._timer.setTimerType(Qt.PreciseTimer)  # a coarse timer may fire 5% early
        self._timer.timeout.connect(self._end_window)
        self.setTextFormat(Qt.PlainText)
        self.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)  # the status bar gives it the room there is

    # --- what is said ------------------------------------------------------------------
    def setText(self, text: str) -> None:  # noqa: N802 (Qt's name)
        """Show `text` now (and forget live texts waiting to be shown)."""
        self.cancel_live()
        self._show(text)

    def set_live(self, text: str) -> None:
        """Show `text` now after a quiet interval, else (the most common of the texts that came)
        when the interval ends."""
        if not self._timer.isActive():
            quiet = self._clock() - self._changed_at
            if quiet >= LIVE_INTERVAL_S:
                self._show(text)
                self._open_window(LIVE_INTERVAL_S)
                return
            self._open_window(LIVE_INTERVAL_S - quiet)
        self._waiting.append(text)

    def cancel_live(self) -> None:
        """Forget live texts waiting to be shown (the window closes)."""
        self._timer.stop()
        self._waiting.clear()

    def setToolTip(self, text: str) -> None:  # noqa: N802
        self._detail = text
        self._fit()

    def full_text(self) -> str:
        return self._full

    def _open_window(self, seconds: float) -> None:
        self._timer.start(max(1, math.ceil(seconds * 1000)))

    def _end_window(self) -> None:
        """The most common text of the window that ended, and the next window (none when it was empty)."""
        if not self._waiting:
            return
        counts = Counter(self._waiting)
        most = max(counts.values())
        text = next(t for t in reversed(self._waiting) if counts[t] == most)
        self._waiting.clear()
        self._show(text)
        self._open_window(LIVE_INTERVAL_S)

    def _show(self, text: str) -> None:
        changed = text != self._full
        if changed:
            self._changed_at = self._clock()
        self._full = text
        self._fit()
        if changed:
            self.changed.emit(text)

    # --- fitting -----------------------------------------------------------------------
    def _fit(self) -> None:
        """As many whole phrases as the width holds; the whole text in the tooltip when some are left out."""
        parts = self._full.split(SEPARATOR) if self._full else []
        room = self.contentsRect().width() - 2 * self.margin()
        metrics = self.fontMetrics()
        shown = ""
        for count in range(len(parts), 0, -1):
            candidate = SEPARATOR.join(parts[:count])
            if metrics.horizontalAdvance(candidate) <= room:
                shown = candidate
                break
        elided = bool(parts) and not shown
        if elided:  # not even the first phrase fits: shortened, and said to be
            shown = metrics.elidedText(parts[0], Qt.ElideRight, max(0, room))
        self.setProperty(ELIDED, elided)
        super().setText(shown)
        tips = [self._full] if shown != self._full else []
        if self._detail and self._detail not in tips:
            tips.append(self._detail)
        super().setToolTip("\n\n".join(tips))

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._fit()

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        """A few words' width: the window's width is never held up by a long status."""
        return QSize(self.fontMetrics().averageCharWidth() * 16, super().minimumSizeHint().height())

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(self.fontMetrics().horizontalAdvance(super().text()) + 2 * self.margin() + 2,
                     super().sizeHint().height())
