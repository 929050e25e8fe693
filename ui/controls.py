"""The left panel: models, method, sampling, limits, the chat's preset and system prompt, which
scroll; and under them, outside the scrolling part so that it is always in view, the list of
past chats (`chats_box`, ui/chats_panel.py placed in it with `show_chats`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtWidgets import (QComboBox, QDoubleSpinBox, QFileDialog, QFormLayout, QGroupBox, QLineEdit,
                               QPlainTextEdit, QScrollArea, QSpinBox, QVBoxLayout, QWidget)

from specdesk.app.storage.settings import DEMO, DEMO_DFLASH, DEMO_HF, DEMO_MTP, RANGES, Settings
from specdesk.engines.llama.fit import DEFAULT_CONTEXT
from specdesk.engines.methods import (METHODS, demo_drafter_method, method_info, method_names, needs_draft_model,
                                      uses_file)
from specdesk.engines.types import SamplingParams, SpecConfig, SpecDeskError

BROWSE = "\0browse"  # combo item data of "Open GGUF file…"
BROWSE_FOLDER = "\0folder"  # combo item data of "Open model folder…" (Hugging Face safetensors)
TARGETS = [("Demo target (built in)", DEMO), ("Demo target with MTP (llama.cpp)", DEMO_MTP),
           ("Demo target, PyTorch (built in)", DEMO_HF)]
DRAFTS = [("No draft model", None), ("Demo draft (built in)", DEMO), ("Demo DFlash drafter (built in)", DEMO_DFLASH)]
TRAIN = "\0train"  # combo item data of "Train a drafter for this model…"
HIDDEN = "\0hidden"  # combo item data of the "N incompatible hidden" line
DEVICE_CHOICES = ("auto", "CPU")  # or any name `specdesk devices` lists, typed in
LAYER_CHOICES = ("auto", "all", "0")  # or a number, typed in
# engines/llama/draft_copy.DRAFT_WEIGHTS, as the Limits group names them
DRAFT_WEIGHT_CHOICES = (("q8", "Q8_0 copy"), ("file", "its own file"))

def spin_box(parent: QWidget, key: str, step: float = 0, special: str = "") -> QSpinBox | QDoubleSpinBox:
    """A spin box over a setting's range (RANGES[key]): a QDoubleSpinBox when the range is in
    fractions. `special` is shown at the minimum."""
    low, high = RANGES[key]
    spin = QDoubleSpinBox(parent) if isinstance(low, float) else QSpinBox(parent)
    spin.setRange(low, high)
    if step:
        spin.setSingleStep(step)
    if special:
        spin.setSpecialValueText(special)
    return spin


def add_rows(form: QFormLayout, *rows: tuple[str, QWidget]) -> None:
    for label, widget in rows:
        form.addRow(label, widget)


def set_clamped(spin: QSpinBox | QDoubleSpinBox, value: float) -> None:
    """setValue within the box's range: QSpinBox.setValue raises OverflowError past 32 bits,
    and a NaN would become the maximum. Settings are checked on load (app/storage/settings.py);
    this keeps any other caller from taking the window down."""
    if isinstance(value, float) and math.isnan(value):
        value = spin.minimum()
    value = min(max(value, spin.minimum()), spin.maximum())
    spin.setValue(int(value) if isinstance(spin, QSpinBox) else float(value))


class ControlsPanel(QScrollArea):
    MAX_MIN_WIDTH = 330  # pixels: a wider form (a large font) scrolls sideways, the chat keeps the room

    models_changed = Signal()  # target, draft, threads or context changed: reload on the worker
    train_requested = Signal(object)  # "Train a drafter for this model…" in the draft picker: the target's choice
    system_prompt_changed = Signal(str)  # edited, or set by a preset

    def __init__(self, settings: Settings, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAsNeeded)  # only past MAX_MIN_WIDTH (a large font)
        body = QWidget(self)
        self.setWidget(body)
        self._settings = settings
        self._supported: tuple[str, ...] = method_names()
        self._engine_name = "the engine"
        self._previous: dict[str, int] = {}
        self._draft_verdicts: dict[str, tuple[str, ...]] = {}  # draft choice -> why it cannot serve the target
        self._draft_checked: set = set()  # the draft choices the last load checked against its target

        boxes = (self._build_models(body), self._build_sampling(body), self._build_limits(body), self._build_chat(body))
        # The window puts it under this panel (a list one had to scroll the settings to find was
        # off screen in a short window).
        self.chats_box = QGroupBox("Chats")
        chats_layout = QVBoxLayout(self.chats_box)
        chats_layout.setContentsMargins(4, 4, 4, 4)

        layout = QVBoxLayout(body)
        layout.setContentsMargins(4, 4, 4, 4)
        for box in boxes:
            layout.addWidget(box)
        layout.addStretch(1)

        self.apply_settings(settings)
        self._connect()
        self._loaded_key = self.model_key()

    def _build_models(self, body: QWidget) -> QGroupBox:
        """Target, method, draft and k."""
        models = QGroupBox("Models", body)
        form = QFormLayout(models)
        self.target_combo = QComboBox(models)
        self.target_combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.target_combo.setMinimumContentsLength(12)
        self.target_combo.setObjectName("target")
        self.draft_combo = QComboBox(models)
        self.draft_combo.setObjectName("draft")
        self.draft_combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.draft_combo.setMinimumContentsLength(12)
        self.method_combo = QComboBox(models)
        for method in method_names():
            self.method_combo.addItem(METHODS[method].label, method)
        self.k_spin = spin_box(models, "k")
        self.k_spin.setToolTip("Draft tokens proposed per step (the upper bound for variable-length proposers)")
        add_rows(form, ("Target", self.target_combo), ("Method", self.method_combo), ("Draft", self.draft_combo),
                 ("k", self.k_spin))
        return models

    def _build_sampling(self, body: QWidget) -> QGroupBox:
        sampling = QGroupBox("Sampling", body)
        form = QFormLayout(sampling)
        self.temperature_spin = spin_box(sampling, "temperature", step=0.1, special="0 (greedy)")
        self.temperature_spin.setDecimals(2)
        self.top_p_spin = spin_box(sampling, "top_p", step=0.05)
        self.top_k_spin = spin_box(sampling, "top_k", special="off")
        self.seed_spin = spin_box(sampling, "seed")
        add_rows(form, ("Temperature", self.temperature_spin), ("Top-p", self.top_p_spin), ("Top-k", self.top_k_spin),
                 ("Seed", self.seed_spin))
        return sampling

    def _build_limits(self, body: QWidget) -> QGroupBox:
        """Max tokens, threads, context, and where a GGUF's layers sit (llama.cpp's -dev/-ngl, -devd/-ngld, --rpc)."""
        limits = QGroupBox("Limits", body)
        form = QFormLayout(limits)
        self.max_tokens_spin = spin_box(limits, "max_tokens")
        self.threads_spin = spin_box(limits, "threads", special="auto")
        self.ctx_spin = spin_box(limits, "n_ctx", step=256, special="model's")
        self.ctx_spin.setToolTip(f"Context size in tokens (default: the model's own, at most {DEFAULT_CONTEXT})")
        add_rows(form, ("Max tokens", self.max_tokens_spin), ("Threads", self.threads_spin), ("Context", self.ctx_spin))
        self.device_combo = self._choice_combo(limits, DEVICE_CHOICES, "Target's device: auto (the first GPU or RPC "
                                               "device), CPU, or a name `specdesk devices` lists")
        self.gpu_layers_combo = self._choice_combo(limits, LAYER_CHOICES, "Target's layers on its device: auto "
                                                   "(every layer that fits with its KV cache), all, or a number")
        self.draft_device_combo = self._choice_combo(limits, DEVICE_CHOICES, "Draft model's or drafter's device")
        self.draft_gpu_layers_combo = self._choice_combo(limits, LAYER_CHOICES, "Draft's layers on its device")
        self.draft_weights_combo = QComboBox(limits)
        for value, label in DRAFT_WEIGHT_CHOICES:
            self.draft_weights_combo.addItem(label, value)
        self.draft_weights_combo.setToolTip("A GGUF draft model stored in F16, BF16 or F32, on the CPU: run it from "
                                            "a Q8_0 copy made once in the cache folder (every step re-reads the "
                                            "draft's weights, so fewer bytes run faster; the target checks every "
                                            "token, so output is unchanged), or from its own file")
        self.rpc_edit = QLineEdit(limits)
        self.rpc_edit.setPlaceholderText("HOST:PORT, …")
        self.rpc_edit.setToolTip("llama.cpp RPC servers (rpc-server on this or another machine): their devices "
                                 "can then take layers like a GPU")
        add_rows(form, ("Device", self.device_combo), ("GPU layers", self.gpu_layers_combo),
                 ("Draft device", self.draft_device_combo), ("Draft GPU layers", self.draft_gpu_layers_combo),
                 ("Draft weights", self.draft_weights_combo), ("RPC servers", self.rpc_edit))
        return limits

    def _build_chat(self, body: QWidget) -> QGroupBox:
        """The preset and the system prompt."""
        chat = QGroupBox("Chat", body)
        form = QFormLayout(chat)
        self.preset_combo = QComboBox(chat)
        self.preset_combo.setToolTip("Sampling settings and a system prompt, chosen together")
        self.system_prompt_edit = QPlainTextEdit(chat)
        self.system_prompt_edit.setPlaceholderText("System prompt (none)")
        self.system_prompt_edit.setToolTip("What the model is told before the conversation: kept with each chat, "
                                           "and a new chat starts with the preset's")
        self.system_prompt_edit.setTabChangesFocus(True)
        self.system_prompt_edit.setFixedHeight(self.system_prompt_edit.fontMetrics().lineSpacing() * 4 + 12)
        add_rows(form, ("Preset", self.preset_combo), ("System", self.system_prompt_edit))
        return chat

    def _connect(self) -> None:
        """A picked model, a changed method, limit or placement, a preset, an edited system prompt."""
        self.target_combo.activated.connect(lambda index: self._model_picked(self.target_combo, "target"))
        self.draft_combo.activated.connect(lambda index: self._model_picked(self.draft_combo, "draft"))
        self.method_combo.currentIndexChanged.connect(self._update_enabled)
        self.threads_spin.editingFinished.connect(self._maybe_reload)
        self.ctx_spin.editingFinished.connect(self._maybe_reload)
        for combo in self._placement_combos():
            combo.activated.connect(lambda index: self._maybe_reload())
            combo.lineEdit().editingFinished.connect(self._maybe_reload)
        self.rpc_edit.editingFinished.connect(self._maybe_reload)
        self.draft_weights_combo.activated.connect(lambda index: self._maybe_reload())
        self.preset_combo.activated.connect(lambda index: self.use_preset(self.preset_combo.itemData(index)))
        self.system_prompt_edit.textChanged.connect(
            lambda: self.system_prompt_changed.emit(self.system_prompt_edit.toPlainText()))

    def minimumSizeHint(self) -> QSize:
        """Wide enough for the form (it scrolls only vertically) up to MAX_MIN_WIDTH; the height
        of a few rows, since it scrolls."""
        form = self.widget().minimumSizeHint().width() + self.verticalScrollBar().sizeHint().width() + 6
        return QSize(min(form, self.MAX_MIN_WIDTH), super().minimumSizeHint().height())

    # --- settings <-> widgets ---------------------------------------------------------
    def apply_settings(self, s: Settings) -> None:
        self._fill_models(self.target_combo, TARGETS, s.recent_targets, s.target_path)
        self._fill_models(self.draft_combo, DRAFTS,
                          s.recent_drafts, s.draft_path)
        self._select_method(s.method)
        for spin, value in ((self.k_spin, s.k), (self.temperature_spin, s.temperature), (self.top_p_spin, s.top_p),
                            (self.top_k_spin, s.top_k), (self.seed_spin, s.seed),
                            (self.max_tokens_spin, s.max_tokens), (self.threads_spin, s.threads),
                            (self.ctx_spin, s.n_ctx)):
            set_clamped(spin, value)
        for combo, value in zip(self._placement_combos(), (s.device, s.gpu_layers, s.draft_device, s.draft_gpu_layers)):
            combo.setCurrentText(value)
        self.rpc_edit.setText(s.rpc_servers)
        self.draft_weights_combo.setCurrentIndex(max(0, self.draft_weights_combo.findData(s.draft_weights)))
        self._fill_presets(s)
        self.show_system_prompt(s.system_prompt)
        self._update_enabled()

    def store_settings(self, s: Settings) -> None:
        s.target_path = self.target_combo.currentData() or DEMO
        s.draft_path = self.draft_combo.currentData()
        s.method = self.method()
        s.k = self.k_spin.value()
        s.temperature = self.temperature_spin.value()
        s.top_p = self.top_p_spin.value()
        s.top_k = self.top_k_spin.value()
        s.seed = self.seed_spin.value()
        s.max_tokens = self.max_tokens_spin.value()
        s.threads = self.threads_spin.value()
        s.n_ctx = self.ctx_spin.value()
        if self.placement_error() is None:  # a bad value keeps the last good one (load_models says why)
            s.device, s.gpu_layers, s.draft_device, s.draft_gpu_layers = (
                c.currentText().strip() or "auto" for c in self._placement_combos())
            s.rpc_servers = self.rpc_edit.text().strip()
        s.draft_weights = self.draft_weights_combo.currentData()

    # --- placement ----------------------------------------------------------------------
    @staticmethod
    def _choice_combo(parent: QWidget, choices: tuple[str, ...], tip: str) -> QComboBox:
        combo = QComboBox(parent)
        combo.setEditable(True)
        combo.addItems(choices)
        combo.setToolTip(tip)
        return combo

    def _placement_combos(self) -> tuple[QComboBox, ...]:
        return self.device_combo, self.gpu_layers_combo, self.draft_device_combo, self.draft_gpu_layers_combo

    def placement_error(self) -> Optional[str]:
        """One line for a placement value that cannot be right, else None."""
        from specdesk.engines.llama.placement import parse_gpu_layers
        from specdesk.engines.llama.rpc import parse_endpoints

        try:
            parse_gpu_layers(self.gpu_layers_combo.currentText(), "GPU layers")
            parse_gpu_layers(self.draft_gpu_layers_combo.currentText(), "Draft GPU layers")
            parse_endpoints(self.rpc_edit.text())
        except SpecDeskError as e:
            return str(e)
        return None

    def _fill_models(self, combo: QComboBox, fixed: list, recent: list, current) -> None:
        combo.blockSignals(True)
        combo.clear()
        for label, data in fixed:
            combo.addItem(label, data)
        for path in recent:
            combo.addItem(Path(path).name, path)
            combo.setItemData(combo.count() - 1, path, Qt.ToolTipRole)
        if current not in [combo.itemData(i) for i in range(combo.count())]:
            combo.addItem(Path(current).name, current)
            combo.setItemData(combo.count() - 1, current, Qt.ToolTipRole)
        if combo is self.draft_combo:
            self._hide_incompatible(current)
        combo.addItem("Open GGUF file…", BROWSE)
        combo.addItem("Open model folder…", BROWSE_FOLDER)
        combo.setItemData(combo.count() - 1, "A Hugging Face model folder (config.json + safetensors), run by "
                          "the PyTorch engine", Qt.ToolTipRole)
        if combo is self.draft_combo:
            combo.addItem("Train a drafter for this model…", TRAIN)
            combo.setItemData(combo.count() - 1, "Train an EAGLE-3 head, MTP layer or DFlash drafter for the target "
                              "here, from its own answers", Qt.ToolTipRole)
        combo.setCurrentIndex([combo.itemData(i) for i in range(combo.count())].index(current))
        combo.blockSignals(False)
        self._previous[combo.objectName()] = combo.currentIndex()

    def _hide_incompatible(self, current) -> None:
        """Only drafts that can serve the loaded target stay pickable; one disabled line says
        how many were left out, and its tooltip says why for each. The built-in demo drafters
        are made for the demo target: for another target they are offered only where a check
        found them fitting (a copy of the demo target)."""
        from .model_choice import is_demo_model

        combo = self.draft_combo
        hidden = []
        demo_target = is_demo_model(self._settings.target_path)
        for i in range(combo.count() - 1, -1, -1):
            choice = combo.itemData(i)
            reasons = self._draft_verdicts.get(choice)
            if choice in (DEMO, DEMO_DFLASH) and not demo_target and choice not in self._draft_checked:
                reasons = ("made for the demo target only",)
            if reasons and choice != current:
                hidden.append(f"{combo.itemText(i)}: {'; '.join(reasons)}")
                combo.removeItem(i)
        if hidden:
            combo.addItem(f"{len(hidden)} incompatible draft{'s' * (len(hidden) != 1)} hidden", HIDDEN)
            index = combo.count() - 1
            combo.model().item(index).setEnabled(False)
            combo.setItemData(index, "Not compatible with this target (target vs draft):\n" + "\n".join(reversed(hidden)),
                              Qt.ToolTipRole)

    def draft_choices(self) -> list:
        """Every draft the picker knows of (paths or DEMO), for a compatibility check."""
        s = self._settings
        choices = [DEMO, *s.recent_drafts]
        if s.draft_path not in choices and s.draft_path is not None:
            choices.append(s.draft_path)
        return choices

    def set_draft_verdicts(self, verdicts: dict) -> None:
        self._draft_checked = set(verdicts)
        self._draft_verdicts = {choice: tuple(reasons) for choice, reasons in verdicts.items() if reasons}
        self._fill_models(self.draft_combo, DRAFTS,
                          self._settings.recent_drafts, self.draft_combo.currentData())

    def _model_picked(self, combo: QComboBox, role: str) -> None:
        key = combo.objectName()
        if combo.currentData() == TRAIN:
            combo.setCurrentIndex(self._previous.get(key, 0))
            self.train_requested.emit(self.target_combo.currentData())
            return
        if combo.currentData() in (BROWSE, BROWSE_FOLDER):
            if combo.currentData() == BROWSE:
                path, _ = QFileDialog.getOpenFileName(self, f"Choose a {role} model", "",
                                                      "GGUF models (*.gguf);;All files (*)")
            else:
                path = QFileDialog.getExistingDirectory(self, f"Choose a {role} model folder")
            if not path:
                combo.setCurrentIndex(self._previous.get(key, 0))
                return
            self.set_model(role, path)
            return
        self._previous[key] = combo.currentIndex()
        takes_model = method_info(self.method()).takes == "draft_model"  # draft, or auto with a draft model
        if role == "draft" and combo.currentData() is not None and not takes_model:
            self._select_method(demo_drafter_method(combo.currentData()) or "draft")
        self._maybe_reload()

    def set_model(self, role: str, path: Optional[str]) -> None:
        """Select a target or draft (a path, DEMO, or None for no draft) and reload."""
        self.store_settings(self._settings)
        if role == "target":
            if path != DEMO:
                self._settings.remember_target(path)
            self._settings.target_path = path
        else:
            if path not in (DEMO, None):
                self._settings.remember_draft(path)
            self._settings.draft_path = path
        self._fill_models(self.target_combo, TARGETS, self._settings.recent_targets,
                          self._settings.target_path)
        self._fill_models(self.draft_combo, DRAFTS,
                          self._settings.recent_drafts, self._settings.draft_path)
        if role == "draft" and path is not None and self.method() != "auto":
            self._select_method("draft")
        self._maybe_reload()

    def show_models(self, target: str, draft: Optional[str]) -> None:
        """Show this target and draft as selected, without asking for a reload."""
        self._settings.target_path, self._settings.draft_path = target, draft
        self._fill_models(self.target_combo, TARGETS, self._settings.recent_targets, target)
        self._fill_models(self.draft_combo, DRAFTS,
                          self._settings.recent_drafts, draft)
        self.mark_loaded()

    def _maybe_reload(self) -> None:
        key = self.model_key()
        if key != self._loaded_key:
            self._loaded_key = key
            self.models_changed.emit()

    def use_models(self, target: str, draft: Optional[str], method: str = "auto") -> None:
        """"Use this model": this target with this draft (or none), remembered, method auto (which
        drafts with whatever the draft is) or `method` (a trained drafter's own), and one reload."""
        self.store_settings(self._settings)
        self._settings.remember_target(target)
        if draft is not None:
            self._settings.remember_draft(draft)
        self._settings.target_path, self._settings.draft_path = target, draft
        self._fill_models(self.target_combo, TARGETS, self._settings.recent_targets, target)
        self._fill_models(self.draft_combo, DRAFTS, self._settings.recent_drafts, draft)
        # The models change with it: what the loaded ones support does not decide (the load's
        # set_supported_methods falls back if the new ones cannot run it).
        index = self.method_combo.findData(method)
        if index >= 0:
            self.method_combo.setCurrentIndex(index)
        self._maybe_reload()

    def forget_model(self, role: str, path: str) -> None:
        """A file that failed to load leaves its picker's recent list (the picker shows what is loaded)."""
        s = self._settings
        if role == "target":
            s.recent_targets = [p for p in s.recent_targets if p != path]
        else:
            s.recent_drafts = [p for p in s.recent_drafts if p != path]

    def model_key(self) -> tuple:
        return (self.target_combo.currentData(), self.draft_combo.currentData(), self.threads_spin.value(),
                self.ctx_spin.value(), *(c.currentText().strip() for c in self._placement_combos()),
                self.rpc_edit.text().strip(), self.draft_weights_combo.currentData())

    def mark_loaded(self) -> None:
        self._loaded_key = self.model_key()

    # --- methods ----------------------------------------------------------------------
    def method(self) -> str:
        return self.method_combo.currentData()

    def select_method(self, method: str) -> None:
        """Choose `method` when the loaded models can run it (else the choice stays)."""
        self._select_method(method)

    def _select_method(self, method: str) -> None:
        index = self.method_combo.findData(method)
        if index >= 0 and self._method_enabled(method):
            self.method_combo.setCurrentIndex(index)

    def _method_enabled(self, method: str) -> bool:
        return method in self._supported

    def set_supported_methods(self, supported: tuple[str, ...], engine_name: str,
                              reasons: Optional[dict[str, str]] = None, fallback: str = "none") -> None:
        """Disable methods the loaded engine or target cannot run, with a tooltip saying why;
        if the chosen one is among them, switch to `fallback` (when it can run) or none."""
        reasons = reasons or {}
        self._supported, self._engine_name = tuple(supported), engine_name
        model = self.method_combo.model()
        for i in range(self.method_combo.count()):
            method = self.method_combo.itemData(i)
            item = model.item(i)
            enabled = method in supported
            item.setEnabled(enabled)
            if enabled:
                item.setToolTip(METHODS[method].help)
            else:
                reason = reasons.get(method) or METHODS[method].needs or "not implemented for this engine"
                item.setToolTip(f"Not available for this target on {engine_name}: {reason}.")
        if self.method() not in supported:
            self._select_method(fallback if fallback in supported else "none")
        self._update_enabled()

    def _update_enabled(self) -> None:
        method = self.method()
        self.k_spin.setEnabled(method != "none")
        self.method_combo.setToolTip(method_info(method).help)

    # --- what a run uses --------------------------------------------------------------
    def spec(self, draft_path: Optional[str]) -> SpecConfig:
        method = self.method()
        if needs_draft_model(method) and not draft_path:
            raise SpecDeskError(f"the {method} method needs a draft model: pick one under Models > Draft "
                                "(or choose ngram, which needs no model)")
        return SpecConfig(method=method, k=self.k_spin.value(), draft_path=draft_path if uses_file(method) else None)

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature_spin.value(), top_p=self.top_p_spin.value(),
                              top_k=self.top_k_spin.value(), seed=self.seed_spin.value())

    def max_tokens(self) -> int:
        return self.max_tokens_spin.value()

    # --- chat: preset, system prompt, the list of chats -------------------------------
    def _fill_presets(self, s: Settings) -> None:
        self.preset_combo.clear()
        for preset in s.all_presets():
            self.preset_combo.addItem(preset.name, preset.name)
            self.preset_combo.setItemData(self.preset_combo.count() - 1, preset.system_prompt or "no system prompt",
                                          Qt.ToolTipRole)
        index = self.preset_combo.findData(s.preset)
        if index >= 0:
            self.preset_combo.setCurrentIndex(index)

    def use_preset(self, name: str) -> None:
        """Choose a preset: its sampling settings fill the fields, and its system prompt the
        system prompt (for the chat on screen, and for new chats)."""
        s = self._settings
        self.store_settings(s)  # what else the fields hold stays
        preset = s.use_preset(name)
        for spin, value in ((self.temperature_spin, preset.temperature), (self.top_p_spin, preset.top_p),
                            (self.top_k_spin, preset.top_k), (self.max_tokens_spin, preset.max_tokens)):
            set_clamped(spin, value)
        self.preset_combo.setCurrentIndex(self.preset_combo.findData(preset.name))
        self.system_prompt_edit.setPlainText(preset.system_prompt)  # says so: system_prompt_changed

    def system_prompt(self) -> str:
        return self.system_prompt_edit.toPlainText()

    def show_system_prompt(self, text: str) -> None:
        """Show a chat's system prompt (without system_prompt_changed: nothing was edited)."""
        if self.system_prompt_edit.toPlainText() == text:
            return
        self.system_prompt_edit.blockSignals(True)
        self.system_prompt_edit.setPlainText(text)
        self.system_prompt_edit.blockSignals(False)

    def show_chats(self, panel: QWidget) -> None:
        """The list of chats (ui/chats_panel.ChatsPanel) in `chats_box`, which must stay in view."""
        from .clipping import must_be_seen

        panel.setMinimumHeight(120)
        self.chats_box.layout().addWidget(panel)
        must_be_seen(panel)
