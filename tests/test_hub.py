"""Hub search, listing and downloads: huggingface_hub against a real local HTTP hub (tests/hub_server.py)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hub_server import HubServer  # noqa: E402

from specdesk.app.models import hub  # noqa: E402
from specdesk.app.models.library import LibraryConfig, scan_library  # noqa: E402
from specdesk.engines.types import SpecDeskError  # noqa: E402

GGUF_NAME = "tiny-Q4_K_M.gguf"
BIG = 3 * 1024 * 1024 + 17  # bytes of the "model"; several chunks, so a cancel lands mid-file


@pytest.fixture
def server(tmp_path, monkeypatch):
    data = b"GGUF" + hashlib.sha256(b"seed").digest() * (BIG // 32)
    with HubServer(token="hf_test_token") as hub_server:
        hub_server.add_repo("acme/tiny-GGUF", {GGUF_NAME: data, "README.md": b"# tiny\n",
                                               "sub/config.json": b"{}"}, tags=["gguf"], downloads=50)
        hub_server.add_repo("acme/tiny-hf", {"model.safetensors": b"\0" * 64, "config.json": b"{}"}, downloads=9)
        hub_server.add_repo("other/big-GGUF", {"big-Q8_0.gguf": 1 << 50}, tags=["gguf"], downloads=1)
        hub_server.add_repo("acme/private-GGUF", {"p.gguf": b"GGUF" + b"\1" * 1000}, private=True, tags=["gguf"])
        hub_server.data = data
        monkeypatch.setenv("HF_ENDPOINT", hub_server.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no login token of the real user
        yield hub_server


def cache_dir(tmp_path) -> Path:
    return tmp_path / "hf-cache"


def leftovers(tmp_path) -> list[Path]:
    return [p for p in cache_dir(tmp_path).rglob("*") if p.name.endswith(".incomplete")]


def test_search_filters_by_text_gguf_and_author(server):
    assert [r.repo_id for r in hub.search("tiny")] == ["acme/tiny-GGUF", "acme/tiny-hf"]
    gguf = hub.search("", gguf_only=True)
    assert [r.repo_id for r in gguf] == ["acme/tiny-GGUF", "other/big-GGUF"] and all(r.gguf for r in gguf)
    assert [r.repo_id for r in hub.search("", author="other")] == ["other/big-GGUF"]
    assert hub.search("tiny")[0].downloads == 50


def test_list_files_has_sizes_checksums_and_quantization(server):
    files = {f.path: f for f in hub.list_files("acme/tiny-GGUF")}
    assert set(files) == {GGUF_NAME, "README.md", "sub/config.json"}
    gguf = files[GGUF_NAME]
    assert gguf.size == len(server.data) and gguf.sha256 == hashlib.sha256(server.data).hexdigest()
    assert gguf.quantization == "Q4_K_M" and files["README.md"].sha256 is None and files["README.md"].size == 7
    assert hub.quantization_of("Qwen3-8B-IQ4_XS.gguf") == "IQ4_XS"
    assert hub.quantization_of("model-bf16.gguf") == "BF16"


def test_full_download_lands_in_the_standard_cache_with_progress(server, tmp_path):
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache

    seen = []
    path = hub.download("acme/tiny-GGUF", GGUF_NAME, progress=seen.append)
    assert path.read_bytes() == server.data
    assert seen[-1].done == seen[-1].total == len(server.data) and seen[0].resumed_from == 0
    assert [p.done for p in seen] == sorted(p.done for p in seen) and len(seen) > 3
    # Redirected to the CDN origin, as the hub does for LFS files; fetched exactly once.
    assert server.bytes_sent("/cdn/") == len(server.data)
    # Every HF tool finds it where it expects it.
    assert try_to_load_from_cache("acme/tiny-GGUF", GGUF_NAME, cache_dir=cache_dir(tmp_path)) == str(path)
    cached = scan_cache_dir(cache_dir(tmp_path))
    assert [r.repo_id for r in cached.repos] == ["acme/tiny-GGUF"]
    assert path.is_symlink() and path.resolve().parent.name == "blobs"
    # A second download is a no-op, small (non-LFS) files come straight from resolve.
    before = server.bytes_sent("/cdn/")
    assert hub.download("acme/tiny-GGUF", GGUF_NAME) == path and server.bytes_sent("/cdn/") == before
    assert hub.download("acme/tiny-GGUF", "sub/config.json").read_bytes() == b"{}"
    # ...and the library lists the downloaded model, read in place.
    entries = scan_library(LibraryConfig(include_demo=False, include_apps=False))
    assert [(e.path, e.repo_id, e.source) for e in entries] == [(str(path), "acme/tiny-GGUF", "hf-cache")]
    assert entries[0].error  # not a real GGUF model: listed with its error, never a crash


def test_cancel_then_resume_fetches_only_the_missing_bytes(server, tmp_path):
    server.throttle_s = 0.002
    cancel = threading.Event()

    def stop_midway(p):
        if p.done > len(server.data) // 3:
            cancel.set()

    with pytest.raises(hub.DownloadCancelled, match="cancelled"):
        hub.download("acme/tiny-GGUF", GGUF_NAME, cancel=cancel, progress=stop_midway)
    partial = leftovers(tmp_path)
    assert len(partial) == 1
    kept = partial[0].stat().st_size
    assert 0 < kept < len(server.data)
    assert partial[0].read_bytes() == server.data[:kept]

    server.throttle_s = 0.0
    seen = []
    path = hub.download("acme/tiny-GGUF", GGUF_NAME, progress=seen.append)
    assert path.read_bytes() == server.data and not leftovers(tmp_path)
    assert seen[0].resumed_from == kept
    resumed = server.requests("GET", "/cdn/")[-1]
    assert resumed.range == f"bytes={kept}-"
    assert resumed.sent == len(server.data) - kept  # not one finished byte is fetched again


CRASHING_DOWNLOAD = """
import sys
from specdesk.app.models import hub
hub.download("acme/tiny-GGUF", sys.argv[1])
"""


def test_resume_after_the_downloading_process_was_killed(server, tmp_path):
    # The server holds the body a third of the way in, so the kill lands mid-transfer on any machine.
    server.hold_at = len(server.data) // 3
    server.released.clear()
    child = subprocess.Popen([sys.executable, "-c", CRASHING_DOWNLOAD, GGUF_NAME], env=os.environ.copy())
    try:
        deadline = time.monotonic() + 120  # only a bound on a broken download; never reached normally
        while time.monotonic() < deadline and child.poll() is None:
            partial = leftovers(tmp_path)
            if partial and partial[0].stat().st_size >= server.hold_at // 2:
                break
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(10)
        server.hold_at = None
        server.released.set()
    partial = leftovers(tmp_path)
    assert len(partial) == 1
    kept = partial[0].stat().st_size
    assert 0 < kept < len(server.data)
    path = hub.download("acme/tiny-GGUF", GGUF_NAME)
    assert path.read_bytes() == server.data
    last = server.requests("GET", "/cdn/")[-1]
    assert last.range == f"bytes={kept}-" and last.sent == len(server.data) - kept


def test_a_corrupted_byte_is_detected_and_nothing_enters_the_cache(server, tmp_path):
    server.corrupt.add(f"acme/tiny-GGUF/{GGUF_NAME}")
    with pytest.raises(SpecDeskError, match=f"acme/tiny-GGUF/{GGUF_NAME}: checksum mismatch"):
        hub.download("acme/tiny-GGUF", GGUF_NAME)
    assert not leftovers(tmp_path)
    assert not list(cache_dir(tmp_path).rglob("snapshots/*/*.gguf"))
    assert not [p for p in cache_dir(tmp_path).rglob("blobs/*") if p.is_file()]
    server.corrupt.clear()
    assert hub.download("acme/tiny-GGUF", GGUF_NAME).read_bytes() == server.data


def test_not_enough_free_space_is_refused_before_the_first_byte(server, tmp_path):
    # The hub advertises a 1 PiB file: the real free space of this disk is checked, nothing is fetched.
    with pytest.raises(SpecDeskError, match=r"other/big-GGUF/big-Q8_0.gguf: not enough disk space.*disk is full"):
        hub.download("other/big-GGUF", "big-Q8_0.gguf")
    assert server.bytes_sent("/cdn/") == 0 and not leftovers(tmp_path)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_disk_that_fills_up_mid_download_leaves_no_partial_file(server, tmp_path):
    """Writes go to /dev/full, where the kernel answers every write with ENOSPC."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    etag = get_hf_file_metadata(hf_hub_url("acme/tiny-GGUF", GGUF_NAME, endpoint=server.url)).etag
    blobs = cache_dir(tmp_path) / "models--acme--tiny-GGUF" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{etag}.incomplete").symlink_to("/dev/full")
    with pytest.raises(SpecDeskError, match=f"acme/tiny-GGUF/{GGUF_NAME}: the disk is full"):
        hub.download("acme/tiny-GGUF", GGUF_NAME)
    assert not list(blobs.iterdir())  # the partial file is gone, and no blob was made
    assert not list(cache_dir(tmp_path).rglob("snapshots/*/*.gguf"))
    entries = scan_library(LibraryConfig(include_demo=False, include_apps=False))
    assert entries == []


