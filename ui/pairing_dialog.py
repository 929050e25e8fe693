"""The pairing dialog of the Models tab: for one target, the compatible drafts (best first), every
other model with the reasons it cannot draft, its native drafters, and the memory verdict.

Each list is one section (`Section`: a title, a table, and how a report fills it), so another
kind of draft is one more section."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QHeaderView, QLabel, QVBoxLayout, QWidget

from specdesk.app.models.hub import human_bytes
from specdesk.app.models.library import ModelEntry

from .model_tables import cell, model_label, table


@dataclass(frozen=True)
class Section:
    """One list of the dialog: its title, its columns, the rows a pairing report gives it (one
    list of (text, tooltip, data) cells per row), and its share of the height."""

    title: str
    headers: tuple[str, ...]
    rows: Callable[[object], list[list[tuple]]]
    stretch: int = 1


def compatible_rows(report) -> list[list[tuple]]:
    return [[(model_label(v.name, v.path), v.path, v.path), (f"{v.score:.2f}x {v.basis}",),  # measured here, or assumed
             (v.k,), ("; ".join(v.reasons),)] for v in report.compatible]


def incompatible_rows(report) -> list[list[tuple]]:
    return [[(model_label(v.name, v.path), v.path, v.path), ("; ".join(v.reasons), "\n".join(v.reasons))]
            for v in report.incompatible]


def native_rows(report) -> list[list[tuple]]:
    rows = []
    for d in report.native:
        where = d.get("path") or d.get("repo")
        rows.append([(d["method"],), (Path(where).name if d.get("path") else where, where),
                     (d.get("why") or d["source"],)])
    return rows


SECTIONS = (
    Section("Compatible drafts", ("draft", "expected speedup", "k", "why"), compatible_rows, 2),
    Section("Not compatible", ("model", "why not"), incompatible_rows, 2),
    Section("Native drafters", ("method", "where", "why"), native_rows, 1),
)


def memory_text(report) -> str:
    """The memory verdict for the target (and the chosen draft), and where each model will sit."""
    m = report.memory
    draft = f" + draft {Path(report.memory_draft).name}" if report.memory_draft else ""
    verdict = "fits" if m.fits else "does NOT fit"
    vram = f"; GPU {human_bytes(m.vram_free_bytes)} free" if m.vram_free_bytes is not None else ""
    text = (f"Memory at context {m.n_ctx}: target{draft} need {human_bytes(m.required_bytes)} "
            f"(weights {human_bytes(m.weights_bytes + m.draft_weights_bytes)}, KV cache "
            f"{human_bytes(m.kv_cache_bytes + m.draft_kv_cache_bytes)}); "
            f"{human_bytes(m.available_bytes)} RAM free{vram}: {verdict}")
    if report.placement is not None:  # where each model will sit, per device
        text += f"\nPlacement: {report.placement.describe()}"
    return text


class PairingDialog(QDialog):
    """Compatible drafts (best first), every other model with the reasons it cannot draft,
    native drafters, and the memory verdict for a target."""

    MAX_COLUMN_WIDTH = 420  # px: columns before "why" (names, paths) give it room to wrap in
    use = Signal(str, str)  # "Use this pair": the target with the chosen compatible draft
    train = Signal(str)  # "Train a drafter…" for this target

    def __init__(self, target: ModelEntry, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.target = target
        self.report = None
        self.setWindowTitle(f"Drafts for {model_label(target.name, target.path)}")
        self.resize(900, 560)
        self.summary = QLabel(f"checking the library against {model_label(target.name, target.path)}…", self)
        self.summary.setToolTip(target.path)
        self.summary.setWordWrap(True)
        self.tables = {section.title: self._section_table(section) for section in SECTIONS}
        self.compatible = self.tables["Compatible drafts"]
        self.incompatible = self.tables["Not compatible"]
        self.native = self.tables["Native drafters"]
        self.memory = QLabel("", self)
        self.memory.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.addWidget(self.summary)
        for section in SECTIONS:
            layout.addWidget(QLabel(section.title, self))
            layout.addWidget(self.tables[section.title], section.stretch)
        layout.addWidget(self.memory)
        layout.addWidget(self._buttons())

    def _section_table(self, section: Section):
        found = table(list(section.headers), self)
        # the last column ("why") takes the width left and wraps its text; rows grow to fit it
        found.setWordWrap(True)
        found.setTextElideMode(Qt.ElideMiddle)  # a capped path column keeps the file name in view
        found.horizontalHeader().setSectionResizeMode(found.columnCount() - 1, QHeaderView.Stretch)
        found.verticalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        return found

    def _buttons(self) -> QDialogButtonBox:
        buttons = QDialogButtonBox(QDialogButtonBox.Close, self)
        buttons.rejected.connect(self.reject)
        self.use_button = buttons.addButton("Use this pair", QDialogButtonBox.AcceptRole)
        self.use_button.setToolTip("load the target with the selected draft")
        self.use_button.setEnabled(False)
        self.use_button.clicked.connect(self._use_clicked)
        self.train_button = buttons.addButton("Train a drafter…", QDialogButtonBox.ActionRole)
        self.train_button.setToolTip("train an EAGLE-3 head, MTP layer or DFlash drafter for this target here, "
                                     "from its own answers, and adopt it only if it pays")
        self.train_button.clicked.connect(lambda: self.train.emit(self.target.path))
        self.compatible.itemSelectionChanged.connect(
            lambda: self.use_button.setEnabled(self.compatible.currentRow() >= 0))
        self.compatible.itemDoubleClicked.connect(lambda item: self._use_clicked())
        return buttons

    def show_report(self, report) -> None:
        self.report = report
        for section in SECTIONS:
            self._fill(self.tables[section.title], section.rows(report))
        self.summary.setText(f"{len(report.compatible)} compatible draft(s), {len(report.incompatible)} other "
                             f"model(s) cannot draft for {model_label(self.target.name, self.target.path)}")
        self.memory.setText(memory_text(report))
        if report.compatible:
            self.compatible.selectRow(0)

    def _fill(self, shown, rows: list[list[tuple]]) -> None:
        shown.setRowCount(0)
        for cells in rows:
            row = shown.rowCount()
            shown.insertRow(row)
            for column, values in enumerate(cells):
                shown.setItem(row, column, cell(*values))
        for column in range(shown.columnCount() - 1):
            shown.resizeColumnToContents(column)
            shown.setColumnWidth(column, min(shown.columnWidth(column), self.MAX_COLUMN_WIDTH))

    def _use_clicked(self) -> None:
        item = self.compatible.item(self.compatible.currentRow(), 0)
        if item is not None:
            self.use.emit(self.target.path, item.data(Qt.UserRole))
            self.accept()

    def show_error(self, message: str) -> None:
        self.summary.setText(message)
