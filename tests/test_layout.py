"""The window's layout and chrome: it fits 1024x640 and a 150% font with nothing squeezed, the
charts fold under the chat when narrow, the menus (File, View with theme and zoom, Settings,
Help), the tab order, and readable model names (real Qt offscreen, no model loaded)."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")
pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QApplication, QGraphicsView, QLabel, QWidget  # noqa: E402

from specdesk.app.models.library import demo_name  # noqa: E402
from specdesk.app.storage.history import History  # noqa: E402
from specdesk.app.storage.settings import Settings, load_settings  # noqa: E402
from specdesk.engines.types import SpecDeskError  # noqa: E402
from specdesk.ui import theme  # noqa: E402
from specdesk.ui.clipping import clipped  # noqa: E402
from specdesk.ui.layout import FoldingSplitter  # noqa: E402
from specdesk.ui.main_window import MainWindow  # noqa: E402
from specdesk.ui.model_tables import model_label  # noqa: E402


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    """A main window on scratch settings and history, nothing loaded; the look restored after."""
    monkeypatch.setenv("SPECDESK_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("SPECDESK_DATA_DIR", str(tmp_path / "data"))
    made = []

    def make(settings: Settings | None = None) -> MainWindow:
        w = MainWindow(settings or Settings(), History(tmp_path / "history.sqlite3"),
                       settings_file=tmp_path / "settings.json", autoload=False)
        w.models_view._scan_when_shown = False  # the layout, not this machine's library
        qtbot.addWidget(w)
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()
    app = QApplication.instance()
    theme.apply_theme(app, "system")
    theme.apply_font_scale(app, 1.0)


def show_at(qtbot, w: MainWindow, width: int, height: int) -> None:
    w.resize(width, height)
    w.show()
    qtbot.waitExposed(w)
    QApplication.processEvents()


def squeezed_tabs(w: MainWindow) -> dict[str, list[str]]:
    found = {}
    for index in range(w.tabs.count()):
        w.tabs.setCurrentIndex(index)
        QApplication.processEvents()
        lines = clipped(w)
        if lines:
            found[w.tabs.tabText(index)] = lines
    return found


def test_the_window_fits_1024x640_with_nothing_clipped_on_any_tab(qtbot, window):
    w = window()
    show_at(qtbot, w, 1024, 640)
    assert (w.width(), w.height()) == (1024, 640)
    assert squeezed_tabs(w) == {}
    assert (w.width(), w.height()) == (1024, 640)
    assert w.controls.verticalScrollBar().maximum() > 0  # the left panel scrolls
    w.tabs.setCurrentWidget(w.models_view)
    QApplication.processEvents()
    library = w.models_view.library  # most of the Models tab's height: several rows, not one
    assert library.viewport().height() >= 6 * library.verticalHeader().defaultSectionSize()


def test_the_charts_fold_under_the_chat_in_a_narrow_window(qtbot, window):
    w = window()
    show_at(qtbot, w, 900, 700)
    assert (w.width(), w.height()) == (900, 700)
    assert w._chat_splitter.orientation() == Qt.Vertical
    assert w.charts.y() > w.chat_view.y() and w.charts.width() > w.chat_view.width() // 2
    charts = w.charts  # under the chat, in two columns: the transcript keeps the height
    assert charts.columns == 2 and charts.rate_plot.y() == charts.acceptance_plot.y()
    assert charts.position_plot.y() > charts.rate_plot.y()
    assert squeezed_tabs(w) == {}
    w.tabs.setCurrentIndex(0)
    w.resize(1280, 800)  # wide again: beside the chat, one column
    QApplication.processEvents()
    assert w._chat_splitter.orientation() == Qt.Horizontal and charts.columns == 1
    assert charts.acceptance_plot.y() > charts.rate_plot.y()
    assert squeezed_tabs(w) == {}


@pytest.mark.parametrize("size", [(1280, 800), (1024, 640)])
def test_a_150_percent_font_fits(qtbot, window, size):
    theme.apply_font_scale(QApplication.instance(), 1.5)
    w = window()
    show_at(qtbot, w, *size)
    assert (w.width(), w.height()) == size
    assert squeezed_tabs(w) == {}


def test_the_charts_sit_beside_the_chat_in_a_wide_window(qtbot, window):
    w = window()
    show_at(qtbot, w, 1920, 1080)
    assert w._chat_splitter.orientation() == Qt.Horizontal
    assert w.charts.width() >= w.charts.minimumWidth()
    assert squeezed_tabs(w) == {}


def test_a_folding_splitter_stacks_its_panes_when_they_do_not_fit_side_by_side(qtbot):
    splitter = FoldingSplitter()
    qtbot.addWidget(splitter)
    for width in (300, 200):
        pane = QWidget()
        pane.setMinimumSize(width, 100)
        splitter.addWidget(pane)
    assert splitter.minimumSizeHint().width() == 300  # the widest pane, not the sum
    splitter.resize(400, 400)
    splitter.show()
    QApplication.processEvents()
    assert splitter.orientation() == Qt.Vertical
    assert splitter.minimumSizeHint().height() == 200 + splitter.handleWidth()
    splitter.resize(300 + 200 + splitter.handleWidth(), 400)
    QApplication.processEvents()
    assert splitter.orientation() == Qt.Horizontal
    assert all(splitter.widget(i).width() >= splitter.widget(i).minimumWidth() for i in range(2))


def test_clipped_names_a_widget_given_less_than_its_minimum(qtbot):
    root = QWidget()
    qtbot.addWidget(root)
    label = QLabel("a label far wider than the room it is given", root)
    label.resize(20, 10)
    root.resize(300, 100)
    root.show()
    squeezed, cut = clipped(root)  # less room than its minimum, and its text cut
    assert squeezed.startswith("QLabel 'a label far wider") and "20x10 <" in squeezed
    assert cut.startswith("QLabel 'a label far wider") and " shows 20x10 of " in cut
    label.resize(label.minimumSizeHint())
    assert clipped(root) == []


def test_the_menus_zoom_and_theme_are_kept_in_settings(qtbot, window, tmp_path):
    w = window()
    show_at(qtbot, w, 1280, 800)
    titles = [a.text().replace("&", "") for a in w.menuBar().actions()]
    assert titles == ["File", "View", "Settings", "Servers", "Help"]
    shortcuts = {a.text(): a.shortcut().toString() for menu in w.menuBar().actions()
                 for a in menu.menu().actions() if not a.isSeparator()}
    assert shortcuts["Zoom in"] == "Ctrl+=" and shortcuts["Zoom out"] == "Ctrl+-" and shortcuts["Reset zoom"] == "Ctrl+0"
    assert {"New chat", "Open GGUF file…", "Open model folder…", "Quit", "About SpecDesk…", "Documentation"} <= set(shortcuts)

    app = QApplication.instance()
    size = app.font().pointSizeF()
    qtbot.keyClick(w, Qt.Key_Equal, Qt.ControlModifier)
    assert w.settings.font_scale == pytest.approx(1.1)
    assert app.font().pointSizeF() == pytest.approx(size * 1.1)
    w.zoom(-1)
    w.zoom(-1)
    assert w.settings.font_scale == pytest.approx(0.9)
    qtbot.keyClick(w, Qt.Key_0, Qt.ControlModifier)
    assert w.settings.font_scale == 1.0 and app.font().pointSizeF() == pytest.approx(size)

    w.theme_actions["dark"].trigger()
    assert w.settings.theme == "dark" and theme.is_dark()
    w.zoom(2)
    w.save_settings()
    kept = load_settings(tmp_path / "settings.json")
    assert (kept.theme, kept.font_scale) == ("dark", pytest.approx(1.2))
    w.theme_actions["system"].trigger()
    assert not theme.is_dark() and w.settings.theme == "system"

    # a window opened on those settings comes up dark and zoomed
    again = window(kept)
    assert theme.is_dark() and app.font().pointSizeF() == pytest.approx(size * 1.2)
    assert again.theme_actions["dark"].isChecked()


def test_zoom_steps_stay_in_range_and_bad_values_are_refused(qapp):
    assert theme.zoomed(1.0, 1) == pytest.approx(1.1)
    assert theme.zoomed(1.7, 0) == 1.0
    assert theme.zoomed(3.0, 1) == 3.0 and theme.zoomed(0.5, -1) == 0.5
    with pytest.raises(SpecDeskError, match="out of range"):
        theme.apply_font_scale(qapp, 7.0)
    with pytest.raises(SpecDeskError, match="unknown theme 'neon'"):
        theme.apply_theme(qapp, "neon")
    assert Settings.checked({"theme": "neon", "font_scale": 9.0})[1] == ["theme", "font_scale"]


def test_the_settings_menu_hides_and_shows_the_left_panel(qtbot, window):
    w = window()
    show_at(qtbot, w, 1024, 640)
    w.settings_panel_action.trigger()
    assert not w.controls.isVisible()
    w.settings_panel_action.trigger()
    assert w.controls.isVisible()


def test_tab_goes_input_send_then_the_settings_and_skips_the_charts(qtbot, window):
    w = window()
    show_at(qtbot, w, 1280, 800)
    chain, widget = [], w.chat_view.input
    for _ in range(1000):  # the whole focus chain, once round
        chain.append(widget)
        widget = widget.nextInFocusChain()
        if widget is w.chat_view.input:
            break
    stops = [x for x in chain if x.focusPolicy() & Qt.TabFocus and x.isVisible()]
    assert not [x for x in stops if isinstance(x, QGraphicsView)]  # no chart takes focus
    assert w.chat_view.transcript not in stops  # read-only: focus on a click
    c = w.controls
    order = [next(i for i, x in enumerate(chain) if x is wanted)
             for wanted in (w.chat_view.input, w.chat_view.send_button, c.target_combo, c.method_combo,
                            c.temperature_spin, c.rpc_edit)]
    assert order == sorted(order)
    between = [x for x in stops[1:] if chain.index(x) < order[2]]  # input → … → the left panel
    assert not [x for x in between if w.charts.isAncestorOf(x) or w.compare_view.isAncestorOf(x)]


def test_demo_models_have_readable_names_and_keep_the_path_for_the_tooltip(tmp_path):
    build = tmp_path / "98f105ffed652d84"
    build.mkdir()
    (build / "card.json").write_text(json.dumps({"family": "small"}), encoding="utf-8")
    target = build / "specdesk-demo-target-F16.gguf"
    assert demo_name(target) == "Demo target, small family"
    assert demo_name(build / "dflash-hf") == "Demo DFlash drafter, small family"
    label = model_label(demo_name(target), str(target))
    assert not re.search(r"[0-9a-f]{8}", label), label
    (build / "card.json").write_text("not json", encoding="utf-8")
    assert demo_name(target) == "Demo target"


def auto_run(charts, methods: list[str]) -> None:
    """An auto run that drafts with each of `methods` in turn, fed to the charts as the worker does."""
    from types import SimpleNamespace

    from specdesk.engines.types import StepEvent

    def event(method: str) -> StepEvent:
        k, accepted = (0, 0) if method == "none" else (3, 2)
        return StepEvent(tokens=(1,) * (accepted + 1), text="x", drafted=k, accepted=accepted,
                         position_accepted=tuple(i < accepted for i in range(k)), from_draft=(True,) * accepted + (False,),
                         draft_s=0.0, verify_s=0.02, method=method, reason=f"{method}, k = {k}: expected 1.30x")

    events = [event(m) for m in methods for _ in range(40)]
    times = [0.02 * (i + 1) for i in range(len(events))]
    for i in range(0, len(events), 10):
        charts.add_batch(SimpleNamespace(first=i == 0, k=4, events=events[i:i + 10], times=times[i:i + 10]))
        for _ in range(6):  # the slow rate: every sixth refresh
            charts.refresh()
    charts.finish_run(charts.current_stats())
    charts.refresh()


@pytest.mark.parametrize("size, zoom", [((1024, 640), 1.0), ((1280, 800), 1.0), ((1024, 640), 1.5)])
def test_an_auto_run_of_four_methods_shows_its_whole_legend_and_titles(qtbot, window, size, zoom):
    """At 150% a legend drawn in the tokens/s chart was cut by the chart's edge ("ngram-pool"
    not shown at all): the legend is a line of its own above the charts."""
    theme.apply_font_scale(QApplication.instance(), zoom)
    w = window(Settings(first_run_done=True))
    show_at(qtbot, w, *size)
    auto_run(w.charts, ["none", "ngram", "ngram-pool", "draft"])
    QApplication.processEvents()
    labels = w.charts.method_legend.labels
    assert labels == ["no speculation", "ngram", "ngram-pool", "draft"] and w.charts.method_legend.isVisible()
    assert clipped(w) == []


def busy_auto_report():
    """A finished compare of method auto on a busy machine, as the worker hands it over: seven runs
    whose pace varies tenfold (long ranges to show), auto's shares and costs."""
    from specdesk.app.runtime.compare import CompareReport, PromptResult
    from specdesk.app.runtime.generation import RunResult
    from specdesk.engines.types import RunStats

    auto = {"steps": 96, "steps_by_choice": {"none": 0.9, "ngram k=1": 0.05, "ngram-pool k=2": 0.05},
            "costs": {"pass_ms": [62.56, 498.96, 500.52, 501.7], "measured_sizes": [1],
                      "draft_token_ms": {"ngram": 0.012, "ngram-pool": 0.02}}}

    def run(seconds: float, speculative: bool) -> RunResult:
        stats = RunStats(96, seconds, 94 if speculative else 96, 8 if speculative else 0, 2 if speculative else 0,
                         0.0, seconds, (4, 4) if speculative else (), (1, 1) if speculative else (),
                         (92, 2) if speculative else (96,))
        return RunResult(tuple(range(96)), "a hash table " * 20, stats, "length", auto if speculative else None)

    runs = [(PromptResult("Explain a hash table.", run(base, False), run(spec, True)),)
            for base, spec in ((4.5, 12.2), (22.8, 5.6), (8.4, 36.5), (4.6, 23.3), (9.1, 12.0), (8.2, 9.3), (20.0, 8.1))]
    return CompareReport("llama.cpp", "SmolLM2-135M-Instruct.Q4_1.gguf", None, "auto", 4, 0.0, runs[0], (), "CPU",
                         tuple(runs[1:]), (6.8, 2))


