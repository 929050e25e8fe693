"""The main window: controls on the left; Chat (transcript + live charts) and Compare tabs.

All inference goes through one EngineWorker, whether the local models or a server answer:
the window's `backend` is None for the local models or a server's ServedSession
(Servers > Add server…, ui/served_chat.py), and every chat and compare job carries it. One
chat controller takes each turn there (app/runtime/backend.chat_turn on the worker thread)
and mirrors how it ended: the reply saved, or the turn rolled back (its user message leaves
the transcript and the history, and its text returns to the input). The window only records
what arrives (streamed tokens, chart points) and draws it from one ~30 Hz timer that runs
while the worker is busy, so the event loop stays responsive however fast the model is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from PySide6.QtCore import QCoreApplication, Qt, QTimer, QUrl
from PySide6.QtGui import QAction, QActionGroup, QDesktopServices, QKeySequence
from PySide6.QtWidgets import QMainWindow, QMessageBox, QProgressBar, QSplitter, QTabWidget, QVBoxLayout, QWidget

from specdesk.app.chat.prompting import with_system_prompt
from specdesk.app.storage.history import History, chat_title
from specdesk.app.runtime.session import ModelInfo, file_label
from specdesk.app.storage.settings import DEMO, DEMO_HF, DEMO_MTP, Settings, read_settings, save_settings
from specdesk.engines.methods import drafter_methods
from specdesk.engines.types import SpecConfig, SpecDeskError

from .chat_view import ChatMessage, ChatView
from .charts import ChartPanel, format_status
from .chats_panel import ChatsPanel
from .compare_view import CompareView
from .controls import ControlsPanel
from .dialogs import ask, show_error
from .layout import FoldingSplitter, focus_chain, quiet_focus
from .first_run import FirstRunCard, make_card
from .model_choice import DEMO_CHOICES, ModelChoosing
from .models_view import ModelsView
from .served_chat import ServedChat
from .status_line import StatusLine
from .worker import ChatJob, EngineWorker, JobError, JobResult

REPAINT_INTERVAL_MS = 33  # ~30 Hz
NO_SHIPPED_FAMILY = "no trained demo family"


@dataclass
class _ChatJob:
    job: ChatJob  # its messages show how the turn ended
    chat_id: int
    message: ChatMessage  # the reply being generated
    user_id: Optional[int] = None  # the user's message this turn added (it goes when the turn is rolled back)
    user_text: str = ""  # its text (back to the input when the turn is rolled back)
    replaces: Optional[int] = None  # regenerate: the reply this one is another version of
    restore: Optional[int] = None  # edit: the original message, shown again when the turn is rolled back
    last_reason: Optional[str] = None  # method auto: the latest step's choice and why

    @property
    def job_id(self) -> int:
        return self.job.job_id

    @property
    def kept(self) -> bool:
        """The turn kept a reply (else it was rolled back: app/runtime/backend.settle)."""
        return bool(self.job.messages) and self.job.messages[-1]["role"] == "assistant"


def docs_location() -> Optional[Path]:
    """The user guide in this install's docs folder (a source checkout or an editable install), or None."""
    path = Path(__file__).resolve().parents[1] / "docs" / "usage.md"
    return path if path.is_file() else None


