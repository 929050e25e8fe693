"""`specdesk screenshot --out DIR`: real runs on the small demo family (or, with
`--full-demo`, the full one), saved as PNGs.

Offscreen (no display needed): opens the main window, chats once with the draft model
(sampled, so the tiny model writes something code-like), grabs the Chat tab; runs a greedy
compare and a k sweep with prompt lookup (ngram), grabs the Compare tab; compares with the
draft model, so this machine has measured it, and grabs the Models tab's pairing dialog for
the demo target (the draft ranked by that measurement, the demo's MTP target, when it can be
built, by an assumption). Settings, history and measurements go to a temporary folder, never
the user's.

With `target` (`--target model.gguf`) the same runs use a model of one's own instead: method
auto with no draft, a chat question, the compare at its own greedy temperature on the chat
prompt the Compare tab suits to the model; no k sweep (auto chooses k itself, and nine points
of repeated runs take long on a CPU) and no pairing dialog.

With `sizes` (`--sizes 1024x640,1920x1080`) it then resizes the window to each size and saves
every tab as TAB-WIDTHxHEIGHT.png (chat, compare, models; the library shows the demo's files,
or the target), refusing a size the window does not take or where anything is cut
(ui/clipping.clipped: text, plots, widgets out of view).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Optional

from specdesk.engines.types import SpecDeskError

CHAT_PROMPT = "Write a function that parses command line arguments."
MAX_SIDE = 8192  # pixels; a 40000x40000 window would need 6 GB of image memory, twice
COMPARE_PROMPT = "def parse_args(argv):"
REAL_CHAT_PROMPT = "Write a haiku about autumn, then say in one sentence what it is about."
REAL_MAX_TOKENS = 96  # a model of one's own is slower than the small demo: its repeated compare stays in minutes
RUN_LIMIT_S = 1200  # a bound on a stuck run only: repeated compares and a sweep on a busy 2-core machine are slow


TABS = ("chat", "compare", "models")  # the main window's tabs, in order, as the file names say them


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """`--sizes 1024x640,1920x1080`: one or more sizes, comma-separated."""
    sizes = [parse_size(part.strip()) for part in text.split(",") if part.strip()]
    if not sizes:
        raise SpecDeskError(f"--sizes {text!r} names no size (for example 1024x640,1920x1080)")
    return sizes


def parse_size(text: str) -> tuple[int, int]:
    """`--size WIDTHxHEIGHT`, each side 1 to MAX_SIDE pixels."""
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise SpecDeskError(f"--size {text!r} is not WIDTHxHEIGHT (for example 1280x800)") from None
    if not (1 <= width <= MAX_SIDE and 1 <= height <= MAX_SIDE):
        raise SpecDeskError(f"--size {text} is out of range: each side must be 1 to {MAX_SIDE} pixels")
    return width, height


def wait_signal(app, signal, accept: Callable[..., bool], timeout_s: float) -> tuple:
    """Run the event loop until `signal` fires with arguments `accept` likes."""
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    got: list = []

    def on_signal(*args):
        if accept(*args):
            got.append(args)
            loop.quit()

    signal.connect(on_signal)
    QTimer.singleShot(int(timeout_s * 1000), loop.quit)
    loop.exec()
    signal.disconnect(on_signal)
    if not got:
        raise SpecDeskError(f"nothing happened within {timeout_s:.0f} s")
    return got[0]


def take_screenshots(out: Path, size: tuple[int, int] = (1280, 800), dark: bool = False, threads: int = 0,
                     suffix: str = "", progress: Optional[Callable[[str], None]] = None,
                     demo_size: str = "small", sizes: Optional[list[tuple[int, int]]] = None,
                     target: Optional[str] = None) -> list[Path]:
    """The window's shots on the demo family, or with `target` on that model of one's own
    (method auto with no draft, a chat question, the compare at its own greedy temperature);
    the pairing dialog is the demo's only."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from specdesk.app.storage.history import History

    from .app import make_app
    from .main_window import MainWindow

    say = progress or (lambda message: None)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    app = make_app([], dark=dark)
    scratch_folder = tempfile.TemporaryDirectory(prefix="specdesk-screenshot-")  # removed when done
    scratch = Path(scratch_folder.name)
    settings = _settings(target, demo_size, threads)
    quit_on_close = app.quitOnLastWindowClosed()
    app.setQuitOnLastWindowClosed(False)  # closing our window must not end the caller's event loop
    window = MainWindow(settings, History(scratch / "history.sqlite3"), settings_file=scratch / "settings.json",
                        autoload=False)
    errors: list[str] = []
    window.report_error = errors.append  # no modal dialogs offscreen: collect and raise
    window.resize(*size)
    window.show()
    saved = []
    data_dir = os.environ.get("SPECDESK_DATA_DIR")
    os.environ["SPECDESK_DATA_DIR"] = str(scratch / "data")  # measurements: the pairing shows only this run's
    try:
        window.worker.progress.connect(say)
        saved.append(_chat_shot(app, window, out / f"main-window{suffix}.png", target, errors, say))
        saved.append(_compare_shot(app, window, out / f"compare{suffix}.png", target, errors, say))
        if target is None:
            saved.append(_pairing(app, window, out / f"pairing{suffix}.png", demo_size, say, errors, scratch))
        if sizes:
            _show_library(app, window, None if target is None else [window.info.target_path])
        for width, height in sizes or ():
            saved += _tabs_at(app, window, out, (width, height), suffix)
    finally:
        if data_dir is None:
            os.environ.pop("SPECDESK_DATA_DIR", None)
        else:
            os.environ["SPECDESK_DATA_DIR"] = data_dir
        window.close()  # saves settings into the scratch folder and closes the history
        window.deleteLater()
        app.processEvents()
        app.setQuitOnLastWindowClosed(quit_on_close)
        scratch_folder.cleanup()
    return saved


