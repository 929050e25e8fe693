"""A new user's way from a model they found to a chat with it, offscreen in the real window:
the first-run card's suggested pair (served by a local hub), a library row's "Use this model",
and a pairing row's "Use this pair". No dialog or error appears, and the draft that loads fits
the target."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from PySide6.QtWidgets import QMessageBox

sys.path.insert(0, str(Path(__file__).parent))
from hub_server import HubServer  # noqa: E402

from specdesk.app.models import curated, pairing  # noqa: E402
from specdesk.app.models.curated import HubFile, SuggestedPair  # noqa: E402
from specdesk.app.storage.settings import Settings  # noqa: E402
from specdesk.ui import models_view  # noqa: E402
from specdesk.ui.main_window import MainWindow  # noqa: E402
from specdesk.ui.job_thread import running_threads  # noqa: E402

TIMEOUT_MS = 180_000


@pytest.fixture
def user(tmp_path, monkeypatch, demo_family):
    """A user's machine: their own settings, data, caches and home; message boxes recorded."""
    for name, folder in (("SPECDESK_CONFIG_DIR", "config"), ("SPECDESK_DATA_DIR", "data"),
                         ("HF_HUB_CACHE", "hf-cache"), ("HF_HOME", "hf-home"), ("HOME", "home")):
        monkeypatch.setenv(name, str(tmp_path / folder))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(pairing, "available_memory", lambda: pairing.MemoryInfo(64 << 30, 64 << 30))
    shown = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text, *a, **k: shown.append(text))
    monkeypatch.setattr(QMessageBox, "question", lambda parent, title, text, *a, **k: shown.append(text))
    return shown


def chat(qtbot, window: MainWindow, text: str) -> str:
    window.chat_view.input.setPlainText(text)
    with qtbot.waitSignal(window.worker.finished, timeout=TIMEOUT_MS, check_params_cb=lambda r: r.kind == "chat"):
        window.chat_view.send_button.click()
    last = window.history.messages(window.chat_id)[-1]
    assert last.role == "assistant"
    return last.content


def loaded(qtbot, window: MainWindow):
    return qtbot.waitSignal(window.worker.finished, timeout=TIMEOUT_MS, check_params_cb=lambda r: r.kind == "load")


def close(window: MainWindow) -> None:
    window.close()
    assert running_threads() == []


def test_the_first_run_card_downloads_its_pair_and_the_user_chats_with_it(qtbot, user, demo_family, monkeypatch):
    target, draft = Path(demo_family["target_gguf"]).read_bytes(), Path(demo_family["draft_gguf"]).read_bytes()
    with HubServer() as hub:
        hub.add_repo("acme/Chat-8B-GGUF", {"chat-8b-F16.gguf": target}, tags=["gguf"])
        hub.add_repo("acme/Chat-0.6B-GGUF", {"chat-0.6b-F16.gguf": draft}, tags=["gguf"])
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        pair = SuggestedPair("Chat 8B with Chat 0.6B", HubFile("acme/Chat-8B-GGUF", "chat-8b-F16.gguf", len(target)),
                             HubFile("acme/Chat-0.6B-GGUF", "chat-0.6b-F16.gguf", len(draft)), "tests", 1 << 20)
        monkeypatch.setattr(curated, "load_pairs", lambda path=None: [pair])
        monkeypatch.setattr(curated, "run_memory", lambda: (16_000_000_000, "RAM"))
        window = MainWindow(Settings(target_path=demo_family["target_gguf"], draft_path=demo_family["draft_gguf"],
                                     threads=1, max_tokens=24), autoload=False)
        qtbot.addWidget(window)
        window.show()
        with loaded(qtbot, window):
            window.load_models()
        card = window.first_run
        assert card is not None and card.isVisible() and pair.name in card.suggestion.text()
        with loaded(qtbot, window):
            card.get_button.click()
        assert not card.isVisible() and window.settings.first_run_done
        info = window.info
        assert Path(info.target_path).name == "chat-8b-F16.gguf" and Path(info.draft_path).name == "chat-0.6b-F16.gguf"
        assert window.controls.method() == "auto"
        assert chat(qtbot, window, "def main():")
        assert user == []
        close(window)
    again = MainWindow(Settings(first_run_done=True), autoload=False)
    qtbot.addWidget(again)
    assert again.first_run is None  # used once: it does not come back
    close(again)