class MainWindow(ModelChoosing, QMainWindow):
    def __init__(self, settings: Optional[Settings] = None, history: Optional[History] = None,
                 settings_file: Optional[Path] = None, autoload: bool = True, first_run_card: bool = True):
        super().__init__()
        self.setWindowTitle("SpecDesk")
        self._settings_file = settings_file
        self._startup_errors: list[str] = []
        if settings is None:
            settings, notice = read_settings(settings_file)
            if notice:  # a bad settings file: said once the window shows, the app runs on defaults
                self._startup_errors.append(notice)
        self.settings = settings
        self.history = history if history is not None else self._open_history()
        self.worker = EngineWorker(self)
        self.backend = None  # a server's ServedSession while one is in use; None: the local models
        self.info: Optional[ModelInfo] = None
        self.chat_id: Optional[int] = None
        self._chat_job: Optional[_ChatJob] = None
        self._editing: Optional[int] = None  # the user's message being edited in the input (its history id)
        self._load_job: Optional[int] = None
        self._requested_choice: tuple = (None, None)
        self._loaded_choice: tuple = (None, None)  # (target, draft) settings values that loaded
        self._closed = False
        self._splitters_sized = False
        self.errors_shown = 0
        self.engine_stop_box: Optional[QMessageBox] = None  # the last "engine process stopped" message
        self.loads_reported = 0  # loading-progress updates shown (tests read it)

        self._apply_look()
        self.controls = ControlsPanel(self.settings, self)
        self.chats_panel = ChatsPanel(self.history, self)
        self.controls.show_chats(self.chats_panel)
        self.chat_view = ChatView(self)
        self.chat_view.set_highlight(self.settings.highlight_drafts)
        self.charts = ChartPanel(self)
        self.compare_view = CompareView(self.worker, self._compare_request, self.settings.compare_prompt, self,
                                        temperature=self.settings.compare_temperature)
        chat_tab = FoldingSplitter(self)  # the charts fold under the chat when the window is narrow
        chat_column = QWidget(chat_tab)  # the first-run card (until used or dismissed) above the chat
        column = QVBoxLayout(chat_column)
        column.setContentsMargins(0, 0, 0, 0)
        self.first_run: Optional[FirstRunCard] = None
        if first_run_card and not self.settings.first_run_done:
            self.first_run = make_card(chat_column)
            self.first_run.use_pair.connect(self.use_pair)
            self.first_run.dismissed.connect(self._first_run_dismissed)
            column.addWidget(self.first_run)
        column.addWidget(self.chat_view, 1)
        chat_tab.addWidget(chat_column)
        chat_tab.addWidget(self.charts)
        chat_tab.setStretchFactor(0, 3)
        chat_tab.setStretchFactor(1, 2)
        chat_tab.setChildrenCollapsible(False)
        self._chat_splitter = chat_tab
        chat_tab.folded.connect(self.charts.fold)  # under the chat, the plots in two columns
        self.tabs = QTabWidget(self)
        self.tabs.addTab(chat_tab, "Chat")
        self.tabs.addTab(self.compare_view, "Compare")
        self.models_view = ModelsView(settings=self.settings, parent=self)
        self.tabs.addTab(self.models_view, "Models")
        left = QSplitter(Qt.Vertical, self)  # the settings scroll; the chats under them stay in view
        left.addWidget(self.controls)
        left.addWidget(self.controls.chats_box)
        left.setStretchFactor(0, 3)
        left.setStretchFactor(1, 2)
        left.setChildrenCollapsible(False)
        self._left = left
        body = QSplitter(Qt.Horizontal, self)
        body.addWidget(left)
        body.addWidget(self.tabs)
        body.setStretchFactor(1, 1)
        body.setChildrenCollapsible(False)
        self._body_splitter = body
        self.setCentralWidget(body)

        self.status_label = StatusLine(self)  # whole phrases only; auto's choices at most once a second
        self.busy_bar = QProgressBar(self)
        self.busy_bar.setRange(0, 0)  # indeterminate until llama.cpp reports how much of the file it read
        self.busy_bar.setMaximumWidth(200)
        self.busy_bar.setFormat("%p%")
        self.busy_bar.setVisible(False)
        self.statusBar().addWidget(self.status_label, 1)
        self.statusBar().addPermanentWidget(self.busy_bar)

        self.timer = QTimer(self)
        self.timer.setInterval(REPAINT_INTERVAL_MS)
        self.timer.timeout.connect(self._tick)

        self.controls.models_changed.connect(self.load_models)
        self.chats_panel.chat_selected.connect(self.open_chat)
        self.chats_panel.chat_deleted.connect(self._chat_deleted)
        self.controls.system_prompt_changed.connect(self._system_prompt_changed)
        self.chat_view.send_requested.connect(self.send_message)
        self.chat_view.stop_requested.connect(self.stop)
        self.chat_view.stop_requested.connect(self.cancel_edit)
        self.chat_view.regenerate_requested.connect(self.regenerate)
        self.chat_view.regenerate_at.connect(self.regenerate)
        self.chat_view.edit_requested.connect(self.start_edit)
        self.chat_view.switch_requested.connect(self.switch_alternative)
        self.chat_view.new_chat_requested.connect(self.new_chat)
        self.chat_view.highlight_box.toggled.connect(self._highlight_toggled)
        self.compare_view.apply_k.connect(self.apply_k)
        self.models_view.use_model.connect(self.use_model)
        self.models_view.use_as_draft.connect(self.use_as_draft)
        self.models_view.use_pair.connect(self.use_pair)
        self.models_view.use_trained.connect(self.use_trained)
        self.controls.train_requested.connect(self.train_drafter)
        self.compare_view.refused.connect(self.report_error)
        self.worker.progress.connect(self._on_progress)
        self.worker.fraction.connect(self._on_fraction)
        self.worker.loaded.connect(self._on_loaded)
        self.worker.stream.connect(self._on_stream)
        self.worker.finished.connect(self._on_finished)
        self.worker.errored.connect(self._on_errored)
        self.worker.busy_changed.connect(self._on_busy)
        self.served = ServedChat(self)  # Servers > Add server…, and back to the local models
        self._build_menus()
        self._set_focus_order()

        self._refresh_chat_list()
        if self.settings.last_chat_id is not None and self.history.chat(self.settings.last_chat_id):
            self.open_chat(self.settings.last_chat_id)
        self._update_actions()
        if autoload:
            self.load_models()

    def _open_history(self) -> History:
        try:
            return History()
        except SpecDeskError as e:
            # Keep working (with a history that lasts this session) and say why at startup.
            self._startup_errors.append(f"{e}. Chats of this session will not be kept.")
            return History.temporary()  # its folder goes when the window closes the history

    def _size_splitters(self) -> None:
        """Controls at their natural width, the charts about 40% of the rest (once; then the user's).
        Folded under the chat (a narrow window), the charts keep the splitter's own share."""
        width = self.width()
        left = max(self.controls.minimumSizeHint().width(), min(300, width // 5))
        self._body_splitter.setSizes([left, width - left])
        rest = width - left
        if self._chat_splitter.orientation() == Qt.Horizontal:
            charts = max(self.charts.minimumWidth(), int(rest * 0.38))
            self._chat_splitter.setSizes([rest - charts, charts])

    # --- menus, look and focus ---------------------------------------------------------
    def _build_menus(self) -> None:
        """File, View and Settings before the Servers menu, Help at the end."""
        from specdesk.app.storage.settings import THEMES

        bar = self.menuBar()
        first = bar.actions()[0] if bar.actions() else None
        file_menu = bar.addMenu("&File")
        self._add_action(file_menu, "New chat", self.new_chat, QKeySequence.New)
        self._add_action(file_menu, "Open GGUF file…", lambda: self.open_model(folder=False), QKeySequence.Open)
        self._add_action(file_menu, "Open model folder…", lambda: self.open_model(folder=True))
        file_menu.addSeparator()
        self._add_action(file_menu, "Quit", self.close, QKeySequence.Quit)

        view = bar.addMenu("&View")
        themes = view.addMenu("Theme")
        group = QActionGroup(self)
        self.theme_actions: dict[str, QAction] = {}
        for name in THEMES:
            action = themes.addAction(name.capitalize())
            action.setCheckable(True)
            action.setChecked(name == self.settings.theme)
            action.triggered.connect(lambda checked, name=name: self.set_theme(name))
            group.addAction(action)
            self.theme_actions[name] = action
        view.addSeparator()
        self._add_action(view, "Zoom in", lambda: self.zoom(1), QKeySequence("Ctrl+="), QKeySequence.ZoomIn)
        self._add_action(view, "Zoom out", lambda: self.zoom(-1), QKeySequence("Ctrl+-"), QKeySequence.ZoomOut)
        self._add_action(view, "Reset zoom", lambda: self.zoom(0), QKeySequence("Ctrl+0"))

        settings_menu = bar.addMenu("&Settings")
        self.settings_panel_action = self._add_action(settings_menu, "Models, sampling and hardware",
                                                      self.show_settings_panel, QKeySequence("Ctrl+,"))
        self.settings_panel_action.setCheckable(True)
        self.settings_panel_action.setChecked(True)
        self.settings_panel_action.setToolTip("show or hide the left panel, where these settings are")
        for menu in (file_menu, view, settings_menu):
            if first is not None:  # before Servers
                bar.removeAction(menu.menuAction())
                bar.insertMenu(first, menu)

        help_menu = bar.addMenu("&Help")
        self.docs_action = self._add_action(help_menu, "Documentation", self.open_docs, QKeySequence.HelpContents)
        self.docs_action.setEnabled(docs_location() is not None)
        self.about_action = self._add_action(help_menu, "About SpecDesk…", self.show_about)

    def _add_action(self, menu, text: str, slot, *shortcuts) -> QAction:
        action = menu.addAction(text)
        action.triggered.connect(lambda checked=False: slot())
        if shortcuts:
            action.setShortcuts([QKeySequence(s) for s in shortcuts])
        return action

    def _apply_look(self) -> None:
        """The theme and zoom kept in settings, before any widget is built."""
        from PySide6.QtWidgets import QApplication

        from .theme import apply_font_scale, apply_theme

        app = QApplication.instance()
        if self.settings.theme != "system":
            apply_theme(app, self.settings.theme)
        if self.settings.font_scale != 1.0:
            apply_font_scale(app, self.settings.font_scale)

    def set_theme(self, name: str) -> None:
        from PySide6.QtWidgets import QApplication

        from .theme import apply_theme

        apply_theme(QApplication.instance(), name)
        self.settings.theme = name
        self.theme_actions[name].setChecked(True)
        self.status_label.setText(f"theme: {name} (the charts take its colours from the next start)")

    def zoom(self, steps: int) -> float:
        """View > Zoom in (1), out (-1) or reset (0); kept in settings. Returns the new scale."""
        from PySide6.QtWidgets import QApplication

        from .theme import apply_font_scale, zoomed

        scale = zoomed(self.settings.font_scale, steps)
        apply_font_scale(QApplication.instance(), scale)
        self.settings.font_scale = scale
        self.status_label.setText(f"zoom {scale:.0%}")
        return scale

    def show_settings_panel(self) -> None:
        """Settings: the left panel (models, sampling, limits, placement) shown and focused, or hidden."""
        show = self.settings_panel_action.isChecked()
        self._left.setVisible(show)
        if show:
            self.controls.target_combo.setFocus()

    def open_docs(self) -> None:
        location = docs_location()
        if location is not None:
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(location)))

    def _set_focus_order(self) -> None:
        """Tab goes input → Send → the left panel's settings; charts and read-only panes take
        focus only on a click."""
        quiet_focus(self)
        c, chat = self.controls, self.chat_view
        focus_chain([chat.input, chat.send_button, chat.stop_button, c.target_combo, c.method_combo,
                     c.draft_combo, c.k_spin, c.temperature_spin, c.top_p_spin, c.top_k_spin, c.seed_spin,
                     c.max_tokens_spin, c.threads_spin, c.ctx_spin, c.device_combo, c.gpu_layers_combo,
                     c.draft_device_combo, c.draft_gpu_layers_combo, c.rpc_edit])

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if not self._splitters_sized:
            self._splitters_sized = True
            self._size_splitters()
        while self._startup_errors:
            self.report_error(self._startup_errors.pop(0))

    # --- models ---------------------------------------------------------------------
    def load_models(self) -> int:
        s = self.settings
        bad_placement = self.controls.placement_error()
        if bad_placement is not None:  # the last good placement is kept; the user hears why
            self.status_label.setText(bad_placement)
        self.controls.store_settings(s)
        self.controls.mark_loaded()
        demo = s.target_path in (DEMO, DEMO_HF, DEMO_MTP)
        self._on_progress(f"loading {'the demo target' if demo else file_label(s.target_path)}…")
        self._requested_choice = (s.target_path, s.draft_path)
        self._note_leftover(s.target_path, s.draft_path)
        self._load_job = self.worker.load(s.target_path, s.draft_path, s.demo_size, s.n_ctx, s.threads,
                                          drafts=self.controls.draft_choices(), placement=s.placement())
        self._update_actions()
        return self._load_job

    def _on_loaded(self, info: ModelInfo) -> None:
        self.info = info
        native = next((m for m in drafter_methods() if info.draft_path and m in info.supported_methods), "draft")
        self.controls.set_supported_methods(info.supported_methods, info.engine, dict(info.unavailable),
                                            fallback=native if info.draft_path else "none")
        self.controls.set_draft_verdicts(dict(info.draft_verdicts))
        if self.backend is None:
            self._show_title()
        self.models_view.show_placement(info.placement)
        self.compare_view.set_placement(info.placement)
        self._fit_to_loaded(info)
        self._show_model_status()
        if info.notes:  # loaded, but otherwise than the file asks (a chat template it cannot use)
            self.status_label.setText(" · ".join(info.notes))
            self.status_label.setToolTip("\n".join(info.notes))

    def train_drafter(self, choice=None):
        """"Train a drafter for this model…" from the draft picker: the loaded target's dialog."""
        if self.info is None:
            self.report_error("load a target first, then train a drafter for it")
            return None
        return self.models_view.open_training(self.info.target_path)

    def _prepare_auto(self) -> bool:
        """With method auto on the local models, its costs on this machine are measured now (once
        per model and placement, then cached), while the user types, instead of in the first reply."""
        if self.backend is not None or self.info is None or self.controls.method() != "auto":
            return False
        self.status_label.setText("auto: measuring what each method costs on this machine (once per model)…")
        self.worker.prepare(self.controls.spec(self.info.draft_path))
        return True

    def _on_progress(self, message: str) -> None:
        self.status_label.setText(message)
        self.busy_bar.setRange(0, 0)  # a new stage: indeterminate until it reports a fraction

    def _on_fraction(self, fraction: float) -> None:
        if self._load_job is not None:
            self.busy_bar.setRange(0, 100)
            self.busy_bar.setValue(round(fraction * 100))
            self.busy_bar.setVisible(True)
            self.loads_reported += 1

    def _offer_small_demo(self) -> None:
        if ask(self, "The built-in demo models are not installed.\n\nUse the small demo family instead? "
                     "Where it did not ship with this install it is trained on this machine (several minutes, "
                     "and it needs PyTorch); its replies are rough, but speculation and its charts work on it."):
            self.settings.demo_size = "small"
            self.load_models()

    # --- chat -----------------------------------------------------------------------
    def _refresh_chat_list(self) -> None:
        self.chats_panel.refresh(current=self.chat_id)
        if self.chat_id is None:
            self.chats_panel.set_current(None)

    def _show_chat(self) -> None:
        """The open chat's active path, from the history, each message with its alternatives."""
        messages = self.history.messages(self.chat_id) if self.chat_id is not None else []
        self.chat_view.set_messages([
            ChatMessage.from_spans(m.role, m.content, m.meta.get("draft_spans"), m.id, m.meta.get("footer", ""),
                                   m.alternative, m.alternatives) for m in messages])

    def _conversation(self, messages: list[ChatMessage]) -> list[dict]:
        """Messages as the chat template gets them: after the open chat's system prompt."""
        chat = self.history.chat(self.chat_id) if self.chat_id is not None else None
        return with_system_prompt([{"role": m.role, "content": m.text} for m in messages],
                                  chat.system_prompt if chat is not None else self.settings.system_prompt)

    def send_message(self, text: str) -> Optional[int]:
        """Send what was typed: a new message, or another version of the one being edited."""
        if self._chat_job is not None:
            return None
        editing, self._editing = self._editing, None
        index = self._index_of(editing)
        if index is not None:
            return self.edit_message(index, text)
        try:
            request = self._request()
        except SpecDeskError as e:
            self.chat_view.input.setPlainText(text)  # nothing typed is lost
            self.report_error(str(e))
            return None
        user_id = self.add_user_message(text)
        return self._start_reply(request, user_id=user_id, user_text=text)

    def add_user_message(self, text: str) -> int:
        """The user's message in the transcript and the history (a new chat, with the system
        prompt new chats start with, when none is open); returns its history id."""
        if self.chat_id is None:
            self.chat_id = self.history.create_chat(chat_title(text), system_prompt=self.settings.system_prompt)
        message = ChatMessage("user", [text], [False])
        message.db_id = self.history.add_message(self.chat_id, "user", text)
        self.chat_view.add_message(message)
        self._refresh_chat_list()
        return message.db_id

    def _index_of(self, message_id: Optional[int]) -> Optional[int]:
        """Where the message with this history id is in the transcript (None: not on screen)."""
        return next((i for i, m in enumerate(self.chat_view.messages)
                     if message_id is not None and m.db_id == message_id), None)

    def start_edit(self, index: int) -> None:
        """Edit the user's message at `index`: its text goes to the input, and Send keeps the
        original as another version."""
        message = self.chat_view.messages[index]
        if self._chat_job is not None or message.role != "user" or message.db_id is None:
            return
        self._editing = message.db_id
        self.chat_view.input.setPlainText(message.text)
        self.chat_view.input.setFocus()
        self.status_label.setText("editing a message: Send answers the new version, the original stays (‹ ›); "
                                  "Esc cancels")

    def cancel_edit(self) -> None:
        if self._editing is not None:
            self._editing = None
            self.chat_view.input.clear()
            self.status_label.setText("edit cancelled")

    def edit_message(self, index: int, text: str) -> Optional[int]:
        """The user's message at `index` gets another version, `text`, answered at once; the
        original and what follows it stay, one arrow away."""
        original = self.chat_view.messages[index] if 0 <= index < len(self.chat_view.messages) else None
        if self._chat_job is not None or original is None or original.role != "user" or original.db_id is None:
            return None
        try:
            request = self._request()
        except SpecDeskError as e:
            self.chat_view.input.setPlainText(text)
            self._editing = original.db_id  # still editing: nothing typed is lost
            self.report_error(str(e))
            return None
        user_id = self.history.add_alternative(original.db_id, text)
        self._show_chat()
        self._refresh_chat_list()
        return self._start_reply(request, user_id=user_id, user_text=text, restore=original.db_id)

    def switch_alternative(self, index: int, step: int) -> None:
        """Show the previous (step -1) or next (+1) version of the message at `index`, and the
        conversation that follows it."""
        message = self.chat_view.messages[index] if 0 <= index < len(self.chat_view.messages) else None
        if self._chat_job is not None or message is None or message.db_id is None:
            return
        self.history.switch_alternative(message.db_id, step)
        self._show_chat()

    def _request(self):
        """(spec, sampling, max tokens, backend) for a reply or a compare. A server chooses its own
        method; the local models need one loaded."""
        if self.backend is not None:
            return SpecConfig(), self.controls.sampling(), self.controls.max_tokens(), self.backend
        if self.info is None:
            raise SpecDeskError("no model is loaded yet: wait for loading to finish, or pick a target model")
        return (self.controls.spec(self.info.draft_path), self.controls.sampling(), self.controls.max_tokens(),
                None)

    def _compare_request(self):
        """As a reply's request, at the Compare tab's own temperature (greedy by default, so it can
        show identical outputs): setting it there leaves the chat's as it was."""
        spec, sampling, max_tokens, backend = self._request()
        sampling = replace(sampling, temperature=self.compare_view.temperature())
        if backend is None and spec.method == "none":
            raise SpecDeskError("compare needs a speculation method: choose ngram, ngram-pool or draft in the left panel")
        if backend is not None and backend.needs_baseline:
            raise SpecDeskError(f"{backend.endpoint.url} ({backend.endpoint.info.kind}) cannot switch speculation off "
                                "per request: add the server again with a baseline server (the same model without "
                                "speculation)")
        return spec, sampling, max_tokens, backend

    def _start_reply(self, request, user_id: Optional[int] = None, user_text: str = "",
                     replaces: Optional[int] = None, restore: Optional[int] = None) -> int:
        """A reply to the conversation on screen (ending in the user's message)."""
        spec, sampling, max_tokens, backend = request
        conversation = self._conversation(self.chat_view.messages)
        reply = self.chat_view.add_message(ChatMessage("assistant"))
        job = self.worker.chat(conversation, spec, sampling, max_tokens, backend)
        self.charts.start_run(spec.draft_tokens)
        if backend is not None:  # what its stream counts: tokens, or characters where it cannot tell
            self.charts.set_unit(backend.endpoint.stream_unit())
        self._chat_job = _ChatJob(job, self.chat_id, reply, user_id, user_text, replaces, restore)
        self._update_actions()
        return job.job_id

    def stop(self) -> None:
        if self._chat_job is not None:
            self.worker.stop(self._chat_job.job_id)

    def regenerate(self, index: Optional[int] = None) -> Optional[int]:
        """Answer again: the reply at `index` of the transcript (by default the last one) gets
        another version, written from the conversation before it; the old one stays, one arrow away."""
        messages = self.chat_view.messages
        if index is None:
            index = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "assistant"), None)
        if (self._chat_job is not None or index is None or not 0 <= index < len(messages)
                or messages[index].role != "assistant" or messages[index].db_id is None):
            return None
        try:
            request = self._request()
        except SpecDeskError as e:
            self.report_error(str(e))
            return None
        self.chat_view.set_messages(messages[:index])
        return self._start_reply(request, replaces=messages[index].db_id)

    def use_backend(self, backend, status: str = "") -> None:
        """Chat and compare on a server's ServedSession from now on, or on the local models
        (None); `status` says what the server reports."""
        self.stop()
        self.compare_view.stop()
        self.backend = backend
        local = backend is None
        models = self.controls.target_combo.parentWidget()  # the group of the local model pickers
        models.setEnabled(local)  # they do not apply to a server's replies
        models.setToolTip("" if local else "replies come from the server (Servers > Use local models to return)")
        if local:
            self._show_title()
            self._show_model_status()
        else:
            self.setWindowTitle(f"SpecDesk — {backend.label}")
            self.status_label.setText(status)
        self._update_actions()

    def _show_title(self) -> None:
        self.setWindowTitle(f"SpecDesk — {file_label(self.info.target_path)}" if self.info is not None
                            else "SpecDesk")

    def new_chat(self) -> None:
        self.stop()  # a reply still generating is saved to the chat it belongs to
        self.chat_id = None
        self._editing = None
        self.chat_view.set_messages([])
        self.charts.reset()
        self.controls.show_system_prompt(self.settings.system_prompt)
        self.worker.new_chat()
        self._refresh_chat_list()
        self._update_actions()

    def open_chat(self, chat_id: int) -> None:
        if chat_id == self.chat_id:
            return
        self.stop()
        self.chat_id = chat_id
        self._editing = None
        self._show_chat()
        chat = self.history.chat(chat_id)
        self.controls.show_system_prompt(chat.system_prompt if chat is not None else "")
        self.charts.reset()
        self.worker.new_chat()
        self._refresh_chat_list()
        self._update_actions()

    def delete_chat(self, chat_id: int) -> None:
        """Delete a chat after asking (the chat list's Delete does the same)."""
        self.chats_panel.delete_chat(chat_id, confirm=True)

    def _chat_deleted(self, chat_id: int) -> None:
        if chat_id == self.chat_id:
            self.new_chat()

    def _system_prompt_changed(self, text: str) -> None:
        """An edited system prompt is the open chat's; with no chat open, the next new chat's."""
        if self.chat_id is not None and self.history.is_open:
            self.history.set_system_prompt(self.chat_id, text)
        else:
            self.settings.system_prompt = text

    def _highlight_toggled(self, on: bool) -> None:
        self.settings.highlight_drafts = on

    def apply_k(self, k: int) -> None:
        self.controls.k_spin.setValue(k)
        self.status_label.setText(f"k set to {k} (the best of the sweep)")

    # --- worker signals -------------------------------------------------------------
    def _on_stream(self, batch) -> None:
        job = self._chat_job
        if job is None or batch.job_id != job.job_id:
            return
        self.chat_view.append_pieces(job.message, batch.pieces, batch.from_draft)
        self.charts.add_batch(batch)
        reason = next((e.reason for e in reversed(batch.events) if e.reason), None)
        if reason:  # method auto: what drafts now, and why (at most once a second: it may change every step)
            self.status_label.set_live(f"auto · {reason}")
            job.last_reason = reason

    def _on_finished(self, result: JobResult) -> None:
        if result.kind == "load" and result.job_id == self._load_job:
            self._load_job = None
            self._loaded_choice = self._requested_choice
            self._show_model_status()
            if not self._prepare_auto():
                self._use_note = ""  # said once, beside the models it chose
        elif result.kind == "prepare":
            self._show_model_status()
            self._use_note = ""
        elif self._chat_job is not None and result.job_id == self._chat_job.job_id:
            self._finish_reply(result.value)
            self._tick()  # the reply's final numbers are drawn at once
        self._update_actions()

    def _finish_reply(self, outcome) -> None:
        job, self._chat_job = self._chat_job, None
        run = outcome.result
        stats = run.stats
        charts = self.charts
        # a server's per-position numbers come with the reply's end
        k = len(stats.per_position_drafted) or job.job.spec.draft_tokens or (1 if stats.drafted else 0)
        if self.chat_view.showing(job.message):  # else the charts show another chat by now
            charts.k = k
            charts.finish_run(stats)
        if not job.kept:  # stopped before any text: the turn is rolled back
            self._roll_back(job)
            return
        reason = {"cancelled": "stopped", "length": "max tokens", "context": "context full",
                  "eos": "done"}.get(run.finish_reason, run.finish_reason or "done")
        spec = job.job.spec
        if job.job.backend is not None:
            source = job.job.backend.endpoint.model
        elif job.last_reason:
            source = f"auto (last: {job.last_reason})"
        else:
            source = spec.method if spec.method == "none" else f"{spec.method}, k = {spec.k}"
        footer = (f"{reason} · {source} · {format_status(stats, k)}"
                  + (f" · numbers: {outcome.numbers}" if outcome.numbers != "engine" else "")
                  + (f" · {outcome.note}" if outcome.note else ""))
        self._save_reply(job, footer, {
            "finish_reason": run.finish_reason, "tokens": stats.tokens, "tok_per_s": round(stats.tok_per_s, 3),
            "acceptance": round(stats.acceptance_rate, 4), "tok_per_pass": round(stats.mean_accepted_length, 4),
            **({"numbers_from": outcome.numbers} if job.job.backend is not None else {})})

    def _origin(self, job: _ChatJob) -> dict:
        """What answered, as the history keeps it: the method and k, or the server."""
        backend = job.job.backend
        if backend is None:
            return {"method": job.job.spec.method, "k": job.job.spec.k}
        return {"server": backend.meta()}

    def _save_reply(self, job: _ChatJob, footer: str, meta: dict) -> None:
        message = job.message
        meta = {**meta, **self._origin(job), "draft_spans": message.draft_spans(), "footer": footer}
        if not self.history.is_open or self.history.chat(job.chat_id) is None:
            return  # closing, or its chat was deleted while it generated
        if job.replaces is not None:
            message.db_id = self.history.add_alternative(job.replaces, message.text, meta)
        else:
            parent = {} if job.user_id is None else {"parent_id": job.user_id}
            message.db_id = self.history.add_message(job.chat_id, "assistant", message.text, meta, **parent)
        versions = self.history.alternatives(message.db_id)
        message.alternative, message.alternatives = versions.index(message.db_id), len(versions)
        self.chat_view.end_reply(message, footer)
        self._refresh_chat_list()

    def _roll_back(self, job: _ChatJob) -> None:
        """A turn without a reply leaves nothing: the user's message it added leaves the history
        (a chat that was only this turn goes with it) and its text returns to the input; an
        edited message shows its original again, a regenerated reply its previous version."""
        if not self.history.is_open:
            return  # closing
        if job.user_id is not None:
            self.history.delete_message(job.user_id)
            if job.restore is not None and self.history.chat(job.chat_id) is not None:
                self.history.select(job.restore)
            if not self.history.messages(job.chat_id):  # a chat that was only this turn goes with it
                self.history.delete_chat(job.chat_id)
            self._refresh_chat_list()
        if self.chat_id != job.chat_id:
            return  # another chat is on screen now
        if self.history.chat(job.chat_id) is None:
            self.chat_id = None
            self._refresh_chat_list()
        self._show_chat()
        if job.user_text and not self.chat_view.input.toPlainText().strip():
            self.chat_view.input.setPlainText(job.user_text)
            if job.restore is not None:
                self._editing = job.restore  # still an edit of the original

    def _on_errored(self, error: JobError) -> None:
        if self._chat_job is not None and error.job_id == self._chat_job.job_id:
            job, self._chat_job = self._chat_job, None
            if job.kept:  # the reply so far stays, marked
                self._save_reply(job, f"partial reply · {error.message}",
                                 {"finish_reason": "error", "partial": True, "error": error.message})
            else:
                self._roll_back(job)
        if error.job_id == self._load_job and error.kind == "draft" and self._drop_leftover(error.message):
            self._load_job = None  # the target loaded; the previous target's draft stays behind, said in the status
            self._update_actions()
            return
        if error.job_id == self._load_job:
            self._load_job = None
            failed = self._requested_choice[1 if error.kind == "draft" else 0]
            if failed not in DEMO_CHOICES and failed is not None:  # it leaves the picker's list
                self.controls.forget_model("draft" if error.kind == "draft" else "target", failed)
            self._show_loaded_choice(error.kind)
            self._show_model_status()
        if error.engine_lost:
            self.info = None  # nothing is loaded any more; the chat on screen and in history stays
            self._show_model_status()
        self._update_actions()
        if error.details or error.engine_lost:
            self._report_engine_stop(error)
        else:
            self.report_error(error.message)
        if (error.kind == "load" and NO_SHIPPED_FAMILY in error.message and self.settings.target_path == DEMO
                and self.settings.demo_size == "full"):
            self._offer_small_demo()

    def report_error(self, message: str) -> None:
        self.errors_shown += 1
        self.status_label.setText(message.splitlines()[0] if message else "error")
        show_error(self, message)

    def _report_engine_stop(self, error: JobError) -> None:
        """The engine process ended: one sentence, its last output behind "Details", and
        Reload when the model went with it. The box does not block, so the window runs on."""
        self.errors_shown += 1
        self.status_label.setText(error.message)
        box = QMessageBox(QMessageBox.Critical, "SpecDesk", error.message, QMessageBox.Close, self)
        if error.details:
            box.setDetailedText(error.details)
        if error.engine_lost:
            box.addButton("Reload", QMessageBox.AcceptRole).clicked.connect(self.load_models)
        box.setAttribute(Qt.WA_DeleteOnClose)
        box.open()
        self.engine_stop_box = box

    def _on_busy(self, busy: bool) -> None:
        self.busy_bar.setVisible(busy and self._load_job is not None)
        if busy and not self._closed:
            self.timer.start()
        self._update_actions()

    def _tick(self) -> None:
        self.chat_view.flush()
        self.charts.refresh()
        self.compare_view.refresh()
        self.busy_bar.setVisible(self._load_job is not None)
        if not self.worker.busy:
            self.timer.stop()

    def about_text(self) -> str:
        from PySide6 import __version__ as pyside_version

        from specdesk.app.about import about_text

        return f"{about_text()}\nQt (PySide6) {pyside_version}"

    def show_about(self) -> None:
        """Versions and the llama.cpp build: which backend, which CPU code, whether GPU offload works."""
        QMessageBox.about(self, "About SpecDesk", self.about_text().replace("\n", "<br>"))

    def _update_actions(self) -> None:
        loading = self._load_job is not None
        local = self.backend is None
        can_run = (self.info is not None or not local) and not loading
        self.chat_view.set_generating(self._chat_job is not None, can_run)
        self.compare_view.set_available(can_run and not self.worker.busy, sweep=local)
        self.busy_bar.setVisible(loading)

    # --- closing --------------------------------------------------------------------
    def save_settings(self) -> None:
        self.controls.store_settings(self.settings)
        self.settings.compare_prompt = self.compare_view.prompt.toPlainText()
        self.settings.compare_temperature = self.compare_view.temperature()
        self.settings.last_chat_id = self.chat_id
        try:
            save_settings(self.settings, self._settings_file)
        except OSError as e:
            self.report_error(f"could not save settings: {e}")

    def closeEvent(self, event) -> None:
        if not self._closed:
            self._closed = True
            self.timer.stop()
            self.status_label.cancel_live()
            self.save_settings()
            self.worker.shutdown()
            self.models_view.shutdown()
            self.served.shutdown()
            if self.first_run is not None:
                self.first_run.shutdown()
            # Results the worker sent before it ended (a stopped reply) are saved now.
            QCoreApplication.sendPostedEvents(self.worker, 0)
            self._tick()  # draw what arrived last, with the timer already stopped
            self.timer.stop()
            self.history.close()
        super().closeEvent(event)
