"""The Models tab with pytest-qt (offscreen): real library scans, the real local hub server,
real downloads with progress and cancel, and the pairing dialog on the demo family."""

from __future__ import annotations

import shutil
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtCore import QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication, QMessageBox  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from hub_server import HubServer  # noqa: E402

from specdesk.app.models.library import LibraryConfig  # noqa: E402
from specdesk.ui import models_view  # noqa: E402
from specdesk.ui.models_view import ModelsView  # noqa: E402

TIMEOUT_MS = 120_000  # a bound on a broken job only: a loaded 2-core machine is slow
GGUF_NAME = "tiny-Q8_0.gguf"


@pytest.fixture(autouse=True)
def no_threads_or_timers_left(qapp):
    yield
    from specdesk.ui.worker import running_threads as engine_threads

    threads = models_view.running_threads() + engine_threads()
    timers = [t for w in QApplication.topLevelWidgets() for t in w.findChildren(QTimer) if t.isActive()
              and isinstance(w, ModelsView)]
    for thread in threads:
        thread.quit()
        thread.wait(5000)
    assert not threads, f"{len(threads)} thread(s) still running after the test"
    assert not timers, f"{len(timers)} QTimer(s) still active after the test"


@pytest.fixture
def dialogs(monkeypatch):
    shown = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text, *a, **k: shown.append(text))
    return shown


@pytest.fixture
def hub(tmp_path, monkeypatch, demo_family):
    with HubServer() as server:
        server.data = Path(demo_family["draft_gguf"]).read_bytes() * 8  # not a model: just bytes to move
        server.add_repo("acme/tiny-GGUF", {GGUF_NAME: server.data, "README.md": b"# tiny\n"}, tags=["gguf"],
                        downloads=10)
        server.add_repo("acme/draft-GGUF", {"draft-F16.gguf": Path(demo_family["draft_gguf"]).read_bytes()},
                        tags=["gguf"], downloads=5)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield server
        release(server)  # no request stays held after the test


def hold_midway(server: HubServer) -> None:
    """Stop the next body halfway until release(): a cancel then always lands mid-transfer. Until
    then the body trickles, so progress reaches the window before the hold."""
    server.released.clear()
    server.throttle_s = 0.005
    server.hold_at = len(server.data) // 2


def release(server: HubServer) -> None:
    server.throttle_s = 0.0
    server.hold_at = None
    server.released.set()