def _settings(target: Optional[str], demo_size: str, threads: int):
    """The window's settings: the demo family with its draft model, or `target` with method auto."""
    from specdesk.app.storage.settings import DEMO, Settings

    if target is None:
        return Settings(target_path=DEMO, draft_path=DEMO, demo_size=demo_size, method="draft", k=4,
                        temperature=0.7, seed=1, max_tokens=160, threads=threads, n_ctx=1024,
                        compare_prompt=COMPARE_PROMPT, first_run_done=True)
    # the Compare tab suits its prompt to the chat model once it loads
    return Settings(target_path=str(Path(target).resolve()), draft_path=None, method="auto", k=4,
                    temperature=0.7, seed=1, max_tokens=REAL_MAX_TOKENS, threads=threads, n_ctx=2048,
                    compare_prompt=COMPARE_PROMPT, first_run_done=True)


def _chat_shot(app, window, path: Path, target: Optional[str], errors: list, say: Callable[[str], None]) -> Path:
    """Load the models, chat once, grab the Chat tab."""
    window.load_models()
    wait_signal(app, window.worker.finished, lambda r: r.kind == "load", 900)
    if errors:
        raise SpecDeskError(errors[0])
    say("chatting")
    window.chat_view.input.setPlainText(CHAT_PROMPT if target is None else REAL_CHAT_PROMPT)
    window.chat_view.send_button.click()
    wait_signal(app, window.worker.finished, lambda r: r.kind == "chat", RUN_LIMIT_S)
    _settle(app)
    return _grab(window, path)


def _compare_shot(app, window, path: Path, target: Optional[str], errors: list, say: Callable[[str], None]) -> Path:
    """A greedy compare (and on the demo a k sweep with prompt lookup), then grab the Compare tab."""
    say("comparing")
    window.tabs.setCurrentWidget(window.compare_view)
    window.compare_view.temperature_spin.setValue(0.0)  # greedy: the verdict can say "identical"
    if target is None:
        window.controls.max_tokens_spin.setValue(640)  # longer runs: timings of a tiny model are less noisy
        # The small family's target is so small that its draft model costs about as much as it
        # saves; prompt lookup drafts for free, so the compare shows a real speedup.
        window.controls.method_combo.setCurrentIndex(window.controls.method_combo.findData("ngram"))
        window.compare_view.chat_box.setChecked(False)
    window.compare_view.run_button.click()
    wait_signal(app, window.worker.finished, lambda r: r.kind == "compare", RUN_LIMIT_S)
    if target is None:  # a model of one's own: no sweep (nine points of repeated runs take long on a CPU)
        window.compare_view.sweep_button.click()
        wait_signal(app, window.worker.finished, lambda r: r.kind == "sweep", RUN_LIMIT_S)
    if errors:
        raise SpecDeskError(errors[0])
    _settle(app)
    return _grab(window, path)


