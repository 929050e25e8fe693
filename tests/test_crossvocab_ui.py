"""The pairing dialog lists a draft with another vocabulary as a cross-vocabulary draft (not as
incompatible) and, measured, shows its overlap, acceptance and expected speedup."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specdesk.app.models.library import LibraryConfig
from specdesk.app.models.pairing import MemoryInfo
from specdesk.ui import models_view
from specdesk.ui.models_view import ModelsView

TIMEOUT_MS = 120_000
PLENTY = MemoryInfo(ram_available=1 << 40, ram_total=1 << 40)


@pytest.fixture
def view(qtbot, demo_family, smollm2, tmp_path, monkeypatch):
    from specdesk.app.models import pairing

    monkeypatch.setattr(pairing, "available_memory", lambda: PLENTY)
    monkeypatch.setenv("SPECDESK_CONFIG_DIR", str(tmp_path / "config"))
    config = lambda: LibraryConfig(demo_root=Path(demo_family["target_gguf"]).parent.parent,  # noqa: E731
                                   user_paths=[smollm2], include_apps=False, include_hf_cache=False)
    view = ModelsView(config, scan_when_shown=False)
    qtbot.addWidget(view)
    view.show()
    yield view
    view.shutdown()
    assert models_view.running_threads() == []


def test_a_draft_with_another_vocabulary_is_listed_and_measured(qtbot, view, demo_family, smollm2):
    with qtbot.waitSignal(view.library_loaded, timeout=TIMEOUT_MS):
        view.refresh_library()
    target = next(e for e in view.entries if e.path == demo_family["target_gguf"])
    dialog = view.open_pairing(target)
    qtbot.waitUntil(lambda: dialog.report is not None, timeout=TIMEOUT_MS)
    crossed = dialog.cross_vocab
    paths = [crossed.table.item(row, 0).data(0x0100) for row in range(crossed.table.rowCount())]
    smol = next(p for p in paths if Path(p).resolve() == Path(smollm2).resolve())
    incompatible = [dialog.incompatible.item(r, 0).data(0x0100) for r in range(dialog.incompatible.rowCount())]
    assert smol not in incompatible  # listed as a cross-vocabulary draft, not hidden as incompatible
    row = crossed.rows[smol]
    assert crossed.table.item(row, 4).text().startswith("not measured")
    crossed.table.selectRow(row)
    assert crossed.measure_button.isEnabled()
    crossed.prompts, crossed.max_tokens = crossed.prompts[:1], 8  # a short measurement: the test reads the rows
    crossed.measure_button.click()
    qtbot.waitUntil(lambda: crossed.table.item(row, 4).text() != "measuring…", timeout=TIMEOUT_MS)
    assert crossed.table.item(row, 2).text().endswith("%"), crossed.table.item(row, 4).toolTip()
    overlap, acceptance, speedup, verdict = (crossed.table.item(row, c).text() for c in (1, 2, 3, 4))
    assert overlap.endswith("%") and 0 < int(overlap[:-1]) <= 100
    assert 0 <= int(acceptance[:-1]) <= 100
    assert re.fullmatch(r"\d+\.\d\dx measured", speedup)
    assert "cross-vocabulary draft" in verdict
    dialog.close()