@pytest.mark.parametrize("size", [(1024, 640), (1280, 800)])
def test_a_finished_auto_compare_keeps_the_window_its_size_with_nothing_cut(qtbot, window, size):
    from specdesk.engines.types import SpecConfig

    w = window(Settings(first_run_done=True))
    show_at(qtbot, w, *size)
    view = w.compare_view
    w.tabs.setCurrentWidget(view)
    baseline, speculative = w.backend.arm_titles(SpecConfig(method="auto", k=4))
    view.baseline_pane.setTitle(f"Baseline ({baseline})")
    view.speculative_pane.setTitle(f"Speculative ({speculative})")
    view.set_placement("target CPU · draft CPU")
    view.show_report(busy_auto_report())
    QApplication.processEvents()
    assert view.auto_table.isVisible() and "busy machine" in view.verdict.text()
    assert (w.width(), w.height()) == size
    assert clipped(w) == []


def test_plot_titles_grow_back_to_their_longest_wording_when_the_window_widens(qtbot, window):
    w = window(Settings(first_run_done=True))
    show_at(qtbot, w, 1024, 640)
    w.tabs.setCurrentWidget(w.compare_view)
    plot = w.compare_view.position_plot  # three plots side by side: a short title at this width
    qtbot.waitUntil(lambda: plot.title_fit.shown == "acceptance per draft position", timeout=2000)
    w.resize(1920, 1080)
    qtbot.waitUntil(lambda: plot.title_fit.shown == "speculative: acceptance per draft position", timeout=2000)
    assert clipped(w) == []