@pytest.fixture(scope="module")
def qwen() -> dict[str, str]:
    """Another family's small pair, built once into the suite's own cache (before a test's
    `user` fixture points HOME, and so the cache, at an empty folder)."""
    from benchmarks import zoo

    return zoo.build("qwen2", "F16", small=True)


@pytest.fixture
def library(tmp_path, demo_family, qwen):
    """A folder of the user's: the demo target and draft, and a draft of another family."""
    folder = tmp_path / "models"
    folder.mkdir()
    for name, source in (("demo-target.gguf", demo_family["target_gguf"]), ("demo-draft.gguf", demo_family["draft_gguf"]),
                         ("qwen-target.gguf", qwen["target_gguf"]), ("qwen-draft.gguf", qwen["draft_gguf"])):
        (folder / name).symlink_to(source)
    return folder


def open_on_qwen(qtbot, folder: Path) -> MainWindow:
    """Chatting with another family's pair: its draft must not stay for the next target."""
    window = MainWindow(Settings(target_path=str(folder / "qwen-target.gguf"), draft_path=str(folder / "qwen-draft.gguf"),
                                 threads=1, max_tokens=16, first_run_done=True, library_paths=[str(folder)],
                                 model_sources={"lmstudio": False, "ollama": False}), autoload=False)
    qtbot.addWidget(window)
    window.resize(1280, 800)
    window.show()
    with loaded(qtbot, window):
        window.load_models()
    view = window.models_view
    with qtbot.waitSignal(view.library_loaded, timeout=TIMEOUT_MS):
        window.tabs.setCurrentWidget(view)
    return window


def row_of(view, path: str) -> int:
    return next(r for r in range(view.library.rowCount()) if view.library.item(r, 0).toolTip() == path
                or any(view.library.item(r, c) and view.library.item(r, c).text() == path
                       for c in range(view.library.columnCount())))


def test_a_library_row_loads_with_the_draft_that_fits_it(qtbot, library, user):
    window = open_on_qwen(qtbot, library)
    view = window.models_view
    view.library.selectRow(row_of(view, str(library / "demo-target.gguf")))
    assert view.use_button.isEnabled()
    with loaded(qtbot, window):
        view.use_button.click()
    assert Path(window.info.target_path).name == "demo-target.gguf"
    assert Path(window.info.draft_path).name == "demo-draft.gguf"  # not the qwen draft left loaded
    assert window.tabs.currentIndex() == 0
    qtbot.waitUntil(lambda: "demo-draft" in window.status_label.text(), timeout=TIMEOUT_MS)  # why, once auto is ready
    assert chat(qtbot, window, "import os")
    assert user == []
    close(window)


def test_a_pairing_row_loads_that_pair(qtbot, library, user):
    window = open_on_qwen(qtbot, library)
    view = window.models_view
    entry = next(e for e in view.entries if Path(e.path).name == "demo-target.gguf")
    dialog = view.open_pairing(entry)
    qtbot.waitUntil(lambda: dialog.report is not None, timeout=TIMEOUT_MS)
    names = [Path(dialog.compatible.item(r, 0).data(models_view.Qt.UserRole)).name
             for r in range(dialog.compatible.rowCount())]
    assert names[0] == "demo-draft.gguf" and dialog.use_button.isEnabled()
    assert str(library) not in dialog.summary.text()  # names, not paths
    with loaded(qtbot, window):
        dialog.use_button.click()
    assert Path(window.info.target_path).name == "demo-target.gguf"
    assert Path(window.info.draft_path).name == "demo-draft.gguf"
    assert user == []
    close(window)
