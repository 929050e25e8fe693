"""Time from launching the bundled app under Xvfb to its main window being shown.

An outside probe, so the app needs no timing hook: Xvfb is started on a free display, the
bundle's executable is launched with fresh (empty) settings, history and cache folders, as
on a first launch, and `xdotool search --onlyvisible --pid --name ^SpecDesk` is polled until that
process's main window is mapped. The clock runs from just before the launch to the poll that saw
the window; the poll interval bounds the error. Each run is a separate process; the first
may be slower because the bundle's files are not yet in the page cache.

Prints one JSON line: the runs in seconds, their median and maximum, and whether every run
met the limit (the window must appear within 5 seconds); exits 1 when one did not.

    python benchmarks/bundle_startup.py [--app dist/gguf/specdesk/specdesk] [--runs 5]
Needs Xvfb and xdotool (Debian: apt-get install xvfb xdotool).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_APP = ROOT / "dist" / "gguf" / "specdesk" / "specdesk"
LIMIT_S = 5.0
POLL_S = 0.02


def start_xvfb() -> tuple[subprocess.Popen, str]:
    """Xvfb on the first free display number, which it reports through -displayfd."""
    read_fd, write_fd = os.pipe()
    xvfb = subprocess.Popen(["Xvfb", "-displayfd", str(write_fd), "-screen", "0", "1600x1000x24", "-nolisten", "tcp"],
                            pass_fds=(write_fd,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        number = f.readline().strip()
    display = f":{number}"
    # Ready means a client can connect: probe before timing anything.
    env = {**os.environ, "DISPLAY": display}
    deadline = time.monotonic() + 10
    while number and time.monotonic() < deadline:
        if subprocess.run(["xdotool", "getdisplaygeometry"], env=env, capture_output=True).returncode == 0:
            return xvfb, display
        time.sleep(0.1)
    xvfb.kill()
    raise SystemExit("bundle_startup: Xvfb did not start")


def window_shown(pid: int, env: dict) -> bool:
    # The main window's title starts with "SpecDesk" (dialogs have their own titles).
    probe = subprocess.run(["xdotool", "search", "--all", "--onlyvisible", "--pid", str(pid), "--name", "^SpecDesk"],
                           env=env,
                           capture_output=True, text=True)
    return probe.returncode == 0 and bool(probe.stdout.strip())


def one_run(command: list[str], display: str, timeout_s: float) -> float | None:
    """Seconds from launch to the first mapped window, or None if none appeared in time."""
    with tempfile.TemporaryDirectory(prefix="specdesk-startup-") as home:
        env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
        env.update(DISPLAY=display, SPECDESK_CONFIG_DIR=f"{home}/config", SPECDESK_DATA_DIR=f"{home}/data",
                   SPECDESK_CACHE_DIR=f"{home}/cache", OMP_NUM_THREADS="1")
        started = time.perf_counter()
        app = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               start_new_session=True)
        shown_after = None
        try:
            while time.perf_counter() - started < timeout_s:
                if window_shown(app.pid, env):
                    shown_after = time.perf_counter() - started
                    break
                if app.poll() is not None:
                    err = app.stderr.read().decode(errors="replace")[-2000:]
                    raise SystemExit(f"bundle_startup: the app exited with {app.returncode} before "
                                     f"showing a window:\n{err}")
                time.sleep(POLL_S)
        finally:
            if app.poll() is None:
                os.killpg(app.pid, signal.SIGTERM)
                try:
                    app.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(app.pid, signal.SIGKILL)
                    app.wait()
        return shown_after


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--app", default=str(DEFAULT_APP), help="the bundle's executable (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=30.0, help="give up on a run after this many seconds")
    args = parser.parse_args()
    for tool in ("Xvfb", "xdotool"):
        if shutil.which(tool) is None:
            raise SystemExit(f"bundle_startup: {tool} is missing: apt-get install xvfb xdotool")
    if not os.access(args.app, os.X_OK):
        raise SystemExit(f"bundle_startup: {args.app} is not an executable: build it with packaging/build_linux.sh")
    xvfb, display = start_xvfb()
    try:
        runs = [one_run([args.app], display, args.timeout) for _ in range(args.runs)]
    finally:
        xvfb.terminate()
        xvfb.wait()
    shown = [r for r in runs if r is not None]
    within_limit = len(shown) == len(runs) and max(shown) <= LIMIT_S
    print(json.dumps({
        "benchmark": "bundle_startup",
        "app": os.path.relpath(args.app, ROOT) if Path(args.app).resolve().is_relative_to(ROOT) else args.app,
        "runs_s": [round(r, 3) if r is not None else None for r in runs],
        "first_s": round(runs[0], 3) if runs[0] is not None else None,
        "median_s": round(statistics.median(shown), 3) if shown else None,
        "max_s": round(max(shown), 3) if shown else None,
        "limit_s": LIMIT_S,
        "within_limit": within_limit,
        "poll_interval_s": POLL_S,
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }))
    return 0 if within_limit else 1  # a startup over the limit (or a window that never showed) fails the run


if __name__ == "__main__":
    sys.exit(main())
