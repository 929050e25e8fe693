"""Offline: the hub client says in one line, within seconds, that the hub cannot be reached,
and a truncated model file says to download it again."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from specdesk.app.models import hub
from specdesk.engines.llama.header import read_gguf_header
from specdesk.engines.llama.validate import gguf_problems
from specdesk.engines.types import SpecDeskError


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def no_proxy(monkeypatch, tmp_path):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))


@pytest.mark.parametrize("where, said", [
    ("refused", "refused the connection"),
    ("unresolvable", "does not resolve"),
])
@pytest.mark.parametrize("call", ["search", "list_files", "download"])
def test_an_unreachable_hub_is_said_in_one_line_within_5_s(no_proxy, monkeypatch, caplog, where, said, call):
    url = f"http://127.0.0.1:{unused_port()}" if where == "refused" else "http://specdesk-no-such-hub.invalid"
    monkeypatch.setenv("HF_ENDPOINT", url)
    started = time.monotonic()
    with pytest.raises(SpecDeskError) as raised:
        if call == "search":
            hub.search("qwen")
        elif call == "list_files":
            hub.list_files("acme/tiny-GGUF")
        else:
            hub.download("acme/tiny-GGUF", "tiny-Q4_K_M.gguf")
    elapsed = time.monotonic() - started
    message = str(raised.value)
    assert elapsed < 5.0, f"{elapsed:.1f} s before: {message}"
    assert "\n" not in message and f"cannot reach {url}" in message and said in message
    assert not [r for r in caplog.records if "Retrying" in r.getMessage()]


def test_a_reachable_hub_passes_the_check(no_proxy):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert hub.offline_reason(f"http://127.0.0.1:{listener.getsockname()[1]}") is None


def test_a_configured_proxy_is_what_must_answer(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert hub._reach_point("https://huggingface.co") == ("proxy.example", 3128)
    monkeypatch.setenv("NO_PROXY", "huggingface.co")
    assert hub._reach_point("https://huggingface.co") == ("huggingface.co", 443)


def test_a_truncated_model_file_says_to_download_it_again(demo_family, tmp_path):
    data = Path(demo_family["draft_gguf"]).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) * 2 // 3])
    problems = gguf_problems(read_gguf_header(cut))
    assert problems and "truncated" in problems[0] and problems[0].endswith("download it again")
