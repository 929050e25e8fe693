"""The memory bars under hostile peers (docs/security.md): under 500 MB for the served-engine
client, under 1 GB for `specdesk serve` plus its engine process, whatever the peer sends.

The worst cases of benchmarks/hostile_memory.py, each sized so that without its bound the
peer would send far more than the bar (1 GiB, or 30 s at full speed): the client runs in a
child process and its peak resident size is its own; serve's peak and its engine's are read
from /proc around each case. These are bounds on memory, not on time: a case that is bounded
ends in about a second."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from benchmarks import hostile_memory

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists() or sys.platform != "linux",
                                reason="reads peak resident sizes from /proc")

CLIENT_BAR_MB = 500
SERVE_BAR_MB = 1024


@pytest.mark.parametrize("case, refusal", [
    ("sse_line_1gib", "sent a line over 1024 KiB"),
    ("chunks_64k", "sent a reply over 64 MiB"),
    ("json_reply_1gib", "sent a reply over 64 MiB"),
    ("models_1gib", "/v1/models is over 8,192 KiB"),
])
def test_the_client_stays_under_500_mb(case, refusal):
    figures = hostile_memory.client_case(case, seconds=30)
    assert refusal in figures["outcome"] and "\n" not in figures["outcome"], figures
    assert figures["peak_rss_mb"] < CLIENT_BAR_MB, figures
    assert figures["server_sent_mb"] < 256, figures  # the client stopped reading (socket buffers hold the rest)


@pytest.fixture(scope="module")
def limited_serve(demo_family):
    """`specdesk serve` on the small demo target with at most 1,024 open files."""
    child, base = hostile_memory.start_serve(demo_family["target_gguf"])
    yield child, base, Path(demo_family["target_gguf"]).stem
    err = hostile_memory.stop_serve(child)
    assert "Traceback" not in err and len(err.splitlines()) < 10, err[-3000:]


@pytest.mark.parametrize("case, outcome", [
    ("prompt_50mb", "HTTP/1.1 413 "),
    ("prompt_50mb_chunked", "HTTP/1.1 413 "),
    ("prompt_under_body_limit", "HTTP/1.1 400 "),
    ("deep_json", "HTTP/1.1 400 "),
    ("chunks_64k", "HTTP/1.1 413 "),
    ("header_1gib", "HTTP/1.1 400 "),
    ("half_open_1100", "200 OK in "),
    ("abandoned_20", "next client: HTTP/1.1 200 OK"),
])
def test_serve_and_its_engine_stay_under_1_gb(limited_serve, case, outcome):
    child, base, model = limited_serve
    figures = hostile_memory.serve_case(child, base, model, case, seconds=30)
    assert outcome in figures["outcome"], figures
    assert figures["engine_peak_mb"] > 0 and figures["total_peak_mb"] < SERVE_BAR_MB, figures
