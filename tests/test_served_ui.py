"""The window on a served engine (ui/served_chat.py, ui/main_window.py), offscreen: Servers > Add server…, the
chat streamed from the server with the same charts, and a failed reply kept as partial.
The server is the replayed vLLM recording (tests/served/, marked as a recording); the real
llama-server and specdesk serve are in tests/test_llama_server.py and tests/test_endpoint.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

sys.path.insert(0, str(Path(__file__).parent))

from PySide6.QtWidgets import QDialogButtonBox, QGroupBox, QMessageBox  # noqa: E402

from served_replay import Replay, load  # noqa: E402

from specdesk.app.storage.credentials import keyring_available, store_key  # noqa: E402
from specdesk.app.storage.history import History  # noqa: E402
from specdesk.app.storage.settings import Settings  # noqa: E402
from specdesk.ui.main_window import MainWindow  # noqa: E402

TIMEOUT_MS = 30_000


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    shown = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text, *a, **k: shown.append(text))
    window = MainWindow(Settings(max_tokens=64, temperature=0.0), History(tmp_path / "history.sqlite3"),
                        settings_file=tmp_path / "settings.json", autoload=False)
    window.errors = shown
    qtbot.addWidget(window)
    window.resize(1280, 800)
    window.show()
    yield window
    window.close()


def connect(qtbot, window, url: str, key: str = ""):
    dialog = window.served.add_server()
    dialog.url_edit.setText(url)
    dialog.key_edit.setText(key)
    dialog.connect_button.click()
    ok = dialog.buttons.button(QDialogButtonBox.Ok)
    qtbot.waitUntil(lambda: ok.isEnabled() or "refused" in dialog.info.text(), timeout=TIMEOUT_MS)
    return dialog, ok


def test_add_server_lists_models_says_what_it_reports_and_chats_with_its_charts(qtbot, window):
    recording = load("vllm_per_request.json")
    with Replay(recording, api_key="sk-team") as replay:
        dialog, ok = connect(qtbot, window, replay.url, "sk-wrong")
        assert "refused the API key" in dialog.info.text() and not ok.isEnabled()
        dialog.key_edit.setText("sk-team")
        dialog.connect_button.click()
        qtbot.waitUntil(ok.isEnabled, timeout=TIMEOUT_MS)
        assert dialog.models.currentText() == "meta-llama/Llama-3.3-70B-Instruct"
        assert "vLLM" in dialog.info.text() and "acceptance per draft position" in dialog.info.text()
        ok.click()
        try:
            assert ("session only" in dialog.key_note) is (not keyring_available())
            assert "sk-team" not in (Path(window._settings_file).read_text()
                                     if Path(window._settings_file).exists() else "")
            assert not window.backend.local and "vLLM" in window.status_label.text()
            models_group = next(g for g in window.controls.findChildren(QGroupBox) if g.title() == "Models")
            assert not models_group.isEnabled()  # the local pickers do not apply to the server's replies

            window.chat_view.input.setPlainText("Write a function that parses command line arguments.")
            window.chat_view.send_button.click()
            qtbot.waitUntil(lambda: not window.worker.busy, timeout=TIMEOUT_MS)
        finally:
            store_key(replay.url, None)
    stats = window.charts.current_stats()
    assert (stats.tokens, stats.drafted, stats.accepted) == (53, 129, 10)
    assert stats.per_position_accepted == (4, 3, 3) and stats.per_position_drafted == (43, 43, 43)
    assert window.charts.series.steps == 43  # one streamed chunk per engine step
    reply = window.chat_view.messages[-1]
    expected = "".join(c["choices"][0]["delta"].get("content") or "" for c in recording["stream"] if c["choices"])
    assert reply.role == "assistant" and reply.text == expected
    assert "acceptance 0.08" in window.charts.status.text()
    saved = window.history.messages(window.chat_id)[-1]
    assert saved.meta["numbers_from"] == "per request" and "sk-team" not in str(saved.meta)
    with Replay(recording) as again:  # Regenerate asks the server again, not a local model
        window.backend.endpoint.url = again.url
        window.chat_view.regenerate_button.click()
        qtbot.waitUntil(lambda: not window.worker.busy, timeout=TIMEOUT_MS)
    assert len(again.requests) == 1 and again.requests[0]["messages"][-1]["role"] == "user"
    assert [m.role for m in window.chat_view.messages] == ["user", "assistant"]
    assert window.chat_view.messages[-1].text == expected
    window.close()
    assert "sk-team" not in Path(window._settings_file).read_text()
    assert not window.errors


def test_a_dropped_stream_keeps_the_partial_reply_marked(qtbot, window):
    recording = load("vllm_counters.json")
    with Replay(recording, drop_after=5) as replay:
        _, ok = connect(qtbot, window, replay.url)
        ok.click()
        window.chat_view.input.setPlainText("hello")
        window.chat_view.send_button.click()
        qtbot.waitUntil(lambda: not window.worker.busy, timeout=TIMEOUT_MS)
    reply = window.chat_view.messages[-1]
    assert reply.role == "assistant" and reply.text
    assert len(window.errors) == 1 and "closed the stream mid-reply" in window.errors[0]
    saved = window.history.messages(window.chat_id)[-1]
    assert saved.meta["partial"] and saved.content == reply.text
    assert window.chat_view.send_button.isEnabled()  # the window goes on


def test_compare_view_runs_on_a_server_against_its_baseline_server(qtbot, window):
    with Replay(load("vllm_per_request.json")) as speculative, Replay(load("vllm_counters.json")) as baseline:
        dialog = window.served.add_server()
        dialog.url_edit.setText(speculative.url)
        dialog.baseline_edit.setText(baseline.url)
        dialog.connect_button.click()
        ok = dialog.buttons.button(QDialogButtonBox.Ok)
        qtbot.waitUntil(ok.isEnabled, timeout=TIMEOUT_MS)
        ok.click()
        view = window.compare_view
        window.tabs.setCurrentWidget(view)
        assert view.run_button.isEnabled() and not view.sweep_button.isEnabled()
        view.prompt.setPlainText("def parse_args(argv):")
        view.run_button.click()
        assert view.stop_button.isEnabled()
        qtbot.waitUntil(lambda: not window.worker.busy, timeout=TIMEOUT_MS)
    assert not window.errors
    report = view.report
    assert report.identical_outputs is True and "identical output" in view.verdict.text()
    assert report.speculative.drafted == 129 and report.baseline.tokens == 53
    assert len(speculative.requests) == 2 and len(baseline.requests) == 2  # a warm-up and the run on each
    assert view.speculative_pane.pieces and "".join(view.baseline_pane.pieces) == report.results[0].baseline.text
    assert "time drafting" not in view.details.text()


def test_a_reply_that_fails_before_any_text_takes_its_turn_back_and_local_models_return(qtbot, window):
    """The window mirrors chat_turn's rule (tests/test_chat_turn.py): no text, no turn. The user's
    message leaves the transcript and the history, and its text returns to the input."""
    with Replay(load("vllm_counters.json"), drop_after=0) as replay:
        _, ok = connect(qtbot, window, replay.url)
        ok.click()
        assert not window.backend.local and replay.url in window.windowTitle()
        window.chat_view.input.setPlainText("hello")
        window.chat_view.send_button.click()
        assert window.chat_view.input.toPlainText() == ""
        qtbot.waitUntil(lambda: not window.worker.busy, timeout=TIMEOUT_MS)
    assert len(window.errors) == 1 and "closed the stream mid-reply after 0 characters" in window.errors[0]
    assert window.chat_view.messages == [] and window.chat_id is None and window.history.chats() == []
    assert window.chat_view.input.toPlainText() == "hello"  # nothing typed is lost
    models_group = window.controls.target_combo.parentWidget()
    assert not models_group.isEnabled()
    window.served.local_action.trigger()  # Servers > Use local models
    assert window.backend.local and models_group.isEnabled()
    assert replay.url not in window.windowTitle() and window.windowTitle() == "SpecDesk"


def test_compare_on_a_server_without_a_baseline_is_refused_in_one_message(qtbot, window):
    with Replay(load("vllm_per_request.json")) as replay:
        _, ok = connect(qtbot, window, replay.url)
        ok.click()
        view = window.compare_view
        view.prompt.setPlainText("def parse_args(argv):")
        view.run_button.click()  # vLLM cannot switch speculation off per request
        assert not window.worker.busy and view.report is None
        assert len(replay.requests) == 0
    assert len(window.errors) == 1 and "cannot switch speculation off per request" in window.errors[0]
    assert "baseline server" in window.errors[0]
