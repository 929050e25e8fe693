"""The engine in its own process (app/runtime/engine_client.py, app/runtime/engine_host.py), on real llama.cpp.

A model that aborts llama.cpp must never take the caller down. The crash cases from the
issue are GGUF files crafted here from the small demo target; the loader's checks now
refuse most of them before llama.cpp sees them, so the process's death itself is also
caused directly: SIGABRT is what llama.cpp's GGML_ASSERT ends a process with, SIGKILL what
the out-of-memory killer sends, and SIGSTOP makes a step that never returns (a stuck
kernel looks exactly like that from outside).
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from specdesk.app.runtime.engine_client import STOP_GRACE_S, EngineClient, EngineHostDied
from specdesk.app.chat.prompting import chat_prompt
from specdesk.engines.types import GenerationRequest, SamplingParams, SpecConfig, SpecDeskError

from llama_helpers import copy_gguf



@pytest.fixture(scope="module")
def crafted(demo_family, tmp_path_factory) -> dict[str, Path]:
    """The crash cases: llama.cpp aborts on each."""
    folder = tmp_path_factory.mktemp("crafted")
    target = demo_family["target_gguf"]
    return {
        "no_blocks": copy_gguf(target, folder / "no-blocks.gguf", {"{arch}.block_count": 0}),
        "nan_eps": copy_gguf(target, folder / "nan-eps.gguf",
                              {"{arch}.attention.layer_norm_rms_epsilon": float("nan")}),
    }


@pytest.fixture(scope="module")
def client(demo_family):
    with EngineClient(demo_family["target_gguf"], n_threads=1) as engine:
        engine.load_draft(demo_family["draft_gguf"])
        yield engine


def events(engine, request: GenerationRequest) -> list:
    return list(engine.generate(request, threading.Event()))


def comparable(event) -> tuple:
    """An event without its timings."""
    return (event.tokens, event.text, event.drafted, event.accepted, event.position_accepted, event.from_draft,
            event.finished, event.finish_reason)


def test_host_yields_the_in_process_engines_events(client, local, demo_family):
    prompt = "def parse_args(argv):\n"
    tokens = client.tokenize(prompt)
    assert tokens == local.tokenize(prompt)
    messages = [{"role": "user", "content": "hi"}]
    assert client.chat_prompt(messages) == chat_prompt(local, messages)
    for spec, sampling in ((SpecConfig(method="draft", k=4, draft_path=demo_family["draft_gguf"]), SamplingParams()),
                           (SpecConfig(method="ngram", k=3), SamplingParams(temperature=0.8, seed=7)),
                           (SpecConfig(), SamplingParams())):
        request = GenerationRequest(tuple(tokens), max_tokens=40, sampling=sampling, spec=spec)
        remote, in_process = events(client, request), events(local, request)
        assert [comparable(e) for e in remote] == [comparable(e) for e in in_process]
        assert all(e.draft_s >= 0 and e.verify_s > 0 for e in remote)
    assert client.name == local.name and client.n_ctx == local.n_ctx and client.target.n_vocab == local.target.n_vocab
    assert [client.target.token_bytes(t) for t in tokens] == [local.target.token_bytes(t) for t in tokens]


def test_errors_in_the_host_come_back_as_the_engines_errors(client, demo_family, tmp_path):
    too_long = GenerationRequest(tuple([1] * (client.n_ctx + 1)), max_tokens=4)
    with pytest.raises(SpecDeskError, match="context holds"):
        events(client, too_long)
    not_a_model = tmp_path / "notes.gguf"
    not_a_model.write_text("notes, not weights\n")
    with pytest.raises(SpecDeskError, match="notes.gguf"):
        client.load_draft(str(not_a_model))
    with pytest.raises(SpecDeskError, match="notes.gguf"):
        EngineClient(not_a_model, n_threads=1)
    assert client.alive and len(events(client, GenerationRequest((1, 2, 3), max_tokens=3))) >= 1


def test_cancel_ends_the_run_after_the_step_in_progress(client):
    cancel = threading.Event()
    request = GenerationRequest(tuple(client.tokenize("import os\n")), max_tokens=2000, spec=SpecConfig(),
                                stop_at_eos=False)
    seen = []
    for event in client.generate(request, cancel):
        seen.append(event)
        if len(seen) == 5:
            cancel.set()
    assert 5 <= len(seen) < 2000 and seen[-1].finish_reason is None
    # an abandoned generation is ended too, and the next request starts clean
    iterator = client.generate(request, threading.Event())
    next(iterator)
    iterator.close()
    assert len(events(client, GenerationRequest((1, 2, 3), max_tokens=3))) >= 1


def assert_one_sentence(error: EngineHostDied, activity: str) -> None:
    message = str(error)
    assert "\n" not in message and "engine process" in message and activity in message, message
    assert "reload" in message


@pytest.mark.parametrize("case", ["no_blocks", "nan_eps"])
def test_crafted_crash_files_never_take_the_caller_down(crafted, case):
    """Refused up front with the file named, or the host dies with one sentence: never the caller."""
    try:
        engine = EngineClient(crafted[case], n_threads=1)
    except EngineHostDied as e:
        assert_one_sentence(e, f"while loading {crafted[case].name}")
        assert "GGML_ASSERT" in e.details.splitlines()[0]  # llama.cpp's own reason comes first
        return
    except SpecDeskError as e:
        assert crafted[case].name in str(e) and "\n" not in str(e)
        return
    try:
        request = GenerationRequest(tuple(engine.chat_prompt([{"role": "user", "content": "hello"}])), max_tokens=8)
        with pytest.raises(EngineHostDied) as caught:
            events(engine, request)
        assert_one_sentence(caught.value, "while generating")
    finally:
        engine.close()


def run_until(engine: EngineClient, steps: int, then) -> None:
    """A long generation; after `steps` events, `then()` is done to its host."""
    request = GenerationRequest(tuple(engine.tokenize("import os\n")), max_tokens=100_000, stop_at_eos=False)
    for i, _ in enumerate(engine.generate(request, threading.Event())):
        if i == steps:
            then()


@pytest.mark.parametrize("sig, words", [(signal.SIGABRT, "(SIGABRT) while generating"),
                                        (signal.SIGKILL, "(SIGKILL, which often means the system ran out of memory)")])
def test_a_host_that_dies_is_one_sentence_and_its_last_output(demo_family, sig, words):
    engine = EngineClient(demo_family["target_gguf"], n_threads=1, n_ctx=4096)  # a run of seconds
    try:
        with pytest.raises(EngineHostDied) as caught:
            run_until(engine, 3, lambda: os.kill(engine.pid, sig))
        assert_one_sentence(caught.value, words)
        if sig == signal.SIGABRT:
            assert "Fatal Python error: Aborted" in caught.value.details  # where it was, from the host's own output
        assert not engine.alive
        with pytest.raises(EngineHostDied, match="has stopped: reload"):
            engine.tokenize("again")
    finally:
        engine.close()


def test_a_million_threads_never_takes_the_caller_down(demo_family):
    try:
        engine = EngineClient(demo_family["target_gguf"], n_threads=1_000_000)
    except EngineHostDied as e:
        assert_one_sentence(e, "loading")
        return
    except SpecDeskError as e:  # refused before llama.cpp sees it
        assert "threads" in str(e)
        return
    try:
        with pytest.raises(EngineHostDied) as caught:  # llama.cpp: std::bad_alloc, then abort
            events(engine, GenerationRequest((1, 2, 3), max_tokens=4))
        assert_one_sentence(caught.value, "while generating")
        assert caught.value.details.strip()
    finally:
        engine.close()


def test_stop_ends_a_host_whose_step_never_returns(demo_family):
    engine = EngineClient(demo_family["target_gguf"], n_threads=1, n_ctx=4096)  # a run of seconds
    cancel = threading.Event()
    request = GenerationRequest(tuple(engine.tokenize("import os\n")), max_tokens=100_000, stop_at_eos=False)
    stopped_at, grace = [0.0], [0.0]
    try:
        with pytest.raises(EngineHostDied) as caught:
            for i, _ in enumerate(engine.generate(request, cancel)):
                if i == 3:
                    os.kill(engine.pid, signal.SIGSTOP)  # the step in progress never ends
                    cancel.set()
                    stopped_at[0], grace[0] = time.monotonic(), engine.stop_grace_s()
        elapsed = time.monotonic() - stopped_at[0]
        assert grace[0] >= STOP_GRACE_S  # more only after a step that took longer (a loaded machine)
        assert_one_sentence(caught.value, f"within {grace[0]:.0f} s of Stop")
        assert grace[0] <= elapsed < grace[0] + 30  # the upper margin is for a loaded machine; a hang never ends
        assert not engine.alive
    finally:
        engine.close()

    # a chat template is rendered in the host too: Stop ends a render that does not return
    engine = EngineClient(demo_family["target_gguf"], n_threads=1)
    try:
        os.kill(engine.pid, signal.SIGSTOP)
        cancel = threading.Event()
        threading.Timer(0.2, cancel.set).start()
        with engine.watching(cancel), pytest.raises(EngineHostDied, match="while chat prompt"):
            engine.chat_prompt([{"role": "user", "content": "hello"}])
    finally:
        engine.close()


def test_a_load_can_be_stopped_at_once(demo_family):
    cancel = threading.Event()
    cancel.set()  # as closing the window does to a load in progress
    started = time.monotonic()
    with pytest.raises(SpecDeskError, match="loading specdesk-demo-target-F16.gguf was stopped"):
        EngineClient(demo_family["target_gguf"], n_threads=1, cancel=cancel)
    assert time.monotonic() - started < STOP_GRACE_S + 30  # stopped, not loaded: only a hang reaches this


def test_closing_ends_the_host_process(demo_family):
    engine = EngineClient(demo_family["target_gguf"], n_threads=1)
    pid, log = engine.pid, engine.log_path
    engine.close()
    assert not engine.alive and not os.path.exists(log)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


# --- the app survives ------------------------------------------------------------


@pytest.fixture
def window(qtbot, demo_family, tmp_path, monkeypatch):
    pytest.importorskip("pytestqt")
    from PySide6.QtWidgets import QMessageBox

    from specdesk.app.storage.settings import Settings
    from specdesk.ui.main_window import MainWindow

    monkeypatch.setenv("SPECDESK_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("SPECDESK_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(QMessageBox, "critical", lambda *args, **kwargs: QMessageBox.Ok)
    settings = Settings(target_path=demo_family["target_gguf"], draft_path=demo_family["draft_gguf"],
                        method="draft", k=4, threads=1, max_tokens=16, n_ctx=4096)
    win = MainWindow(settings, autoload=False)
    qtbot.addWidget(win)
    win.show()
    with qtbot.waitSignal(win.worker.finished, timeout=60_000, check_params_cb=lambda r: r.kind == "load"):
        win.load_models()
    yield win
    win.close()


def chat_once(qtbot, win, text: str):
    win.chat_view.input.setPlainText(text)
    with qtbot.waitSignal(win.worker.finished, timeout=60_000, check_params_cb=lambda r: r.kind == "chat"):
        win.chat_view.send_button.click()


def test_the_app_survives_a_model_that_aborts_and_offers_to_reload(qtbot, window, crafted):
    win = window
    chat_once(qtbot, win, "def f(x):")
    saved = [(m.role, m.content) for m in win.history.messages(win.chat_id)]
    assert [role for role, _ in saved] == ["user", "assistant"]
    # a model file llama.cpp cannot run: refused with its name, or its process dies; the window goes on
    with qtbot.waitSignal(win.worker.errored, timeout=60_000) as blocker:
        win.controls.set_model("target", str(crafted["no_blocks"]))
    assert "no-blocks.gguf" in blocker.args[0].message and win.isVisible()

    win.controls.method_combo.setCurrentIndex(win.controls.method_combo.findData("none"))
    win.controls.max_tokens_spin.setValue(4000)  # seconds of generation: the host aborts mid-run
    win.chat_view.input.setPlainText("hello")
    with qtbot.waitSignal(win.worker.stream, timeout=60_000):
        win.chat_view.send_button.click()
    with qtbot.waitSignal(win.worker.errored, timeout=60_000) as blocker:
        os.kill(win.worker._runner.engine.pid, signal.SIGABRT)  # what llama.cpp's GGML_ASSERT does
    error = blocker.args[0]
    assert error.engine_lost and "Fatal Python error: Aborted" in error.details
    box = win.engine_stop_box
    assert box is not None and box.isVisible()
    assert box.text() == error.message and "(SIGABRT) while generating" in box.text()
    assert box.detailedText() == error.details
    # the chat is intact: on screen and saved
    assert [(m.role, m.content) for m in win.history.messages(win.chat_id)][:2] == saved
    assert "def f(x):" in win.chat_view.plain_text() and win.isVisible()
    assert win.info is None and not win.chat_view.send_button.isEnabled()
    reload_button = next(b for b in box.buttons() if b.text() == "Reload")
    with qtbot.waitSignal(win.worker.finished, timeout=60_000, check_params_cb=lambda r: r.kind == "load"):
        reload_button.click()
    assert win.info is not None and win.chat_view.send_button.isEnabled()
    chat_once(qtbot, win, "def g(y):")
    assert [m.role for m in win.history.messages(win.chat_id)][-2:] == ["user", "assistant"]


def start_a_step_that_never_ends(qtbot, win, text: str) -> None:
    """Send a long request; once it streams, stop its host process (a stuck kernel, seen from outside)."""
    win.controls.method_combo.setCurrentIndex(win.controls.method_combo.findData("none"))
    win.controls.max_tokens_spin.setValue(4000)  # seconds of generation: the host is stopped mid-run
    win.chat_view.input.setPlainText(text)
    with qtbot.waitSignal(win.worker.stream, timeout=60_000):
        win.chat_view.send_button.click()
    os.kill(win.worker._runner.engine.pid, signal.SIGSTOP)
    qtbot.wait(300)
    assert win.worker.busy


def test_stop_ends_a_hung_host_and_closing_never_waits_long(qtbot, window):
    win = window
    chat_once(qtbot, win, "def f(x):")
    start_a_step_that_never_ends(qtbot, win, "hello")
    with qtbot.waitSignal(win.worker.errored, timeout=15_000) as blocker:
        win.chat_view.stop_button.click()
    assert re.search(r"within \d+ s of Stop", blocker.args[0].message) and win.engine_stop_box.isVisible()
    saved = win.history.messages(win.chat_id)  # what streamed before Stop stays, marked partial
    assert [m.role for m in saved] == ["user", "assistant", "user", "assistant"] and saved[-1].meta["partial"]

    # reload, hang again, and close the window while it hangs
    with qtbot.waitSignal(win.worker.finished, timeout=60_000, check_params_cb=lambda r: r.kind == "load"):
        win.load_models()
    start_a_step_that_never_ends(qtbot, win, "hello again")
    started = time.monotonic()
    win.close()
    # two seconds at most for the host, plus saving; the margin is for a loaded machine (a close that
    # waited on the hung host would take the worker thread's 10 s and more)
    assert time.monotonic() - started < 2.0 + 7.0
    from specdesk.ui.worker import running_threads

    assert not running_threads()


def test_the_cli_says_what_happened_in_one_line(demo_family):
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "specdesk.app.main", "compare", "--target", demo_family["target_gguf"],
                          "--method", "ngram", "--prompt", "def f(x):", "--threads", "1000000", "--max-tokens", "8"],
                         capture_output=True, text=True, timeout=120)
    lines = run.stderr.splitlines()
    assert run.returncode == 2 and lines and lines[0].startswith("specdesk: error: "), run.stderr
    assert "Traceback" not in run.stderr
    if "engine process" in lines[0]:  # llama.cpp aborted: the process's last output follows the sentence
        assert "(SIGABRT)" in lines[0] and len(lines) > 1


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the engine process through /proc")
def test_the_cli_ends_an_engine_that_stops_answering_in_one_line(demo_family):
    """A terminal has no Stop button: a step that does not return within Stop's grace ends
    the engine process, with one line and exit status 2."""
    import subprocess
    import sys

    from test_serve import engine_processes

    child = subprocess.Popen([sys.executable, "-m", "specdesk.app.main", "chat", "--target", demo_family["target_gguf"],
                              "--method", "none", "--threads", "1", "--ctx", "4096", "--max-tokens", "4000"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        child.stdin.write("import os\n")
        child.stdin.flush()
        shown = ""
        while not shown.endswith("model> "):  # generating now
            more = child.stdout.read(1)
            assert more, shown
            shown += more
        (host,) = engine_processes(child.pid)
        os.kill(host, signal.SIGSTOP)
        _, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    errors = [line for line in err.splitlines() if line.startswith("specdesk")]
    assert child.returncode == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert re.match(r"specdesk: error: the engine process for specdesk-demo-target-F16\.gguf sent nothing for \d+ s "
                    r"while [a-z ]+ \(it is stopped or stuck\) and was ended$", errors[0]), errors[0]
    assert not Path(f"/proc/{host}").exists() or "Z" in Path(f"/proc/{host}/stat").read_text().split()[2]


def test_the_host_renders_a_cross_vocabulary_drafts_conversation_in_its_template(client, smollm2):
    """The demo target (a vocabulary of its own) with SmolLM2 (ChatML) as a cross-vocabulary
    draft: the host renders the conversation in SmolLM2's template, where the draft lives."""
    from specdesk.engines.methods import METHODS
    from specdesk.engines.speculation.crossvocab import CrossVocabDrafting

    method = next(name for name, info in METHODS.items() if CrossVocabDrafting.engine_class in repr(info.proposer))
    messages = [{"role": "user", "content": "Name three rivers."}]
    rendered = client.draft_prompt(SpecConfig(method=method, k=3, draft_path=smollm2), messages)
    assert rendered.startswith("<|im_start|>") and "<|im_start|>user\nName three rivers.<|im_end|>" in rendered
    assert client.draft_prompt(SpecConfig(method="ngram", k=3), messages) == ""