@pytest.fixture
def make_view(qtbot, demo_family, tmp_path, hub, dialogs):
    views = []
    extra = tmp_path / "mine"
    extra.mkdir()
    shutil.copy(demo_family["draft_gguf"], extra / "draft-copy.gguf")
    (extra / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00 truncated header")

    def make() -> ModelsView:
        config = lambda: LibraryConfig(demo_root=Path(demo_family["target_gguf"]).parent.parent,
                                       user_paths=[str(extra)], include_apps=False)
        view = ModelsView(config, scan_when_shown=False)
        qtbot.addWidget(view)
        view.resize(1200, 800)
        view.show()
        views.append(view)
        return view

    yield make
    for view in views:
        view.shutdown()


def cross_vocab_rows(dialog) -> dict[str, str]:
    """The pairing dialog's cross-vocabulary drafts: path -> why the draft method refuses it."""
    table = dialog.cross_vocab.table
    return {table.item(r, 0).toolTip(): table.item(r, 4).toolTip() for r in range(table.rowCount())}


def load_library(qtbot, view: ModelsView):
    with qtbot.waitSignal(view.library_loaded, timeout=TIMEOUT_MS) as blocker:
        view.refresh_library()
    return blocker.args[0]


def row_of(view: ModelsView, path: str) -> int:
    return next(i for i, e in enumerate(view.entries) if e.path == path)


def test_library_table_shows_metadata_and_errors(qtbot, make_view, demo_family, tmp_path):
    from test_model_validation import rewrite

    # read fine, but llama.cpp could not run it: listed with its facts and why it cannot be used
    rewrite(demo_family["draft_gguf"], tmp_path / "mine" / "no-layers.gguf", **{"{arch}.block_count": 0})
    view = make_view()
    entries = load_library(qtbot, view)
    assert view.library.rowCount() == len(entries) >= 4
    row = row_of(view, demo_family["target_gguf"])
    headers = [view.library.horizontalHeaderItem(c).text() for c in range(view.library.columnCount())]
    cells = {h: view.library.item(row, c).text() for c, h in enumerate(headers)}
    assert cells["architecture"] == "llama" and cells["format"] == "gguf" and cells["quantization"] == "F16"
    assert cells["parameters"].endswith(" M") and cells["vocab"] == str(entries[row].vocab_size)
    broken = next(i for i, e in enumerate(view.entries) if e.path.endswith("broken.gguf"))
    assert "cannot read" in view.library.item(broken, 3).text()
    assert "broken.gguf" in view.library.item(broken, 0).toolTip()
    unusable = next(i for i, e in enumerate(view.entries) if e.path.endswith("no-layers.gguf"))
    assert view.library.item(unusable, 3).text() == "llama: cannot be used, see tooltip"
    assert "block_count" in view.library.item(unusable, 0).toolTip()
    assert "2 unusable" in view.status.text()


def test_a_library_row_and_the_pairing_dialog_open_training_for_that_model(qtbot, make_view, demo_family):
    """A row's menu offers "Train a drafter for this model…" (a drafter's row does not), and so
    does the pairing dialog; the dialog trains the GGUF from the library's folder of the same model."""
    from specdesk.ui.train_dialog import TrainDrafterDialog

    view = make_view()
    load_library(qtbot, view)
    view.library.selectRow(row_of(view, demo_family["target_gguf"]))
    menu = view.row_menu()
    actions = {a.text(): a for a in menu.actions()}
    assert list(actions) == ["Use this model", "Use as draft", "Pair drafts…", "Train a drafter for this model…"]
    actions["Train a drafter for this model…"].trigger()
    dialog = view.findChildren(TrainDrafterDialog)[-1]
    assert dialog.target_gguf == demo_family["target_gguf"]
    dialog.close()
    pairing = view.open_pairing(next(e for e in view.entries if e.path == demo_family["target_gguf"]))
    qtbot.waitUntil(lambda: pairing.report is not None, timeout=TIMEOUT_MS)
    pairing.train_button.click()
    assert len(view.findChildren(TrainDrafterDialog)) == 2
    view.findChildren(TrainDrafterDialog)[-1].close()
    pairing.close()


def test_search_list_and_download_with_progress(qtbot, make_view, hub, tmp_path):
    view = make_view()
    view.query.setText("acme")
    with qtbot.waitSignal(view.search_done, timeout=TIMEOUT_MS):
        view.search_button.click()
    assert [view.results.item(r, 0).text() for r in range(view.results.rowCount())] == \
        ["acme/tiny-GGUF", "acme/draft-GGUF"]
    with qtbot.waitSignal(view.files_listed, timeout=TIMEOUT_MS):
        view.results.selectRow(0)
    files = [view.files.item(r, 0).text() for r in range(view.files.rowCount())]
    assert files == ["README.md", GGUF_NAME]
    assert view.files.item(1, 2).text() == "Q8_0"
    view.files.selectRow(1)
    assert view.download_button.isEnabled()
    states = []
    view.download_changed.connect(lambda d: states.append((d.state, d.bar.value())))
    with qtbot.waitSignal(view.download_changed, timeout=TIMEOUT_MS, check_params_cb=lambda d: d.state == "done"):
        view.download_button.click()
    (download,) = view.downloads.values()
    assert Path(download.path).read_bytes() == hub.data
    assert download.bar.value() == models_view.PROGRESS_STEPS
    assert states[0][0] == "queued" and ("running", states[-2][1]) == states[-2]
    assert download.button.text() == "Use this model" and download.button.isEnabled()
    with qtbot.waitSignal(view.use_model, timeout=TIMEOUT_MS) as used:
        download.button.click()
    assert used.args == [download.path]
    # The finished file joins the library.
    qtbot.waitUntil(lambda: any(e.path == download.path for e in view.entries), timeout=TIMEOUT_MS)


def test_cancel_then_resume_from_the_queue(qtbot, make_view, hub, tmp_path):
    view = make_view()
    hold_midway(hub)
    with qtbot.waitSignal(view.download_changed, timeout=TIMEOUT_MS,
                          check_params_cb=lambda d: d.state == "running" and d.bar.value() > 0):
        download_id = view.enqueue_download("acme/tiny-GGUF", GGUF_NAME)
    d = view.downloads[download_id]
    with qtbot.waitSignal(view.download_changed, timeout=TIMEOUT_MS,
                          check_params_cb=lambda d: d.state == "cancelled"):
        d.button.click()  # Cancel
        release(hub)  # the next chunk arrives after the cancel, however slow the machine
    assert d.button.text() == "Resume" and "resume" in d.message
    partial = list((tmp_path / "hf-cache").rglob("*.incomplete"))
    assert len(partial) == 1
    kept = partial[0].stat().st_size
    assert 0 < kept < len(hub.data)
    with qtbot.waitSignal(view.download_changed, timeout=TIMEOUT_MS, check_params_cb=lambda d: d.state == "done"):
        d.button.click()  # Resume
    assert Path(d.path).read_bytes() == hub.data
    last = hub.requests("GET", "/cdn/")[-1]
    assert last.range == f"bytes={kept}-" and last.sent == len(hub.data) - kept


def test_a_refused_download_shows_its_reason_in_the_queue(qtbot, make_view, hub):
    view = make_view()
    with qtbot.waitSignal(view.download_changed, timeout=TIMEOUT_MS, check_params_cb=lambda d: d.state == "failed"):
        download_id = view.enqueue_download("acme/tiny-GGUF", "../escape.gguf")
    d = view.downloads[download_id]
    assert "refused file name" in d.message and d.button.text() == "Retry"
    assert hub.requests("GET", "escape") == [] and hub.requests("HEAD", "escape") == []


def test_pairing_dialog_shows_compatible_drafts_and_why_not(qtbot, make_view, demo_family, tmp_path, monkeypatch):
    from llama_helpers import rewrite_gguf

    from specdesk.app.models import pairing

    # The verdict against a known amount of memory, not this machine's free RAM.
    monkeypatch.setattr(pairing, "available_memory", lambda: pairing.MemoryInfo(64 << 30, 64 << 30))
    view = make_view()
    variant = tmp_path / "mine" / "more-tokens.gguf"
    rewrite_gguf(demo_family["draft_gguf"], variant, extra_tokens=300)
    load_library(qtbot, view)
    view.library.selectRow(row_of(view, demo_family["target_gguf"]))
    assert view.pair_button.isEnabled()
    with qtbot.waitSignal(view.pairing_ready, timeout=TIMEOUT_MS):
        view.pair_button.click()
    dialog = next(w for w in view.findChildren(models_view.PairingDialog))
    compatible = [dialog.compatible.item(r, 0).toolTip() for r in range(dialog.compatible.rowCount())]
    assert demo_family["draft_gguf"] in compatible
    why_not = {dialog.incompatible.item(r, 0).toolTip(): dialog.incompatible.item(r, 1).text()
               for r in range(dialog.incompatible.rowCount())}
    assert str(variant) not in why_not  # another vocabulary: a cross-vocabulary draft, with why it is one
    assert "vocab size" in cross_vocab_rows(dialog)[str(variant)]
    assert "cannot read" in next(v for k, v in why_not.items() if k.endswith("broken.gguf"))
    assert "fits" in dialog.memory.text() and "Memory at context" in dialog.memory.text()
    dialog.close()


def test_hub_errors_are_shown(qtbot, make_view, dialogs):
    view = make_view()
    with qtbot.waitSignal(view.failed, timeout=TIMEOUT_MS):
        view.show_files("acme/does-not-exist")
    assert dialogs and "repository not found" in dialogs[-1]
    assert "repository not found" in view.status.text()


def test_closing_during_a_download_ends_the_threads_and_keeps_the_partial_file(qtbot, make_view, hub, tmp_path):
    view = make_view()
    hold_midway(hub)
    with qtbot.waitSignal(view.download_changed, timeout=TIMEOUT_MS,
                          check_params_cb=lambda d: d.state == "running" and d.bar.value() > 0):
        download_id = view.enqueue_download("acme/tiny-GGUF", GGUF_NAME)
    job = view.downloads[download_id].job
    # Let the body go on once shutdown() has cancelled the download (it blocks this thread meanwhile).
    releaser = threading.Thread(target=lambda: job.cancel.wait(60) and release(hub), daemon=True)
    releaser.start()
    view.shutdown()
    releaser.join(10)
    assert models_view.running_threads() == []
    assert len(list((tmp_path / "hf-cache").rglob("*.incomplete"))) == 1


def test_the_main_window_has_a_models_tab(qtbot, tmp_path, monkeypatch, dialogs, demo_family):
    from specdesk.app.storage.settings import Settings
    from specdesk.ui.main_window import MainWindow

    monkeypatch.setenv("SPECDESK_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("SPECDESK_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    window = MainWindow(Settings(target_path=demo_family["target_gguf"], draft_path=None, threads=1,
                                 library_paths=[str(Path(demo_family["target_gguf"]).parent)]), autoload=False)
    qtbot.addWidget(window)
    window.show()
    titles = [window.tabs.tabText(i) for i in range(window.tabs.count())]
    assert "Models" in titles
    view = window.findChild(ModelsView)
    with qtbot.waitSignal(view.library_loaded, timeout=TIMEOUT_MS):
        window.tabs.setCurrentIndex(titles.index("Models"))  # the first showing scans the library
    assert any(e.path == demo_family["target_gguf"] for e in view.entries)
    # Other apps' folders are switched in the tab and remembered in settings.
    store = tmp_path / "home" / ".ollama" / "models"
    blob = store / "blobs" / ("sha256-" + "ab" * 32)
    blob.parent.mkdir(parents=True)
    shutil.copy(demo_family["draft_gguf"], blob)
    manifest = store / "manifests" / "registry.ollama.ai" / "library" / "demo" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text('{"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:'
                        + "ab" * 32 + '"}]}')
    with qtbot.waitSignal(view.library_loaded, timeout=TIMEOUT_MS):
        view.refresh_library()
    assert any(e.source == "ollama" and e.path == str(blob) for e in view.entries)
    with qtbot.waitSignal(view.library_loaded, timeout=TIMEOUT_MS):
        view.source_boxes["ollama"].setChecked(False)
    assert not any(e.source == "ollama" for e in view.entries)
    assert window.settings.model_sources == {"ollama": False}
    window.close()
    assert models_view.running_threads() == []


def zoo_folder(tmp_path: Path, monkeypatch) -> Path:
    """A user's folder with two families of real-shaped models (benchmarks/zoo.py, small
    builds): qwen2 in F16 and llama-bpe in Q4_K_M, a target and a draft each, in a window of
    its own (settings, data, cache and home under tmp_path: no demo family, no other app's models)."""
    from benchmarks import zoo

    qwen, llama = zoo.build("qwen2", "F16", small=True), zoo.build("llama-bpe", "Q4_K_M", small=True)
    monkeypatch.setenv("SPECDESK_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("SPECDESK_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SPECDESK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    mine = tmp_path / "models"
    for family, paths in (("qwen2", qwen), ("llama-bpe", llama)):
        (mine / family).mkdir(parents=True)
        for role in ("target", "draft"):  # read in place wherever they are: linked here
            (mine / family / Path(paths[f"{role}_gguf"]).name).symlink_to(paths[f"{role}_gguf"])
    return mine


def test_zoo_models_list_their_shapes_and_pair_by_vocabulary(qtbot, tmp_path, monkeypatch, dialogs):
    """Real-shaped models (benchmarks/zoo.py, small builds) in a folder the user added: the
    library lists each one's architecture, quantization and vocabulary, names apart the files
    that share a header name, and pairing offers the family's draft and refuses the other
    family's with the vocabulary sizes."""
    from specdesk.app.models import pairing
    from specdesk.app.storage.settings import Settings
    from specdesk.ui.main_window import MainWindow

    monkeypatch.setattr(pairing, "available_memory", lambda: pairing.MemoryInfo(64 << 30, 64 << 30))
    mine = zoo_folder(tmp_path, monkeypatch)
    window = MainWindow(Settings(threads=1, library_paths=[str(mine)]), autoload=False)
    qtbot.addWidget(window)
    window.show()
    titles = [window.tabs.tabText(i) for i in range(window.tabs.count())]
    view = window.findChild(ModelsView)
    with qtbot.waitSignal(view.library_loaded, timeout=TIMEOUT_MS):
        window.tabs.setCurrentIndex(titles.index("Models"))
    headers = [view.library.horizontalHeaderItem(c).text() for c in range(view.library.columnCount())]

    def cells(path: Path) -> dict:
        row = row_of(view, str(path))
        return {h: view.library.item(row, c).text() for c, h in enumerate(headers)}

    qwen_target, qwen_draft = mine / "qwen2" / "target-F16.gguf", mine / "qwen2" / "draft-F16.gguf"
    llama_target, llama_draft = mine / "llama-bpe" / "target-Q4_K_M.gguf", mine / "llama-bpe" / "draft-Q4_K_M.gguf"
    assert len(view.entries) == 4 and all(e.ok and e.source == "user" for e in view.entries)
    for path, arch, quant, vocab in ((qwen_target, "qwen2", "F16", "151936"), (qwen_draft, "qwen2", "F16", "151936"),
                                     (llama_target, "llama", "Q4_K_M", "128256"),
                                     (llama_draft, "llama", "Q4_K_M", "128256")):
        row = cells(path)
        assert (row["architecture"], row["quantization"], row["vocab"], row["format"]) == (arch, quant, vocab, "gguf")
        assert row["name"].endswith(f"({path.name})")  # the header names target and draft alike
    assert cells(qwen_target)["name"] != cells(qwen_draft)["name"]

    def pair(target: Path) -> tuple[list, dict]:
        view.library.selectRow(row_of(view, str(target)))
        assert view.pair_button.isEnabled()
        with qtbot.waitSignal(view.pairing_ready, timeout=TIMEOUT_MS):
            view.pair_button.click()
        dialog = view.findChildren(models_view.PairingDialog)[-1]
        compatible = [dialog.compatible.item(r, 0).toolTip() for r in range(dialog.compatible.rowCount())]
        why_not = cross_vocab_rows(dialog)  # refused for the vocabulary alone: cross-vocabulary drafts
        assert dialog.incompatible.rowCount() == 0
        assert dialog.compatible.item(0, 0).text().endswith(f"({Path(compatible[0]).name})")
        dialog.close()
        return compatible, why_not

    compatible, why_not = pair(qwen_target)
    assert compatible == [str(qwen_draft)]
    assert set(why_not) == {str(llama_target), str(llama_draft)}
    assert all(reason.startswith("vocab size 151936 vs 128256 (target vs draft)") for reason in why_not.values())
    compatible, why_not = pair(llama_target)
    assert compatible == [str(llama_draft)]
    assert "vocab size 128256 vs 151936 (target vs draft)" in why_not[str(qwen_draft)]
    window.close()
    assert models_view.running_threads() == []


def test_the_draft_picker_keeps_the_zoo_family_draft_and_hides_the_other_with_why(qtbot, tmp_path, monkeypatch,
                                                                                   dialogs):
    from PySide6.QtCore import Qt

    from specdesk.app.storage.settings import Settings
    from specdesk.ui.main_window import MainWindow

    mine = zoo_folder(tmp_path, monkeypatch)
    target, same, other = (mine / "qwen2" / "target-F16.gguf", mine / "qwen2" / "draft-F16.gguf",
                           mine / "llama-bpe" / "draft-Q4_K_M.gguf")
    window = MainWindow(Settings(target_path=str(target), draft_path=None, method="ngram", threads=1, n_ctx=256,
                                 recent_drafts=[str(same), str(other)]), autoload=False)
    qtbot.addWidget(window)
    window.show()
    with qtbot.waitSignal(window.worker.finished, timeout=TIMEOUT_MS, check_params_cb=lambda r: r.kind == "load"):
        window.load_models()
    assert window.info is not None and window.info.target_path == str(target)
    combo = window.controls.draft_combo
    enabled = [combo.itemData(i) for i in range(combo.count()) if combo.model().item(i).isEnabled()]
    assert str(same) in enabled and str(other) not in enabled
    hidden = [i for i in range(combo.count()) if not combo.model().item(i).isEnabled()]
    # the other family's draft, and the built-in demo drafters, made for the demo target only
    assert len(hidden) == 1 and combo.itemText(hidden[0]) == "3 incompatible drafts hidden"
    why = combo.itemData(hidden[0], Qt.ToolTipRole)
    assert "draft-Q4_K_M.gguf: vocab size 151936 vs 128256" in why
    assert "Demo draft (built in): made for the demo target only" in why
    window.close()
