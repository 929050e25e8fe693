"""A model of one's own in the window, offscreen, on real llama.cpp: a GGUF with another
vocabulary than the demo's (the zoo's qwen2: a real tokenizer and chat template) loaded every
way a target loads while the demo draft is selected (File ▸ Open, a library row, the
first-run card's pair, `specdesk gui --target`, the target picker). No dialog appears, no
error stays in the status line, the status says which draft (or none) goes with the target
and why, and the demo draft is no longer offered for it. Then what the window says about the
model: the Compare tab's prompt suits a chat model, the first-run card goes, the compare
keeps its own temperature."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtWidgets import QFileDialog, QMessageBox  # noqa: E402

from specdesk.app.storage.settings import DEMO, Settings  # noqa: E402
from specdesk.ui.compare_view import CHAT_PROMPT, CODE_PROMPT  # noqa: E402
from specdesk.ui.main_window import MainWindow  # noqa: E402
from specdesk.ui.job_thread import running_threads  # noqa: E402

TIMEOUT_MS = 300_000  # a bound on a broken run only: a loaded 2-core machine is slow
DEMO_DRAFT_LABEL = "Demo draft (built in)"


@pytest.fixture(scope="module")
def qwen() -> dict[str, str]:
    """Another family's small pair (151,936 tokens against the demo's 4,096), built once into
    the suite's cache before a test points the demo cache elsewhere."""
    from benchmarks import zoo

    return zoo.build("qwen2", "F16", small=True)


@pytest.fixture
def user(tmp_path, monkeypatch, demo_family, demo_cache_dir, qwen):
    """A user's settings and data; the demo family the suite built, found where the app looks
    for it; message boxes recorded instead of shown."""
    monkeypatch.setenv("SPECDESK_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("SPECDESK_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SPECDESK_CACHE_DIR", str(demo_cache_dir))
    shown = []
    for kind in ("critical", "warning", "question", "information"):
        monkeypatch.setattr(QMessageBox, kind, lambda parent, title, text, *a, kind=kind, **k: shown.append((kind, text)))
    return shown


def on_the_demo(qtbot, **values) -> MainWindow:
    """The window as a new user has it: the demo target with the demo draft, method draft."""
    settings = Settings(**{"target_path": DEMO, "draft_path": DEMO, "demo_size": "small", "method": "draft", "k": 3,
                           "threads": 1, "max_tokens": 16, "first_run_done": True, **values})
    window = MainWindow(settings, autoload=False)
    qtbot.addWidget(window)
    window.resize(1280, 800)
    window.show()
    with loaded(qtbot, window):
        window.load_models()
    settle(qtbot, window)
    assert window.info.draft_path and window.controls.draft_combo.currentData() == DEMO
    return window


def loaded(qtbot, window: MainWindow):
    return qtbot.waitSignal(window.worker.loaded, timeout=TIMEOUT_MS)


def settle(qtbot, window: MainWindow) -> None:
    """Until the load, a refused draft's handling and auto's cost probe are all done."""
    qtbot.waitUntil(lambda: not window.worker.busy and window._load_job is None, timeout=TIMEOUT_MS)
    qtbot.wait(50)


def offered_drafts(window: MainWindow) -> list[str]:
    combo = window.controls.draft_combo
    return [combo.itemText(i) for i in range(combo.count()) if combo.model().item(i).isEnabled()]


def assert_quietly_without_the_demo_draft(window: MainWindow, target: str, shown: list) -> str:
    assert shown == [] and window.errors_shown == 0
    assert window.info.target_path == target and window.info.draft_path is None
    status = window.status_label.full_text()
    assert "not compatible" not in status and "error" not in status
    first = status.split(" · ")[0]  # the status's first phrase: what goes with the model, and why
    assert ": no draft" in first and "Auto drafts without one" in first and "demo" in first, status
    assert window.controls.method() == "auto"  # the draft method had nothing to draft with
    assert DEMO_DRAFT_LABEL not in offered_drafts(window)
    return status


def test_file_open_loads_another_vocabulary_without_the_demo_draft_and_says_why(qtbot, user, qwen, monkeypatch):
    window = on_the_demo(qtbot)
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (qwen["target_gguf"], "GGUF models (*.gguf)"))
    action = next(a for a in window.menuBar().actions()[0].menu().actions() if a.text() == "Open GGUF file…")
    with loaded(qtbot, window):
        action.trigger()
    settle(qtbot, window)
    status = assert_quietly_without_the_demo_draft(window, qwen["target_gguf"], user)
    assert "made for the demo target only" in status
    window.close()
    assert running_threads() == []


