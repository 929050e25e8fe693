"""`specdesk screenshot --endpoint URL --out DIR`: the chat on a served engine, offscreen.

Opens the main window (settings and history in a temporary folder), uses the server as
Servers > Add server… does, sends one prompt (sampled at T = 0.7 with a seed, as the local
screenshot, so a small demo model writes something code-like), waits for the reply and its
charts, and saves served-chat.png.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

from specdesk.engines.types import SpecDeskError

PROMPT = "Write a function that parses command line arguments."


def take_served_screenshot(out: Path, url: str, api_key: Optional[str] = None, model: Optional[str] = None,
                           size: tuple[int, int] = (1280, 800), dark: bool = False, suffix: str = "",
                           max_tokens: int = 160, temperature: float = 0.7,
                           progress: Optional[Callable[[str], None]] = None) -> Path:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from specdesk.app.serving.endpoint import Endpoint
    from specdesk.app.storage.history import History
    from specdesk.app.storage.settings import Settings

    from .app import make_app
    from .main_window import MainWindow
    from .screenshot import _grab, _settle

    say = progress or (lambda message: None)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    app = make_app([], dark=dark)
    endpoint = Endpoint(url, api_key=api_key, model=model)
    say(f"connecting to {endpoint.url}")
    endpoint.probe()
    with tempfile.TemporaryDirectory(prefix="specdesk-screenshot-") as scratch:
        settings = Settings(max_tokens=max_tokens, temperature=temperature, seed=1)
        quit_on_close = app.quitOnLastWindowClosed()
        app.setQuitOnLastWindowClosed(False)
        window = MainWindow(settings, History(Path(scratch) / "history.sqlite3"),
                            settings_file=Path(scratch) / "settings.json", autoload=False)
        errors: list[str] = []
        window.report_error = errors.append
        window.resize(*size)
        window.show()
        try:
            window.served.use(endpoint)
            say("chatting")
            window.chat_view.input.setPlainText(PROMPT)
            window.chat_view.send_button.click()
            deadline = time.monotonic() + 300
            while window.worker.busy and time.monotonic() < deadline:
                app.processEvents()
                time.sleep(0.01)
            if window.worker.busy:
                raise SpecDeskError(f"{endpoint.url} did not finish the reply within 300 s")
            if errors:
                raise SpecDeskError(errors[0])
            _settle(app)
            return _grab(window, out / f"served-chat{suffix}.png")
        finally:
            window.close()
            window.deleteLater()
            app.processEvents()
            app.setQuitOnLastWindowClosed(quit_on_close)