@pytest.mark.parametrize("name", ["../evil.gguf", "a/../../evil.gguf", "/etc/passwd", "C:\\evil.gguf",
                                  "sub\\..\\evil.gguf", "./x.gguf", ""])
def test_a_file_name_that_escapes_the_cache_is_refused_before_any_request(server, name):
    before = len(server.requests())
    with pytest.raises(SpecDeskError, match="refused file name"):
        hub.download("acme/tiny-GGUF", name)
    with pytest.raises(SpecDeskError, match="refused file name"):
        hub.download_files("acme/tiny-GGUF", ["README.md", name])
    assert len(server.requests()) == before


def test_private_repositories_need_hf_token(server, monkeypatch, tmp_path):
    with pytest.raises(SpecDeskError, match="set HF_TOKEN"):
        hub.download("acme/private-GGUF", "p.gguf")
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    assert hub.download("acme/private-GGUF", "p.gguf").read_bytes().startswith(b"GGUF")
    assert server.requests("HEAD", "private")[-1].authorization == "Bearer hf_test_token"


def test_a_renamed_repository_is_followed(server):
    server.aliases["acme/old-name"] = "acme/tiny-GGUF"
    server.add_repo("acme/old-name", {"README.md": b"# tiny\n"})  # listing still answers under the old name
    path = hub.download("acme/old-name", "README.md")
    assert path.read_bytes() == b"# tiny\n"
    assert server.requests("HEAD", "/acme/tiny-GGUF/resolve/")


def test_bad_repo_ids_and_missing_files_are_explained(server):
    with pytest.raises(SpecDeskError, match="not a repository id"):
        hub.download("no-slash", "x.gguf")
    with pytest.raises(SpecDeskError, match="has no file 'missing.gguf'"):
        hub.download("acme/tiny-GGUF", "missing.gguf")
    with pytest.raises(SpecDeskError, match="repository not found"):
        hub.list_files("acme/nothing-here")


def test_models_search_and_download_commands(server, tmp_path, capsys):
    from specdesk.app.main import main

    assert main(["models", "search", "tiny", "--gguf", "--json"]) == 0
    assert [r["repo_id"] for r in json.loads(capsys.readouterr().out)] == ["acme/tiny-GGUF"]
    assert main(["models", "download", "acme/tiny-GGUF", "--json"]) == 0  # no names: its GGUF files
    (path,) = json.loads(capsys.readouterr().out)
    assert Path(path).read_bytes() == server.data
    assert main(["models", "download", "acme/tiny-GGUF", "README.md", "../escape"]) == 2
    assert "refused file name '../escape'" in capsys.readouterr().err