def test_a_library_row_loads_another_vocabulary_without_the_demo_draft(qtbot, user, qwen):
    window = on_the_demo(qtbot)
    with loaded(qtbot, window):
        window.models_view.use_model.emit(qwen["target_gguf"])  # a library row's Use this model
    settle(qtbot, window)
    assert_quietly_without_the_demo_draft(window, qwen["target_gguf"], user)
    window.close()


def test_the_target_picker_drops_the_demo_draft_the_new_target_refuses(qtbot, user, qwen, demo_family):
    """Picking a recent target keeps the draft if it fits; the demo draft does not, and is
    dropped with its reason (the engine's own check), not reported as an error."""
    window = on_the_demo(qtbot, recent_targets=[qwen["target_gguf"]])
    combo = window.controls.target_combo
    with loaded(qtbot, window):
        combo.setCurrentIndex(combo.findData(qwen["target_gguf"]))
        combo.activated.emit(combo.currentIndex())
    settle(qtbot, window)
    status = assert_quietly_without_the_demo_draft(window, qwen["target_gguf"], user)
    assert "vocab size 151936 vs " in status  # the engine's own reason: its vocabulary against the demo's
    assert window.settings.draft_path is None  # it does not come back with the next start
    # a draft chosen for this very target and refused is the user's to read: a dialog
    with qtbot.waitSignal(window.worker.errored, timeout=TIMEOUT_MS):
        window.controls.set_model("draft", demo_family["draft_gguf"])
    assert len(user) == 1 and "vocab size" in user[0][1] and window.errors_shown == 1
    window.close()


def test_the_first_run_cards_pair_loads_with_its_own_draft(qtbot, user, qwen):
    window = on_the_demo(qtbot, first_run_done=False)
    card = window.first_run
    assert card is not None and card.isVisible()
    with loaded(qtbot, window):
        card.use_pair.emit(qwen["target_gguf"], qwen["draft_gguf"])  # what the card sends once downloaded
    settle(qtbot, window)
    assert user == [] and window.errors_shown == 0
    assert (window.info.target_path, window.info.draft_path) == (qwen["target_gguf"], qwen["draft_gguf"])
    assert not card.isVisible() and window.settings.first_run_done
    assert DEMO_DRAFT_LABEL not in offered_drafts(window)
    window.close()


def test_specdesk_gui_target_opens_it_with_no_leftover_draft(qtbot, user, qwen, tmp_path):
    from specdesk.ui.app import open_window
    from specdesk.ui.cli import build_parser

    assert build_parser().parse_args(["gui", "--target", qwen["target_gguf"]]).target == qwen["target_gguf"]
    config = tmp_path / "config"
    config.mkdir()
    (config / "settings.json").write_text(json.dumps({"target_path": DEMO, "draft_path": DEMO, "demo_size": "small",
                                                      "method": "draft", "threads": 1, "first_run_done": False}))
    window = open_window(qwen["target_gguf"])
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: window.info is not None, timeout=TIMEOUT_MS)
    settle(qtbot, window)
    assert_quietly_without_the_demo_draft(window, qwen["target_gguf"], user)
    card = window.first_run  # shown on the saved settings' demo; a model of one's own loaded: it goes for good
    assert card is not None and not card.isVisible() and window.settings.first_run_done
    window.close()


def test_a_chat_model_gets_a_question_to_compare_and_the_compare_keeps_its_temperature(qtbot, user, qwen):
    window = on_the_demo(qtbot, temperature=0.7)
    view = window.compare_view
    assert view.prompt.toPlainText() == CODE_PROMPT
    with loaded(qtbot, window):
        window.open_target(qwen["target_gguf"])
    settle(qtbot, window)
    assert window.info.chat_template and view.prompt.toPlainText() == CHAT_PROMPT
    view.temperature_spin.setValue(0.0)  # greedy for the compare: identical outputs
    spec, sampling, _, _ = window._compare_request()
    assert sampling.temperature == 0.0 and window.controls.sampling().temperature == 0.7  # the chat's stays
    window.save_settings()
    assert (window.settings.temperature, window.settings.compare_temperature) == (0.7, 0.0)
    view.prompt.setPlainText("my own prompt")
    with loaded(qtbot, window):
        window.controls.use_models(DEMO, DEMO, "draft")
    settle(qtbot, window)
    assert view.prompt.toPlainText() == "my own prompt"  # never replaced once the user wrote one
    window.close()
