"""The clipping check (ui/clipping.py) sees what a user sees cut: each case a user met at
1024x640 is built here on its own, found by the check, and no longer found once it has room
(real Qt offscreen, real pyqtgraph)."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")
pytest.importorskip("pytestqt")

import pyqtgraph as pg  # noqa: E402
from PySide6.QtWidgets import (QApplication, QLabel, QListWidget, QPlainTextEdit, QScrollArea, QSizePolicy,  # noqa: E402
                               QTextBrowser, QVBoxLayout, QWidget)

from specdesk.ui.charts import integer_ticks, make_plot  # noqa: E402
from specdesk.ui.clipping import clipped, must_be_seen  # noqa: E402
from specdesk.ui.status_line import StatusLine  # noqa: E402


def shown(qtbot, widget: QWidget, width: int, height: int) -> QWidget:
    qtbot.addWidget(widget)
    widget.resize(width, height)
    widget.show()
    qtbot.waitExposed(widget)
    QApplication.processEvents()
    return widget


def in_column(*widgets: QWidget) -> QWidget:
    root = QWidget()
    layout = QVBoxLayout(root)
    for widget in widgets:
        layout.addWidget(widget)
    return root


def test_a_label_too_narrow_for_its_text_is_cut(qtbot):
    label = QLabel("speculative: acceptance per draft position")
    label.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)  # the layout may give it less than its text
    root = shown(qtbot, in_column(label), 120, 60)
    [line] = clipped(root)
    assert line.startswith("QLabel 'speculative: acceptance per draft") and " shows " in line
    root.resize(600, 60)
    QApplication.processEvents()
    assert clipped(root) == []


def test_a_wrapped_label_taller_than_its_room_is_cut(qtbot):
    label = QLabel("a long explanation " * 12)
    label.setWordWrap(True)
    label.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Fixed)
    label.setFixedHeight(label.fontMetrics().lineSpacing() * 2)
    root = shown(qtbot, in_column(label), 200, 100)
    [line] = clipped(root)
    assert line.startswith("QLabel 'a long explanation") and "wraps to" in line
    label.setFixedHeight(label.heightForWidth(label.width()))
    QApplication.processEvents()
    assert clipped(root) == []


def test_a_status_line_drops_whole_phrases_and_says_when_it_must_shorten_one(qtbot):
    status = StatusLine()
    status.setText("SmolLM2: no draft model · llama.cpp · context 2048 · 2 threads")
    root = shown(qtbot, in_column(status), 240, 40)
    assert status.text() != status.full_text() and status.full_text().startswith(status.text())
    assert status.full_text() in status.toolTip() and clipped(root) == []  # whole phrases: nothing cut
    root.resize(60, 40)
    QApplication.processEvents()
    [line] = clipped(root)
    assert "shortened" in line


def test_a_placeholder_taller_than_its_box_is_cut(qtbot):
    box = QPlainTextEdit()
    box.setPlaceholderText("Type a message below. Tokens the target accepted from the draft are highlighted as "
                           "they stream in.")
    box.setFixedHeight(box.fontMetrics().lineSpacing() + 14)
    root = shown(qtbot, in_column(box), 240, 80)
    [line] = clipped(root)
    assert "placeholder 'Type a message below." in line
    box.setPlaceholderText("Message")
    assert clipped(root) == []


def test_a_transcripts_placeholder_wider_than_it_is_cut(qtbot):
    transcript = QTextBrowser()  # a rich text box draws its placeholder on one line
    transcript.setPlaceholderText("Type a message below. Tokens the target accepted from the draft are highlighted "
                                  "as they stream in.")
    root = shown(qtbot, in_column(transcript), 420, 300)
    [line] = clipped(root)
    assert line.startswith("QTextBrowser") and "placeholder 'Type a message below." in line
    transcript.setPlaceholderText("Type a message below.")
    assert clipped(root) == []


def test_a_list_one_must_scroll_the_panel_to_find_is_out_of_view(qtbot):
    content = QWidget()
    layout = QVBoxLayout(content)
    filler = QLabel("settings")
    filler.setMinimumHeight(400)
    chats = QListWidget()
    chats.setMinimumHeight(120)
    must_be_seen(chats)
    layout.addWidget(filler)
    layout.addWidget(chats)
    area = QScrollArea()
    area.setWidgetResizable(True)
    area.setWidget(content)
    root = shown(qtbot, in_column(area), 300, 300)
    [line] = clipped(root)
    assert line.startswith("QListWidget") and "one has to scroll to find it" in line
    root.resize(300, 700)
    QApplication.processEvents()
    assert clipped(root) == []


def test_a_widget_reaching_out_of_its_parent_is_cut(qtbot):
    root = shown(qtbot, QWidget(), 200, 100)
    child = QLabel("x", root)
    child.setGeometry(150, 10, 100, 20)
    child.show()
    assert any("reaches out of its 200x100 parent" in line for line in clipped(root))
    child.setGeometry(10, 10, 100, 20)
    assert clipped(root) == []


def test_a_plot_title_wider_than_the_plot_is_cut(qtbot):
    plot = make_plot("speculative: acceptance per draft position", "draft position")
    root = shown(qtbot, in_column(plot), 180, 200)
    lines = clipped(root)
    assert any(line.startswith("plot text 'speculative: acceptance per draft position' shows") for line in lines), lines
    root.resize(700, 200)
    QApplication.processEvents()
    assert clipped(root) == []


def test_a_legend_wider_than_its_chart_is_cut(qtbot):
    plot = make_plot("tokens / s", "seconds")
    view = plot.getPlotItem().vb
    legend = pg.LegendItem(colCount=4, labelTextSize="8pt")
    legend.setParentItem(view)  # a ViewBox clips its children to itself
    legend.anchor((1, 0), (1, 0))
    for name in ("no speculation", "ngram", "ngram-pool", "draft"):
        legend.addItem(pg.BarGraphItem(x=[0], height=[1], width=1), name)
    root = shown(qtbot, in_column(plot), 200, 200)
    lines = clipped(root)
    assert any(line.startswith("plot text 'ngram-pool'") or line.startswith("plot text 'no speculation'")
               for line in lines), lines
    legend.setColumnCount(1)
    root.resize(260, 300)
    QApplication.processEvents()
    assert not [line for line in clipped(root) if "plot text" in line]


def test_category_ticks_the_axis_has_no_room_for_are_missing(qtbot):
    plot = make_plot("k", "k (draft tokens per step)")
    plot.setXRange(0.5, 8.5, padding=0)
    integer_ticks(plot, list(range(1, 9)))
    axis = plot.getAxis("bottom")
    axis.setStyle(tickFont=QApplication.font())
    root = shown(qtbot, in_column(plot), 90, 160)
    lines = clipped(root)
    assert any("leaves out the tick label" in line for line in lines), lines
    root.resize(600, 160)
    QApplication.processEvents()
    assert not [line for line in clipped(root) if "tick label" in line]
