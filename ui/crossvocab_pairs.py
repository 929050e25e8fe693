"""The pairing dialog's cross-vocabulary drafts: models refused only for their vocabulary are
listed as drafts that can serve across vocabularies (engines/speculation/crossvocab.py), not as
incompatible; "Measure" runs the selected one with the target on the Models tab's worker and
shows its vocabulary overlap, acceptance and expected speedup here, or that it will not pay
(app/models/crossvocab_pair.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QHeaderView, QLabel, QPushButton, QTableWidget, QTableWidgetItem, QWidget

from specdesk.app.models.crossvocab_pair import PROBE_PROMPTS, refused_for_vocabulary

HEADERS = ["draft", "overlap", "acceptance", "expected speedup", "verdict"]


class CrossVocabDrafts:
    """A table (with its title and Measure button) added to a PairingDialog under its compatible
    drafts. `submit(work, shown)` runs work on the tab's worker and hands its value to `shown`
    on the GUI thread (ModelsView.submit)."""

    def __init__(self, dialog, submit: Callable[..., int]):
        self.dialog = dialog
        self.submit = submit
        self.rows: dict[str, int] = {}  # draft path -> its row
        self.prompts, self.max_tokens = PROBE_PROMPTS, 24  # what Measure runs
        self.table = QTableWidget(0, len(HEADERS), dialog)
        self.table.setHorizontalHeaderLabels(HEADERS)
        self.table.setSelectionBehavior(QTableWidget.SelectRows)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.table.setWordWrap(True)
        self.table.horizontalHeader().setSectionResizeMode(len(HEADERS) - 1, QHeaderView.Stretch)
        self.measure_button = QPushButton("Measure", dialog)
        self.measure_button.setToolTip("run the selected draft with the target on a few prompts: its vocabulary "
                                       "overlap, acceptance and expected speedup on this machine")
        self.measure_button.setEnabled(False)
        self.measure_button.clicked.connect(self.measure_selected)
        self.table.itemSelectionChanged.connect(lambda: self.measure_button.setEnabled(self.table.currentRow() >= 0))
        title = QWidget(dialog)
        row = QHBoxLayout(title)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(QLabel("Cross-vocabulary drafts (another tokenizer: its text is re-tokenized for the target)",
                             title), 1)
        row.addWidget(self.measure_button)
        layout = dialog.layout()
        at = layout.indexOf(dialog.compatible) + 1
        layout.insertWidget(at, title)
        layout.insertWidget(at + 1, self.table, 1)

    def show_report(self, report) -> None:
        """List the drafts the report refused for their vocabulary alone, and drop them from
        the dialog's incompatible table."""
        crossed = [v for v in report.incompatible if refused_for_vocabulary(v.reasons)]
        self.table.setRowCount(0)
        self.rows = {}
        for v in crossed:
            row = self.table.rowCount()
            self.table.insertRow(row)
            self.rows[v.path] = row
            self._set(row, 0, v.name or Path(v.path).name, v.path)
            for column in (1, 2, 3):
                self._set(row, column, "–")
            self._set(row, 4, "not measured: select it and press Measure", "; ".join(v.reasons))
        incompatible = self.dialog.incompatible
        for row in reversed(range(incompatible.rowCount())):
            item = incompatible.item(row, 0)
            if item is not None and item.data(Qt.UserRole) in self.rows:
                incompatible.removeRow(row)
        self.table.resizeColumnToContents(0)

    def measure_selected(self) -> Optional[int]:
        item = self.table.item(self.table.currentRow(), 0)
        if item is None:
            return None
        path = item.data(Qt.UserRole)
        self._set(self.rows[path], 4, "measuring…")
        self.measure_button.setEnabled(False)
        target, prompts, max_tokens = self.dialog.target.path, self.prompts, self.max_tokens

        def work(job):
            from specdesk.app.models.crossvocab_pair import predict_files

            return predict_files(target, path, prompts, max_tokens=max_tokens)

        return self.submit(work, self.show_prediction, lambda message, cancelled: self._failed(path, message))

    def show_prediction(self, prediction) -> None:
        row = self.rows.get(prediction.draft)
        if row is None:
            return
        self._set(row, 1, f"{prediction.overlap:.0%}", f"{prediction.shared_tokens:,} tokens in both vocabularies")
        self._set(row, 2, f"{prediction.acceptance:.0%}")
        self._set(row, 3, f"{prediction.expected_speedup:.2f}x measured",
                  f"retokenizing {prediction.retokenize_ms_per_token:.3f} ms per drafted token; a draft step "
                  f"{prediction.draft_step_ms:.2f} ms; a target pass {prediction.target_pass_ms:.2f} ms")
        self._set(row, 4, prediction.verdict, prediction.verdict)
        self.measure_button.setEnabled(self.table.currentRow() >= 0)

    def _failed(self, path: str, message: str) -> None:
        if path in self.rows:
            self._set(self.rows[path], 4, message.splitlines()[0] if message else "failed", message)
        self.measure_button.setEnabled(True)

    def _set(self, row: int, column: int, text: str, tip: Optional[str] = None) -> None:
        item = QTableWidgetItem(text)
        if tip:
            item.setToolTip(tip)
        if column == 0 and tip:
            item.setData(Qt.UserRole, tip)
        self.table.setItem(row, column, item)
