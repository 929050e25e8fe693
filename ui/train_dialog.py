""""Train a drafter for this model…": `specdesk train-drafter` from the window.

The dialog asks what the command asks (method, time budget, device, whether to learn from the
user's own saved chats: off by default, with how many messages it would read), runs it as a
child process (app/training/job.py), and shows its progress: a bar over recording, then over
the time budget, steps, loss, held-out acceptance and time left, and a plot of the held-out mean
accepted length. Pause checkpoints (Resume continues from there), Cancel stops at once (what was
recorded and the last checkpoint stay). At the end it says whether the drafter was adopted, and
why ("trained EAGLE-3: 1.08x, below draft model 1.31x"), and offers it as the draft.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDoubleSpinBox, QFileDialog, QFormLayout, QHBoxLayout,
                               QLabel, QLineEdit, QPlainTextEdit, QProgressBar, QPushButton, QVBoxLayout, QWidget)

from specdesk.app.training.cli import PAUSED
from specdesk.app.training.job import TrainingJob, TrainingRequest
from specdesk.app.training.loop import format_left
from specdesk.engines.methods import row, runs_as, trainable, training

from . import theme
from .charts import make_plot



def method_choices() -> tuple[tuple[str, str], ...]:
    """(label, method) of what the trainer trains, in its order (the method table's training facts)."""
    return tuple((training(method).choice, method) for method in trainable())

INTRO = "The target answers the bundled prompts, then the drafter learns from its answers."
POLL_MS = 200  # how often the dialog reads the child's events
PROGRESS_STEPS = 1000


def history_count() -> int:
    """How many of the user's own messages --from-history would read (0 where none are saved)."""
    from specdesk.app.training.prompts import history_prompts

    try:
        return len(history_prompts())
    except Exception:  # noqa: BLE001 - a damaged history is the command's to report; here it counts none
        return 0


def hf_folder_for(entry, entries) -> Optional[str]:
    """The Hugging Face folder of the same model as a GGUF library entry, where the library has
    one: the same vocabulary and about the same size (within 10%), not itself a drafter."""
    if entry.format != "gguf":
        return entry.path
    for other in entries:
        if (other.format == "hf" and other.ok and not other.drafter and other.vocab_size == entry.vocab_size
                and entry.parameters and other.parameters
                and abs(other.parameters - entry.parameters) <= 0.1 * entry.parameters):
            return other.path
    return None


class TrainDrafterDialog(QDialog):
    """Train a drafter for one target: a Hugging Face folder, or a GGUF file. For a GGUF, llama.cpp
    records the data from the file itself, or, when the library has the same model's Hugging Face
    folder (`hf_folder`, which the user can change or clear), PyTorch records from its safetensors;
    either way the drafter is exported for that file too (an MTP layer inside a copy of it)."""

    # "Use it": (target, draft or "", method) to load: the trained drafter with its target (its GGUF
    # when there is one); an MTP layer comes inside a copy of the target, which is then the target
    use_trained = Signal(str, str, str)

    def __init__(self, target: str, parent: Optional[QWidget] = None, hf_folder: Optional[str] = None,
                 draft: Optional[str] = None, out: Optional[str] = None, extra: tuple[str, ...] = ()):
        super().__init__(parent)
        gguf = Path(target).suffix.lower() == ".gguf"
        self.target_gguf = target if gguf else None
        self.draft, self.out, self.extra = draft, out, tuple(extra)
        self.job: Optional[TrainingJob] = None
        self.result: Optional[dict] = None
        self.curve_steps: list[float] = []
        self.curve_accepted: list[float] = []
        self.setWindowTitle(f"Train a drafter for {Path(target).name}")
        self.target_name = Path(target).name
        self.resize(720, 560)
        layout = QVBoxLayout(self)
        layout.addLayout(self._build_form(target, gguf, hf_folder))
        self._build_progress(layout)
        layout.addLayout(self._build_buttons())
        self.timer = QTimer(self)
        self.timer.setInterval(POLL_MS)
        self.timer.timeout.connect(self.poll)
        self.method.currentIndexChanged.connect(self._update)
        self.folder.textChanged.connect(self._update)
        self._update()

    def _build_form(self, target: str, gguf: bool, hf_folder: Optional[str]) -> QFormLayout:
        """What the command asks: the Hugging Face folder of a GGUF, method, budget, device, history."""
        self.method = QComboBox(self)
        for label, method in method_choices():
            self.method.addItem(label, method)
        self.minutes = QDoubleSpinBox(self)
        self.minutes.setRange(1, 24 * 60)
        self.minutes.setDecimals(0)
        self.minutes.setValue(20)
        self.minutes.setSuffix(" min")
        self.minutes.setToolTip("training time; the run ends with its best checkpoint when it is spent")
        self.device = QComboBox(self)
        for device in ("auto", "cpu", "cuda", "mps"):
            self.device.addItem(device, device)
        n = self.history_messages = history_count()
        self.from_history = QCheckBox(f"Also learn from my saved chats ({n} message{'s' * (n != 1)}; read on this "
                                      "machine, nothing leaves it)", self)
        self.from_history.setChecked(False)
        self.from_history.setEnabled(n > 0)
        self.out_label = QLabel(self)
        self.out_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.folder = QLineEdit((hf_folder or "") if gguf else target, self)
        self.folder.setPlaceholderText("optional: the model's Hugging Face folder")
        self.folder.setToolTip("Empty: llama.cpp runs the GGUF to make the training data, and an MTP layer is "
                               "written into a copy of the file, its own weights unchanged. A folder of the same "
                               "model: PyTorch runs its safetensors instead. Either way the drafter is exported "
                               "for the file you chose.")
        browse = QPushButton("Choose…", self)
        browse.clicked.connect(self._choose_folder)
        folder_row = QHBoxLayout()
        folder_row.addWidget(self.folder, 1)
        folder_row.addWidget(browse)
        form = QFormLayout()
        if gguf:
            form.addRow("GGUF", QLabel(Path(target).name, self))
            form.addRow("Hugging Face folder", folder_row)
        else:
            self.folder.hide()
            browse.hide()
        form.addRow("Method", self.method)
        form.addRow("Time budget", self.minutes)
        form.addRow("Device", self.device)
        form.addRow("", self.from_history)
        form.addRow("Saved to", self.out_label)
        return form

    def _build_progress(self, layout: QVBoxLayout) -> None:
        """The bar, the status line, the held-out curve, the log and the verdict."""
        self.bar = QProgressBar(self)
        self.bar.setRange(0, PROGRESS_STEPS)
        self.bar.setValue(0)
        self.bar.setFormat("not started")
        self.status = QLabel(INTRO, self)
        self.status.setWordWrap(True)
        self.plot = make_plot("Held-out mean accepted tokens", "training steps", self)
        self.plot.setMinimumHeight(140)
        self.plot.enableAutoRange()  # a handful of points, refreshed at each evaluation
        self.plot.setMouseEnabled(False, False)
        color = theme.accent(self.palette())
        self.curve = self.plot.plot([], [], pen=pg.mkPen(color, width=2), symbol="o", symbolSize=6,
                                    symbolBrush=color, symbolPen=color)
        self.log = QPlainTextEdit(self)
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(500)
        self.log.setFixedHeight(90)
        self.verdict = QLabel("", self)
        self.verdict.setWordWrap(True)
        layout.addWidget(self.bar)
        layout.addWidget(self.status)
        layout.addWidget(self.plot, 1)
        layout.addWidget(self.log)
        layout.addWidget(self.verdict)

    def _build_buttons(self) -> QHBoxLayout:
        self.start_button = QPushButton("Start", self)
        self.pause_button = QPushButton("Pause", self)
        self.resume_button = QPushButton("Resume", self)
        self.cancel_button = QPushButton("Cancel", self)
        self.use_button = QPushButton("Use it", self)
        self.use_button.setToolTip("load the target with the trained drafter (whether adopted or not)")
        self.close_button = QPushButton("Close", self)
        buttons = QHBoxLayout()
        for b in (self.start_button, self.pause_button, self.resume_button, self.cancel_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        buttons.addWidget(self.use_button)
        buttons.addWidget(self.close_button)
        self.start_button.clicked.connect(lambda: self.start(resume=False))
        self.resume_button.clicked.connect(lambda: self.start(resume=True))
        self.pause_button.clicked.connect(self.pause)
        self.cancel_button.clicked.connect(self.cancel)
        self.use_button.clicked.connect(self._use_clicked)
        self.close_button.clicked.connect(self.close)
        return buttons

    # --- state ----------------------------------------------------------------------------
    @property
    def target(self) -> str:
        """What the command trains from: the folder given, else the GGUF itself."""
        return self.folder.text().strip() or self.target_gguf or ""

    def folder_problem(self) -> Optional[str]:
        """Why training cannot start on the folder given, or None (a GGUF without one trains from the
        file itself, whatever the method)."""
        folder = self.folder.text().strip()
        if not folder and self.target_gguf:
            return None
        if not folder:
            return "choose the model's Hugging Face folder: training reads its safetensors"
        if not (Path(folder) / "config.json").is_file():
            return f"{folder} is not a Hugging Face model folder (it has no config.json)"
        return None

    def _choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "The model's Hugging Face folder")
        if folder:
            self.folder.setText(folder)

    def request(self) -> TrainingRequest:
        from_folder = self.target != self.target_gguf  # else the command exports for the GGUF it trains from
        return TrainingRequest(self.target, method=self.method.currentData(), minutes=self.minutes.value(),
                               device=self.device.currentData(), from_history=self.from_history.isChecked(),
                               target_gguf=self.target_gguf if from_folder else None, draft=self.draft,
                               out=self.out, extra=self.extra)

    def _resumable(self) -> bool:
        from specdesk.app.training.loop import CHECKPOINT

        out = self.request().out_folder()
        return (out / CHECKPOINT).is_file() or (out / "cache").is_dir()

    def _update(self) -> None:
        running = self.job is not None and self.job.running
        problem = self.folder_problem()
        if problem is not None:
            self.out_label.setText("-")
            self.status.setText(problem)
            for b in (self.start_button, self.resume_button, self.pause_button, self.cancel_button, self.use_button):
                b.setEnabled(False)
            return
        if self.job is None:
            self.status.setText(INTRO)
        out = self.request().out_folder()
        self.out_label.setText(str(out))
        finished = (out / "provenance.json").is_file()
        resumable = not running and not finished and self._resumable()
        for w in (self.method, self.minutes, self.device, self.from_history):
            w.setEnabled(not running and (w is not self.from_history or self.history_messages > 0))
        self.start_button.setEnabled(not running and not resumable and not finished)
        self.start_button.setToolTip(f"{out} holds a finished run: choose another method, or remove the folder"
                                     if finished else f"{out} holds a run: Resume continues it" if resumable else "")
        self.resume_button.setEnabled(resumable)
        self.pause_button.setEnabled(running)
        self.cancel_button.setEnabled(running)
        self.use_button.setEnabled(self.result is not None)

    # --- actions --------------------------------------------------------------------------
    def start(self, resume: bool = False) -> None:
        if self.job is not None and self.job.running:
            return
        self.result = None
        self.verdict.setText("")
        if not resume:
            self.curve_steps, self.curve_accepted = [], []
            self.curve.setData([], [])
        if self.job is not None:
            self.job.close()  # the run before (paused, cancelled or done): its queue
        self.job = TrainingJob(self.request(), resume=resume)
        self.job.start()
        self.bar.setRange(0, 0)  # busy until the first event: loading the target
        self.status.setText(f"loading {self.target_name}…")
        self.timer.start()
        self._update()

    def pause(self) -> None:
        if self.job is not None and self.job.running:
            self.job.pause()
            self.status.setText("pausing after the step in hand (the run is checkpointed; Resume continues it)…")
            self.pause_button.setEnabled(False)

    def cancel(self) -> None:
        if self.job is not None and self.job.running:
            self.job.cancel()
            self.poll()
            self.status.setText("cancelled: what was recorded and the last checkpoint are kept (Resume continues)")
            self._update()

    def poll(self) -> None:
        if self.job is None:
            return
        for event in self.job.events():
            self.show_event(event)
        if not self.job.running:
            self.timer.stop()
            self._update()

    # --- events ---------------------------------------------------------------------------
    def show_event(self, event: dict) -> None:
        phase = event.get("phase")
        if phase == "message":
            self.log.appendPlainText(event["text"])
        elif phase == "record":
            total = max(1, event["total"])
            self.bar.setRange(0, PROGRESS_STEPS)
            self.bar.setValue(int(PROGRESS_STEPS * event["done"] / total))
            what = "held-out" if event["set"] == "held" else "training"
            self.bar.setFormat(f"recording the target's answers ({what}): {event['done']}/{event['total']}")
            self.status.setText("The target answers each prompt; its hidden states and top-32 log-probabilities "
                                "are kept for training.")
        elif phase == "train":
            self._show_training(event)
        elif phase == "measure":
            self.bar.setRange(0, 0)
            self.status.setText(f"measuring the drafter against what the target already has, on "
                                f"{event['prompts']} held-out prompts…")
        elif phase == "done":
            self.result = event
            self.bar.setRange(0, PROGRESS_STEPS)
            self.bar.setValue(PROGRESS_STEPS)
            self.bar.setFormat("done")
            verdict = "Adopted" if event["adopted"] else "Kept, not adopted"
            self.verdict.setText(f"<b>{verdict}:</b> {event['reason']}. Provenance: {event['provenance']}")
            self.status.setText(f"drafter: {event.get('gguf') or event['drafter']}")
        elif phase == "paused":
            self.bar.setRange(0, PROGRESS_STEPS)
            self.bar.setFormat(f"paused {event['where']}")
            self.status.setText("Paused. Resume continues from the checkpoint.")
        elif phase == "exit":
            code = event["code"]
            if code not in (0, PAUSED) and not (self.job is not None and self.job.cancelled):
                self.bar.setRange(0, PROGRESS_STEPS)
                self.bar.setFormat("failed")
                errors = [line for line in self.log.toPlainText().splitlines() if line.startswith("error")]
                self.status.setText(errors[-1] if errors else f"training stopped (exit status {code}); see the log")

    def _show_training(self, event: dict) -> None:
        budget = max(1e-9, event["budget_s"])
        self.bar.setRange(0, PROGRESS_STEPS)
        self.bar.setValue(min(PROGRESS_STEPS, int(PROGRESS_STEPS * event["elapsed_s"] / budget)))
        loss = "-" if event.get("loss") is None else f"{event['loss']:.4f}"
        left = format_left(budget - event["elapsed_s"])
        self.bar.setFormat(f"training: step {event['step']} · loss {loss} · {left} left")
        acceptance = event.get("acceptance")
        if acceptance:
            mean = sum(acceptance)
            self.curve_steps.append(event["step"])
            self.curve_accepted.append(mean)
            self.curve.setData(self.curve_steps, self.curve_accepted)
            per_position = "/".join(f"{a:.2f}" for a in acceptance)
            self.status.setText(f"held-out acceptance per position {per_position} (mean accepted {mean:.2f}) "
                                f"at step {event['step']}")

    def _use_clicked(self) -> None:
        if self.result is None:
            return
        method = self.result.get("method", self.method.currentData())
        drafter = self.result.get("gguf") or self.result["drafter"]
        if row(method).in_target:  # the layer came inside a copy of the target, which is then the target
            self.use_trained.emit(drafter, "", runs_as(method))
        else:
            self.use_trained.emit(self.target_gguf or self.target, drafter, runs_as(method))

    def closeEvent(self, event) -> None:
        if self.job is not None and self.job.running:
            self.job.pause()  # a closed dialog leaves a resumable run, not a half-written one
            self.job.process.join(timeout=30)
        if self.job is not None:
            self.job.close()  # cancels one that did not pause in time, and closes its queue
        self.timer.stop()
        super().closeEvent(event)
