"""How the main window picks what loads: a target with the draft that goes with it, however the
target was chosen (File ▸ Open, a library row's Use this model, a pairing row, the first-run
card's pair, `specdesk gui --target`, the target picker), and what the window says about it.

A draft left over from the previous target is never reported as an error: "Use this model"
and File ▸ Open ask app/models/choose.py for the draft that fits before loading, and a load
that still meets a leftover draft the engine refuses (the target picker, the saved settings
at startup) drops it quietly. Either way the status line says which draft, or none, goes
with the target, and why. Only a draft the user picked for the loaded target is refused
with a dialog.

`ModelChoosing` is the part of MainWindow (ui/main_window.py) that does this; it uses the
window's controls, models view, settings and status line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from specdesk.app.runtime.session import ModelInfo, file_label
from specdesk.app.storage.settings import DEMO, DEMO_DFLASH, DEMO_HF, DEMO_MTP
from specdesk.engines.methods import needs_draft_model

DEMO_CHOICES = (DEMO, DEMO_DFLASH, DEMO_HF, DEMO_MTP)  # the built-in models' settings values
DEMO_DRAFT_WORDS = {DEMO: "the built-in demo draft", DEMO_DFLASH: "the built-in demo DFlash drafter"}


def is_demo_model(path: Optional[str]) -> bool:
    """One of the demo family's models: a placeholder, or a file of a demo build (its card beside it)."""
    if path in DEMO_CHOICES:
        return True
    return bool(path) and (Path(path).parent / "card.json").is_file()


def draft_words(draft: Optional[str]) -> str:
    return DEMO_DRAFT_WORDS.get(draft, file_label(draft))


def refusal_reason(message: str) -> str:
    """The first difference a draft refusal names ("vocab size 49152 vs 4096"), from the engine's
    "draft X is not compatible with target Y: reason; reason; …"."""
    _, _, reasons = message.partition(": ")
    return (reasons or message).split("; ")[0].strip()


