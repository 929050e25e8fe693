"""The main window: controls on the left; Chat (transcript + live charts), Compare and Models tabs.

All inference goes through one EngineWorker, whether the local models or a server answer: the
window's `backend` is the local models (`worker.local`, app/runtime/session.Session) or a
server's ServedSession (Servers > Add server…, ui/served_chat.py), and every chat and compare
job carries it. The chat is app/runtime/chat_controller.ChatController, which has no Qt in it:
it sends, edits, regenerates, switches versions and settles each turn (the reply saved, or the
turn rolled back). The worker runs its turns (app/runtime/backend.chat_turn on the worker
thread), the chat view draws its transcript, and the window hands the worker's signals on to
it and draws the charts. What arrives (streamed tokens, chart points) is drawn from one ~30 Hz
timer that runs while the worker is busy, so the event loop stays responsive however fast the
model is. Menus, theme and zoom are ui/window_menus.py's; choosing what loads, ui/model_choice.py's.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

from PySide6.QtCore import QCoreApplication, Qt, QTimer
from PySide6.QtWidgets import QMainWindow, QMessageBox, QProgressBar, QSplitter, QTabWidget, QVBoxLayout, QWidget

from specdesk.app.runtime.backend import ChatBackend
from specdesk.app.runtime.chat_controller import ChatController, Turn, TurnRequest, auto_details, drafted_per_step
from specdesk.app.storage.history import History
from specdesk.app.runtime.session import ModelInfo, file_label
from specdesk.app.storage.settings import DEMO, DEMO_HF, DEMO_MTP, Settings, read_settings, save_settings
from specdesk.engines.methods import drafter_methods
from specdesk.engines.types import SpecConfig, SpecDeskError

from .chat_view import ChatView
from .charts import ChartPanel
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
from .window_menus import WindowMenus
from .worker import EngineWorker, JobError, JobResult

REPAINT_INTERVAL_MS = 33  # ~30 Hz
NO_SHIPPED_FAMILY = "no trained demo family"


class MainWindow(ModelChoosing, WindowMenus, QMainWindow):
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
        self.backend: ChatBackend = self.worker.local  # the local models, or a server's ServedSession
        self.info: Optional[ModelInfo] = None
        self._load_job: Optional[int] = None
        self._requested_choice: tuple = (None, None)
        self._loaded_choice: tuple = (None, None)  # (target, draft) settings values that loaded
        self._closed = False
        self._splitters_sized = False
        self.errors_shown = 0
        self.engine_stop_box: Optional[QMessageBox] = None  # the last "engine process stopped" message
        self.loads_reported = 0  # loading-progress updates shown (tests read it)

        self._apply_look()
        self.setCentralWidget(self._build_body(self._build_chat_tab(first_run_card)))
        self._build_status_bar()
        # the conversation on screen: the worker runs its turns, the chat view draws it
        self.chat = ChatController(self.history, self.worker, self._request, lambda: self.settings.system_prompt,
                                   self.chat_view, self._refresh_chat_list)
        self._connect_signals()
        self.served = ServedChat(self)  # Servers > Add server…, and back to the local models
        self._build_menus()
        self._set_focus_order()

        self._refresh_chat_list()
        if self.settings.last_chat_id is not None and self.history.chat(self.settings.last_chat_id):
            self.open_chat(self.settings.last_chat_id)
        self._update_actions()
        if autoload:
            self.load_models()

    @property
    def chat_id(self) -> Optional[int]:
        """The chat on screen (None: a new one, not in the history until its first message)."""
        return self.chat.chat_id

    def _build_chat_tab(self, first_run_card: bool) -> FoldingSplitter:
        """The transcript (under the first-run card, until used or dismissed) and the live charts."""
        self.controls = ControlsPanel(self.settings, self)
        self.chats_panel = ChatsPanel(self.history, self)
        self.controls.show_chats(self.chats_panel)
        self.chat_view = ChatView(self)
        self.chat_view.set_highlight(self.settings.highlight_drafts)
        self.charts = ChartPanel(self)
        chat_tab = FoldingSplitter(self)  # the charts fold under the chat when the window is narrow
        chat_column = QWidget(chat_tab)
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
        return chat_tab

    def _build_body(self, chat_tab: QWidget) -> QSplitter:
        """The settings with the chats under them on the left; the Chat, Compare and Models tabs."""
        self.compare_view = CompareView(self.worker, self._compare_request, self.settings.compare_prompt, self,
                                        temperature=self.settings.compare_temperature)
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
        return body

    def _build_status_bar(self) -> None:
        """Whole phrases only (auto's choices at most once a second), a loading bar, and the repaint timer."""
        self.status_label = StatusLine(self)
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

    def _connect_signals(self) -> None:
        view, worker, models = self.chat_view, self.worker, self.models_view
        for signal, slot in (
                (self.controls.models_changed, self.load_models), (self.controls.train_requested, self.train_drafter),
                (self.controls.system_prompt_changed, self._system_prompt_changed),
                (self.chats_panel.chat_selected, self.open_chat), (self.chats_panel.chat_deleted, self._chat_deleted),
                (view.send_requested, self.send_message), (view.stop_requested, self.stop),
                (view.stop_requested, self.cancel_edit), (view.regenerate_requested, self.regenerate),
                (view.regenerate_at, self.regenerate), (view.edit_requested, self.start_edit),
                (view.switch_requested, self.chat.switch), (view.new_chat_requested, self.new_chat),
                (view.highlight_box.toggled, self._highlight_toggled),
                (self.compare_view.apply_k, self.apply_k), (self.compare_view.refused, self.report_error),
                (models.use_model, self.use_model), (models.use_as_draft, self.use_as_draft),
                (models.use_pair, self.use_pair), (models.use_trained, self.use_trained),
                (worker.progress, self._on_progress), (worker.fraction, self._on_fraction),
                (worker.loaded, self._on_loaded), (worker.stream, self._on_stream), (worker.finished, self._on_finished),
                (worker.errored, self._on_errored), (worker.busy_changed, self._on_busy)):
            signal.connect(slot)

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

    # --- focus ------------------------------------------------------------------------
    def _set_focus_order(self) -> None:
        """Tab goes input → Send → the left panel's settings; charts and read-only panes take
        focus only on a click."""
        quiet_focus(self)
        c, chat = self.controls, self.chat_view
        focus_chain([chat.input, chat.send_button, chat.stop_button, c.target_combo, c.method_combo,
                     c.draft_combo, c.k_spin, c.temperature_spin, c.top_p_spin, c.top_k_spin, c.seed_spin,
                     c.max_tokens_spin, c.threads_spin, c.ctx_spin, c.device_combo, c.gpu_layers_combo,
                     c.draft_device_combo, c.draft_gpu_layers_combo, c.draft_weights_combo, c.rpc_edit])

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
        if self.backend.local:
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
        if self._closed or not self.backend.local or self.info is None or self.controls.method() != "auto":
            return False  # closing: a load that ended as the window closed starts nothing
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

    # --- chat: the controller acts, the window draws ----------------------------------
    def _refresh_chat_list(self) -> None:
        self.chats_panel.refresh(current=self.chat_id)
        if self.chat_id is None:
            self.chats_panel.set_current(None)

    def _request(self) -> TurnRequest:
        """How a reply or a compare is asked for. A server chooses its own method; the local
        models need one loaded."""
        backend = self.backend
        if not backend.local:
            return TurnRequest(SpecConfig(), self.controls.sampling(), self.controls.max_tokens(), backend)
        if self.info is None:
            raise SpecDeskError("no model is loaded yet: wait for loading to finish, or pick a target model")
        return TurnRequest(self.controls.spec(self.info.draft_path), self.controls.sampling(),
                           self.controls.max_tokens(), backend)

    def _compare_request(self) -> TurnRequest:
        """As a reply's request, at the Compare tab's own temperature (greedy by default, so it can
        show identical outputs): setting it there leaves the chat's as it was."""
        request = self._request()
        request = request._replace(sampling=replace(request.sampling, temperature=self.compare_view.temperature()))
        refusal = request.backend.compare_refusal(request.spec)
        if refusal:
            raise SpecDeskError(refusal)
        return request

    def send_message(self, text: str) -> Optional[int]:
        """Send what was typed: a new message, or another version of the one being edited."""
        try:
            turn = self.chat.send(text)
        except SpecDeskError as e:
            self.chat_view.input.setPlainText(text)  # nothing typed is lost
            self.report_error(str(e))
            return None
        return self._started(turn)

    def regenerate(self, index: Optional[int] = None) -> Optional[int]:
        """Answer again: the reply at `index` of the transcript (by default the last one) gets
        another version; the old one stays, one arrow away."""
        try:
            turn = self.chat.regenerate(index)
        except SpecDeskError as e:
            self.report_error(str(e))
            return None
        return self._started(turn)

    def _started(self, turn: Optional[Turn]) -> Optional[int]:
        """The charts start a run for a turn that started; returns its job id."""
        if turn is None:
            return None
        self.charts.start_run(turn.request.spec.draft_tokens)
        unit = turn.request.backend.stream_unit()  # what its stream counts: tokens, or characters where it cannot tell
        if unit != self.charts.unit:
            self.charts.set_unit(unit)
        self._update_actions()
        return turn.job_id

    def start_edit(self, index: int) -> None:
        """Edit the user's message at `index`: its text goes to the input, and Send keeps the
        original as another version."""
        text = self.chat.start_edit(index)
        if text is None:
            return
        self.chat_view.input.setPlainText(text)
        self.chat_view.input.setFocus()
        self.status_label.setText("editing a message: Send answers the new version, the original stays (‹ ›); "
                                  "Esc cancels")

    def cancel_edit(self) -> None:
        if self.chat.cancel_edit():
            self.chat_view.input.clear()
            self.status_label.setText("edit cancelled")

    def stop(self) -> None:
        self.chat.stop()

    def new_chat(self) -> None:
        self.chat.new_chat()  # a reply still generating is saved to the chat it belongs to
        self.charts.reset()
        self.controls.show_system_prompt(self.settings.system_prompt)
        self._update_actions()

    def open_chat(self, chat_id: int) -> None:
        if not self.chat.open_chat(chat_id):
            return
        chat = self.history.chat(chat_id)
        self.controls.show_system_prompt(chat.system_prompt if chat is not None else "")
        self.charts.reset()
        self._update_actions()

    def delete_chat(self, chat_id: int) -> None:
        """Delete a chat after asking (the chat list's Delete does the same)."""
        self.chats_panel.delete_chat(chat_id, confirm=True)

    def _chat_deleted(self, chat_id: int) -> None:
        if chat_id == self.chat_id:
            self.new_chat()

    def _system_prompt_changed(self, text: str) -> None:
        """An edited system prompt is the open chat's; with no chat open, the next new chat's."""
        if not self.chat.set_system_prompt(text):
            self.settings.system_prompt = text

    def _highlight_toggled(self, on: bool) -> None:
        self.settings.highlight_drafts = on

    def apply_k(self, k: int) -> None:
        self.controls.k_spin.setValue(k)
        self.status_label.setText(f"k set to {k} (the best of the sweep)")

    def use_backend(self, backend: ChatBackend, status: str = "") -> None:
        """Chat and compare on `backend` from now on: a server's ServedSession, or the local
        models (`worker.local`); `status` says what the server reports."""
        self.stop()
        self.compare_view.stop()
        self.backend = backend
        models = self.controls.target_combo.parentWidget()  # the group of the local model pickers
        models.setEnabled(backend.local)  # they do not apply to a server's replies
        models.setToolTip("" if backend.local else
                          "replies come from the server (Servers > Use local models to return)")
        if backend.local:
            self._show_title()
            self._show_model_status()
        else:
            self.setWindowTitle(f"SpecDesk — {backend.label}")
            self.status_label.setText(status)
        self._update_actions()

    def _show_title(self) -> None:
        self.setWindowTitle(f"SpecDesk — {file_label(self.info.target_path)}" if self.info is not None
                            else "SpecDesk")

    # --- worker signals -------------------------------------------------------------
    def _on_stream(self, batch) -> None:
        reason = next((e.reason for e in reversed(batch.events) if e.reason), None)
        if self.chat.add_pieces(batch.job_id, batch.pieces, batch.from_draft, reason) is None:
            return  # not the chat's turn (a compare's)
        self.charts.add_batch(batch)
        if reason:  # method auto: what drafts now, and why (at most once a second: it may change every step)
            self.status_label.set_live(f"auto · {reason}")

    def _on_finished(self, result: JobResult) -> None:
        turn = self.chat.turn
        if result.kind == "load" and result.job_id == self._load_job:
            self._load_job = None
            self._loaded_choice = self._requested_choice
            self._show_model_status()
            if not self._prepare_auto():
                self._use_note = ""  # said once, beside the models it chose
        elif result.kind == "prepare":
            self._show_model_status()
            self._use_note = ""
        elif turn is not None and result.job_id == turn.job_id:
            stats = result.value.result.stats
            if self.chat_view.showing(turn.reply):  # else the charts show another chat by now
                self.charts.k = drafted_per_step(turn, stats)
                self.charts.finish_run(stats)
            if result.value.result.auto_report:  # the status line's details: the costs auto decided with
                self.status_label.setToolTip(auto_details(result.value.result.auto_report))
            self.chat.finish(result.job_id, result.value)  # the reply saved, or the turn rolled back
            self._tick()  # the reply's final numbers are drawn at once
        self._update_actions()

    def _on_errored(self, error: JobError) -> None:
        self.chat.fail(error.job_id, error.message)  # a turn's text so far stays, marked; else it is rolled back
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

    def _update_actions(self) -> None:
        loading = self._load_job is not None
        local = self.backend.local
        can_run = (self.info is not None or not local) and not loading
        self.chat_view.set_generating(self.chat.turn is not None, can_run)
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
