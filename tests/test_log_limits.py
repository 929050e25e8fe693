"""Log lines a peer can repeat at will are said once, then counted (app/serving/log_limits.py):
on a logger with a clock the test moves, and in a real `specdesk serve` sent garbage."""

from __future__ import annotations

import errno
import io
import logging
import signal
import socket
import subprocess

import pytest

from specdesk.app.serving.log_limits import EVERY_S, Repeats, RepeatLimit, held_note


def test_repeats_say_the_first_then_one_per_period_with_the_count_held_back():
    repeats = Repeats(every_s=60)
    assert repeats.occur(0.0) == 0
    assert [repeats.occur(t) for t in (1.0, 2.0, 59.9)] == [None, None, None]
    assert repeats.occur(60.0) == 3 and repeats.occur(61.0) is None
    assert repeats.occur(500.0) == 1  # a quiet spell: said at once, with what was held before it
    assert held_note(0, 60) == "" and held_note(1234, 60) == " (and 1,234 more like it in the last 60 s)"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def limited_logger(name: str, clock: Clock) -> tuple[logging.Logger, io.StringIO]:
    logger = logging.getLogger(name)
    logger.handlers.clear()
    logger.propagate = False
    logger.setLevel(logging.WARNING)
    out = io.StringIO()
    logger.addHandler(logging.StreamHandler(out))
    logger.addFilter(RepeatLimit(every_s=60, clock=clock))
    return logger, out


def test_a_flood_of_peer_warnings_is_one_line_then_a_count():
    clock = Clock()
    logger, out = limited_logger("test.log_limits.peer", clock)
    for _ in range(10_000):
        logger.warning("Invalid HTTP request received.")
        logger.warning("Exceeded concurrency limit.")
    logger.warning("the engine process stopped (%s) while generating", "SIGKILL")  # not limited
    logger.warning("the engine process stopped (%s) while generating", "SIGKILL")
    assert out.getvalue().splitlines() == ["Invalid HTTP request received.", "Exceeded concurrency limit.",
                                           "the engine process stopped (SIGKILL) while generating",
                                           "the engine process stopped (SIGKILL) while generating"]
    clock.now = 60.0
    logger.warning("Invalid HTTP request received.")
    assert out.getvalue().splitlines()[-1] == \
        "Invalid HTTP request received. (and 9,999 more like it in the last 60 s)"


def test_running_out_of_descriptors_is_one_line_without_its_traceback():
    clock = Clock()
    logger, out = limited_logger("test.log_limits.descriptors", clock)
    for n in range(1000):
        try:
            raise OSError(errno.EMFILE, "Too many open files")
        except OSError:
            logger.error("socket.accept() out of system resource", exc_info=True)
        try:
            raise OSError(errno.ENOENT, "No such file or directory")
        except OSError:
            if n == 0:  # another error keeps its traceback
                logger.error("could not open %s", "x", exc_info=True)
    lines = out.getvalue().splitlines()
    assert lines[0] == "socket.accept() out of system resource: Too many open files; it recovers as connections " \
                       "close. Raise the open-files limit (ulimit -n) if these are real clients"
    assert lines[1] == "could not open x" and "Traceback" in lines[2]
    assert "Too many open files" not in "".join(lines[1:])


@pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="POSIX process control")
def test_serve_says_a_flood_of_invalid_requests_in_one_line(demo_family):
    from test_serve import MODEL, http, start_limited_server

    child, url = start_limited_server(demo_family["target_gguf"])
    try:
        host, port = url.removeprefix("http://").removesuffix("/v1").split(":")
        for _ in range(300):
            with socket.create_connection((host, int(port)), timeout=30) as s:
                s.sendall(b"\x16\x03\x01 not HTTP at all\r\n\r\n")  # a TLS hello, or a scanner
                assert s.recv(4096).startswith(b"HTTP/1.1 400 ")
        status, body = http(url, "/v1/models", key=None)
        assert status == 200 and body["data"][0]["id"] == MODEL
    finally:
        child.send_signal(signal.SIGINT)
        try:
            _, err = child.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            _, err = child.communicate()
    invalid = [line for line in err.splitlines() if "Invalid HTTP request received" in line]
    assert len(invalid) == 1, err[-2000:]  # all 300 came within EVERY_S of the first