class ModelChoosing:
    """Mixed into MainWindow: choosing and loading models, and saying what loaded and why."""

    _use_note = ""  # why this draft (or none) goes with the target: said beside the models once they load
    _draft_left_over = False  # the load in progress keeps the previous target's draft for a new target

    # --- the ways a target is chosen -----------------------------------------------------------
    def open_model(self, folder: bool) -> None:
        """File > Open: a GGUF file or a Hugging Face model folder as the target."""
        from PySide6.QtWidgets import QFileDialog

        if folder:
            path = QFileDialog.getExistingDirectory(self, "Open a model folder")
        else:
            path, _ = QFileDialog.getOpenFileName(self, "Open a GGUF file", "", "GGUF models (*.gguf);;All files (*)")
        if path:
            self.open_target(path)

    def open_target(self, path: str) -> None:
        """A target the user opened (File > Open, `specdesk gui --target`): loaded with the draft
        that fits it, as "Use this model" does, keeping the method unless it needs a draft model
        and none fits (then auto, which drafts without one)."""
        self.use_model(path, keep_method=True)

    def use_model(self, path: str, keep_method: bool = False) -> None:
        """Load `path` as the target with the draft that goes with it (app/models/choose.py,
        worked out on the Models tab's lane): a draft that does not fit it is dropped, not reported."""
        from specdesk.app.models.choose import choose_for

        entries = list(self.models_view.entries)
        previous = self.settings.draft_path
        current = previous if previous not in DEMO_CHOICES else None
        self.status_label.setText(f"choosing a draft for {file_label(path)}…")
        self.models_view.submit(lambda job: choose_for(path, entries, current),
                                lambda choice: self._use_choice(choice, previous, keep_method))

    def _use_choice(self, choice, previous: Optional[str] = None, keep_method: bool = False) -> None:
        why = choice.why
        if choice.draft is None and previous in DEMO_DRAFT_WORDS and not is_demo_model(choice.target):
            why += f"; {draft_words(previous)} is made for the demo target only"
        method = self.controls.method() if keep_method else "auto"
        if needs_draft_model(method) and choice.draft is None:
            method = "auto"
        self._use_note = why  # said again beside the loaded models once they load
        self.controls.use_models(choice.target, choice.draft, method)
        self.tabs.setCurrentIndex(0)
        self.status_label.setText(why)

    def use_as_draft(self, path: str) -> None:
        """Draft for the loaded target with `path`, when it can (else why not, in one message)."""
        from specdesk.app.models.choose import draft_misfit

        if self.info is None:
            self.report_error(f"{file_label(path)}: load a target first, then choose its draft")
            return
        target, entries = self.info.target_path, list(self.models_view.entries)

        def checked(misfit) -> None:
            if misfit:
                self.report_error(f"{file_label(path)} cannot draft for {file_label(target)}: {misfit}")
            else:
                self.controls.set_model("draft", path)
                self.tabs.setCurrentIndex(0)

        self.models_view.submit(lambda job: draft_misfit(target, path, entries), checked)

    def use_pair(self, target: str, draft: str) -> None:
        """A target with a draft chosen for it (a pairing row, the first-run card's download)."""
        if self.first_run is not None and self.sender() is self.first_run:
            self._first_run_dismissed()
        self.controls.use_models(target, draft)
        self.tabs.setCurrentIndex(0)

    def use_trained(self, target: str, draft: str, method: str) -> None:
        """A drafter trained here, with its target and its own method."""
        self.controls.use_models(target, draft or None, method)
        self.tabs.setCurrentIndex(0)

    # --- a load that meets the previous target's draft ------------------------------------
    def _note_leftover(self, target: str, draft: Optional[str]) -> None:
        """Before a load: whether `draft` is left from another target (a new target, the same
        draft, or the first load of the session), so that a refusal of it is no error."""
        loaded_target, loaded_draft = self._loaded_choice
        self._draft_left_over = bool(draft) and target != loaded_target and (loaded_target is None
                                                                             or draft == loaded_draft)

    def _drop_leftover(self, message: str) -> bool:
        """The engine refused the draft of a load: when the draft was left from another target,
        the target runs without it, and the status line says so, with no dialog. False: the
        user chose that draft for this target, and the refusal is theirs to read."""
        if not self._draft_left_over or self.info is None:
            return False
        self._draft_left_over = False
        draft = self._requested_choice[1]
        target = file_label(self.info.target_path)
        self._use_note = (f"{target}: no draft model ({draft_words(draft)} does not fit it: "
                          f"{refusal_reason(message)}); Auto drafts without one")
        self._loaded_choice = (self._requested_choice[0], None)
        self.controls.show_models(self._requested_choice[0], None)
        if needs_draft_model(self.controls.method()) or self.controls.method() == "none":
            self.controls.select_method("auto")
        self._show_model_status()
        self.status_label.setToolTip(f"{self._use_note}\n\n{message}")
        if not self._prepare_auto():
            self._use_note = ""
        return True

    # --- what loaded --------------------------------------------------------------------------
    def _show_model_status(self) -> None:
        """What is loaded, most important first (the status line drops the last details when narrow)."""
        info = self.info
        if info is None:
            self.status_label.setText("no model loaded")
            return
        draft = f"draft {file_label(info.draft_path)}" if info.draft_path else "no draft model"
        parts = [f"{file_label(info.target_path)} ({info.n_params / 1e6:.1f} M parameters)", draft,
                 info.engine, f"context {info.n_ctx}", f"{info.threads} thread{'s' * (info.threads != 1)}"]
        if info.placement:
            parts.append(info.placement)
        if self._use_note:  # why this draft (or none) went with the model the user chose
            parts.insert(0, self._use_note)
            self.status_label.setToolTip(self._use_note)
        self.status_label.setText(" · ".join(parts))

    def _show_loaded_choice(self, failed: str) -> None:
        """After a refused model, the pickers show what is actually loaded again."""
        target, draft = self._requested_choice if failed == "draft" else self._loaded_choice
        if failed == "draft":
            previous = self._loaded_choice[1] if self._loaded_choice else None
            draft = previous if self.info is not None and self.info.draft_path else None
        if target is None:  # nothing ever loaded: keep the user's choice on screen
            return
        self._loaded_choice = (target, draft)
        self.controls.show_models(target, draft)

    def _fit_to_loaded(self, info: ModelInfo) -> None:
        """What depends on the kind of model that loaded: the first-run card goes once a model of
        the user's own runs, and the Compare tab's prompt suits it (code for the demo, a question
        for a chat model)."""
        own = not is_demo_model(self._requested_choice[0]) and not is_demo_model(info.target_path)
        if own and self.first_run is not None and self.first_run.isVisible():
            self._first_run_dismissed()
        self.compare_view.suit_prompt(chat_model=own and info.chat_template)

    def _first_run_dismissed(self) -> None:
        self.settings.first_run_done = True
        if self.first_run is not None:
            self.first_run.hide()
