"""The status line (ui/status_line.py): auto's choice, which can change every step, changes the
line at most once a second and shows the choice that held most of that second; anything else
shows at once; a long status keeps whole phrases in view (real Qt offscreen, real time)."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtWidgets import QApplication  # noqa: E402

from specdesk.ui.status_line import LIVE_INTERVAL_S, StatusLine  # noqa: E402

MOSTLY = "auto · ngram, k = 2: expected 1.3x"
NOW_AND_THEN = "auto · no speculation: nothing is expected to pay"


def test_a_choice_that_changes_every_step_changes_the_line_at_most_once_a_second(qtbot):
    status = StatusLine()
    qtbot.addWidget(status)
    status.resize(900, 30)
    shown: list[tuple[float, str]] = []
    status.changed.connect(lambda text: shown.append((time.monotonic(), text)))
    status.setText("loaded")
    end = time.monotonic() + 3.2
    step = 0
    while time.monotonic() < end:  # twenty steps a second, one in four another choice
        status.set_live(NOW_AND_THEN if step % 4 == 3 else MOSTLY)
        step += 1
        qtbot.wait(50)
    qtbot.wait(int(LIVE_INTERVAL_S * 1000) + 100)  # the last window ends
    times = [t for t, _ in shown]
    assert len(shown) >= 2 and step >= 30
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert min(gaps) >= LIVE_INTERVAL_S * 0.95, gaps  # never sooner than a second after the last change
    assert [text for _, text in shown] == ["loaded", MOSTLY], shown  # the other choice never flickers in


def test_a_set_text_shows_at_once_and_drops_a_waiting_choice(qtbot):
    status = StatusLine()
    qtbot.addWidget(status)
    status.resize(900, 30)
    status.set_live(MOSTLY)
    status.set_live(NOW_AND_THEN)  # within the second: it waits
    assert status.text() == MOSTLY
    status.setText("error: the engine process stopped")
    assert status.text() == "error: the engine process stopped"
    qtbot.wait(int(LIVE_INTERVAL_S * 1000) + 200)
    assert status.text() == "error: the engine process stopped"


def test_a_long_status_keeps_whole_phrases_and_the_rest_in_its_tooltip(qtbot):
    status = StatusLine()
    qtbot.addWidget(status)
    text = ("SmolLM2-135M-Instruct.Q4_1.gguf: no draft here fits its vocabulary; Auto drafts without one · "
            "SmolLM2-135M-Instruct.Q4_1.gguf (134.5 M parameters) · no draft model · llama.cpp · context 2048 · "
            "2 threads · target CPU")
    status.setText(text)
    status.resize(700, 30)
    status.show()
    QApplication.processEvents()
    shown = status.text()
    assert text.startswith(shown) and shown != text and not shown.endswith(" ·")
    assert shown.split(" · ") == text.split(" · ")[:len(shown.split(" · "))]  # whole phrases
    assert text in status.toolTip()
    assert status.fontMetrics().horizontalAdvance(shown) <= status.contentsRect().width()
    status.resize(3000, 30)
    QApplication.processEvents()
    assert status.text() == text