def _pairing(app, window, path: Path, demo_size: str, say: Callable[[str], None], errors: list,
             scratch: Path) -> Path:
    """Measure the demo draft (a greedy compare with it, recorded like every compare), then
    grab the pairing dialog for the demo target over the demo's files and a Q8_0 copy of the
    draft made in `scratch`: the draft ranked by what was measured, the copy by an assumption,
    the target exported with its MTP layer and the DFlash drafter among the native drafters."""
    from specdesk.app.models.library import read_model
    from specdesk.app.runtime.session import resolve_demo
    from specdesk.app.storage.settings import DEMO_DFLASH, DEMO_MTP

    say("measuring the draft")
    controls = window.controls
    controls.method_combo.setCurrentIndex(controls.method_combo.findData("draft"))
    controls.k_spin.setValue(4)
    window.compare_view.run_button.click()
    wait_signal(app, window.worker.finished, lambda r: r.kind == "compare", RUN_LIMIT_S)
    if errors:
        raise SpecDeskError(errors[0])
    say("pairing")
    paths = [window.info.target_path, window.info.draft_path]
    try:  # llama.cpp's exports of the demo: the target with its MTP layer, the DFlash drafter
        paths += resolve_demo(DEMO_MTP, DEMO_DFLASH, demo_size, say)
    except SpecDeskError as e:  # none here: the pairing shows the measured draft alone
        say(f"no MTP target for the pairing: {e}")
    # A second quantization of the draft that nothing has measured: ranked on an assumption.
    from specdesk.engines.llama.binding import quantize_gguf

    say("quantizing the draft to Q8_0")
    unmeasured = quantize_gguf(window.info.draft_path, scratch / "specdesk-demo-draft-Q8_0.gguf", "Q8_0")
    paths.insert(2, str(unmeasured))
    models = window.models_view
    models.entries = [read_model(p, "demo") for p in paths if p]  # the demo's files, not this machine's library
    dialog = models.open_pairing(models.entries[0])
    dialog.resize(960, 640)  # long reasons wrap
    wait_signal(app, models.pairing_ready, lambda report: True, 120)
    _settle(app)
    try:
        return _grab(dialog, path)
    finally:
        dialog.close()


def _show_library(app, window, paths: Optional[list[str]] = None) -> None:
    """The Models tab lists the demo's files (those the pairing used) or `paths`, not this machine's library."""
    from specdesk.app.models.library import read_model

    models = window.models_view
    entries = list(models.entries) if paths is None else [read_model(p) for p in paths]
    window.tabs.setCurrentWidget(models)  # showing it starts its scan: wait for it, then show the demo's
    if models.status.text().startswith("scanning"):
        wait_signal(app, models.library_loaded, lambda found: True, 120)
    models._show_library(entries)
    models.library.selectRow(0)


def _tabs_at(app, window, out: Path, size: tuple[int, int], suffix: str) -> list[Path]:
    """Every tab at `size`, as TAB-WIDTHxHEIGHT.png; an error if the window is not that size or
    any widget is squeezed below its minimum (ui/layout.clipped)."""
    from .clipping import clipped

    window.resize(*size)
    saved = []
    for index, name in enumerate(TABS):
        window.tabs.setCurrentIndex(index)
        _settle(app)
        got = (window.width(), window.height())
        if got != size:
            raise SpecDeskError(f"the window is {got[0]}x{got[1]} when asked for {size[0]}x{size[1]}")
        squeezed = clipped(window)
        if squeezed:
            raise SpecDeskError(f"at {size[0]}x{size[1]} the {name} tab clips: " + "; ".join(squeezed[:5]))
        saved.append(_grab(window, out / f"{name}-{size[0]}x{size[1]}{suffix}.png"))
    return saved


def _settle(app) -> None:
    """Let the repaint timer draw the last batch and layouts finish."""
    import time

    end = time.monotonic() + 0.25
    while time.monotonic() < end:
        app.processEvents()
        time.sleep(0.01)


def _grab(window, path: Path) -> Path:
    if not window.grab().save(str(path)):
        raise SpecDeskError(f"could not write {path}")
    return path
