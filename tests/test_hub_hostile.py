"""A hostile hub: what a server sends never writes outside the model cache, nor past the advertised size.

Every test runs huggingface_hub and app/models/hub.py against the real local HTTP hub (tests/hub_server.py)
in one of its hostile modes, and checks the one-line message and that the user's files beside the
cache are exactly as they were.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hub_server import HubServer  # noqa: E402

from specdesk.app.models import hub  # noqa: E402
from specdesk.app.main import main  # noqa: E402
from specdesk.engines.types import SpecDeskError  # noqa: E402

REPO = "acme/tiny-GGUF"
GGUF_NAME = "tiny-Q4_K_M.gguf"
DATA = b"GGUF" + hashlib.sha256(b"hostile").digest() * 8192  # 256 KiB + 4: several chunks
README = b"# tiny\n"
USER_FILE = b"the user's own notes, not a model\n"


@pytest.fixture
def server(tmp_path, monkeypatch):
    with HubServer() as hub_server:
        hub_server.add_repo(REPO, {GGUF_NAME: DATA, "README.md": README}, tags=["gguf"])
        monkeypatch.setenv("HF_ENDPOINT", hub_server.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield hub_server


def cache(tmp_path) -> Path:
    return tmp_path / "hf-cache"


def outside_the_cache(tmp_path) -> dict[str, tuple[str, bytes]]:
    """Everything beside the cache: kind and content (or link target) of each path."""
    state = {}
    for path in sorted(tmp_path.rglob("*")):
        relative = path.relative_to(tmp_path)
        if relative.parts[0] in ("hf-cache", "hf-home"):
            continue
        if path.is_symlink():
            state[str(relative)] = ("symlink", os.readlink(path).encode())
        elif path.is_file():
            state[str(relative)] = ("file", path.read_bytes())
        else:
            state[str(relative)] = ("folder", b"")
    return state


def plant_user_files(tmp_path, *names: str) -> dict[str, tuple[str, bytes]]:
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(USER_FILE)
    return outside_the_cache(tmp_path)


def one_line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def no_model_in_cache(tmp_path) -> bool:
    return not [p for p in cache(tmp_path).rglob("*") if p.is_file() and "blobs" in p.parts
                or "snapshots" in p.parts and p.name in (GGUF_NAME, "README.md")]


@pytest.mark.parametrize("filename", [GGUF_NAME, "README.md"])  # an LFS file (redirected) and a git file
def test_a_commit_hash_with_dots_leaves_the_users_file_alone(server, tmp_path, filename):
    # snapshots/../../../x is tmp_path/x: that is where the server aims the snapshot link.
    before = plant_user_files(tmp_path, f"x/{filename}", "x/other.txt")
    server.fake_commit = "../../../x"
    with pytest.raises(SpecDeskError) as error:
        hub.download(REPO, filename)
    assert f"{REPO}/{filename}: refused X-Repo-Commit '../../../x'" in one_line(error)
    assert "40 lowercase hex digits" in str(error.value)
    assert outside_the_cache(tmp_path) == before  # same files, same bytes, no new symlink
    assert (tmp_path / "x" / filename).read_bytes() == USER_FILE and not (tmp_path / "x" / filename).is_symlink()
    assert not list(cache(tmp_path).rglob("refs/*"))  # not even a ref naming the bad commit
    assert no_model_in_cache(tmp_path)


@pytest.mark.parametrize("etag", ["../../../evil", "blobs/../../../../evil", "a\\..\\..\\evil", "ABC"])
@pytest.mark.parametrize("filename", [GGUF_NAME, "README.md"])
def test_a_crafted_etag_writes_nothing_outside_the_cache(server, tmp_path, etag, filename):
    # blobs/../../../evil is tmp_path/evil, and the lock file would have gone beside it.
    before = plant_user_files(tmp_path, "evil", "evil.incomplete")
    server.fake_etag = etag
    with pytest.raises(SpecDeskError) as error:
        hub.download(REPO, filename)
    assert f"refused ETag {etag!r}" in one_line(error) and "a git sha1 or a sha256" in str(error.value)
    assert outside_the_cache(tmp_path) == before
    assert no_model_in_cache(tmp_path)
    assert not server.requests("GET", "/cdn/")  # refused before the body was asked for


@pytest.mark.parametrize("location", ["file:///etc/passwd", "ftp://example.invalid/x.gguf", "data:,GGUF"])
def test_a_redirect_to_something_else_than_http_is_refused(server, tmp_path, location):
    server.fake_location = location
    with pytest.raises(SpecDeskError, match=r"refused redirect .*http or https") as error:
        hub.download(REPO, GGUF_NAME)
    one_line(error)
    assert no_model_in_cache(tmp_path)


BAD_REVISIONS = ["../../x", "../../../../tmp/x", "/etc", "refs/../../x", "a//b", ".hidden", "x.lock",
                 "C:\\x", "main\0", "", "a" * 300]


@pytest.mark.parametrize("revision", BAD_REVISIONS)
def test_a_revision_that_is_no_ref_is_refused_before_any_request(server, tmp_path, revision):
    before = plant_user_files(tmp_path, "x", "README.md")
    for call in (lambda: hub.download(REPO, "README.md", revision=revision),
                 lambda: hub.download_files(REPO, [], revision=revision),
                 lambda: hub.list_files(REPO, revision=revision)):
        with pytest.raises(SpecDeskError, match="refused revision") as error:
            call()
        assert "give a branch, a tag or a commit hash" in one_line(error)
    assert server.requests() == []
    assert outside_the_cache(tmp_path) == before and not cache(tmp_path).exists()


def test_models_download_refuses_a_revision_that_climbs_out(server, tmp_path, capsys):
    before = plant_user_files(tmp_path, "x")
    assert main(["models", "download", REPO, "README.md", "--revision", "../../x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refused revision '../../x': it contains '..'" in err
    assert server.requests() == [] and outside_the_cache(tmp_path) == before


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/1", "release-2026_01", "0" * 40])
def test_branches_tags_and_commits_are_revisions(revision):
    assert hub.check_revision(revision) == revision


def test_a_commit_revision_downloads_and_writes_no_ref(server, tmp_path):
    commit = server.repos[REPO].commit
    path = hub.download(REPO, "README.md", revision=commit)
    assert path.read_bytes() == README and path.parent.name == commit
    assert not list(cache(tmp_path).rglob("refs/*"))


@pytest.mark.parametrize("announced", [False, True], ids=["close-delimited", "with-content-length"])
@pytest.mark.parametrize("filename,data", [(GGUF_NAME, DATA), ("README.md", README)])
def test_a_body_longer_than_advertised_is_cut_off_at_the_advertised_size(server, tmp_path, announced,
                                                                          filename, data):
    server.overlong = 10
    server.overlong_length = announced
    partials: list[int] = []

    def watch(progress: hub.DownloadProgress) -> None:  # bytes on disk after every chunk written
        partials.extend(p.stat().st_size for p in cache(tmp_path).rglob("*.incomplete"))

    with pytest.raises(SpecDeskError) as error:
        hub.download(REPO, filename, progress=watch)
    message = one_line(error)
    if announced:  # a Content-Length ten times the size: refused before a byte is written
        assert f"the server announced {len(data) * 10} bytes where {len(data)} were expected" in message
    else:
        assert f"the server sent more than the {len(data)} bytes the hub listed" in message
        assert "cut off" in message
    on_disk = [p.stat().st_size for p in cache(tmp_path).rglob("blobs/*")]
    assert max(partials + on_disk, default=0) <= len(data)
    assert not list(cache(tmp_path).rglob(f"snapshots/*/{filename}"))

    # An honest server again: what was kept is checked by its checksum and the file completes.
    server.overlong = 0
    assert hub.download(REPO, filename).read_bytes() == data


LONG_NAME = "a" * 295 + ".gguf"  # 300 characters: more than any common file system takes in one name


def test_a_300_character_file_name_is_refused_in_one_line(server, tmp_path, capsys):
    server.add_repo("acme/long-names", {LONG_NAME: b"GGUF" + b"\0" * 60})
    with pytest.raises(SpecDeskError) as error:
        hub.download("acme/long-names", LONG_NAME)
    assert "is 300 bytes long, more than the 255 a file system allows" in one_line(error)
    assert server.requests() == []
    # With no names given the listing brings the long name in: the command fails in one line too.
    assert main(["models", "download", "acme/long-names"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refused file name 'aaaa" in err and "300 bytes long" in err
    assert not server.requests("GET", "/resolve/") and not server.requests("GET", "/cdn/")


def test_a_path_too_long_for_the_file_system_fails_in_one_line(server, tmp_path):
    deep = "/".join(["d" * 250] * 17) + "/m.gguf"  # each name fits, the whole path (4 KiB+) does not
    server.add_repo("acme/deep", {deep: b"GGUF" + b"\0" * 60})
    with pytest.raises(SpecDeskError) as error:
        hub.download("acme/deep", deep)
    assert "cannot write" in one_line(error) and "File name too long" in str(error.value)


def test_a_cache_folder_that_links_outside_is_not_written_through(server, tmp_path):
    """A link planted inside the cache (by anything) does not lead a write out of it."""
    before = plant_user_files(tmp_path, "elsewhere/keep.txt")
    storage = hub.repo_folder(cache(tmp_path), REPO)
    storage.mkdir(parents=True)
    (storage / "snapshots").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SpecDeskError) as error:
        hub.download(REPO, "README.md")
    assert "refused to write" in one_line(error) and "outside the download folder" in str(error.value)
    assert outside_the_cache(tmp_path) == before


def test_inside_resolves_folders_but_not_the_last_link(tmp_path):
    root = tmp_path / "cache"
    (root / "blobs").mkdir(parents=True)
    (root / "out").symlink_to(tmp_path)
    (root / "blobs" / "link").symlink_to(tmp_path / "target")
    assert hub.inside(root, root / "blobs" / "a") == root.resolve() / "blobs" / "a"
    assert hub.inside(root, root / "blobs" / "link") == root.resolve() / "blobs" / "link"  # unlink removes the link
    for escaping in (root / ".." / "x", root / "out" / "x", root / "blobs" / ".." / ".." / "x", root, Path("/etc/x")):
        with pytest.raises(SpecDeskError, match="outside the download folder"):
            hub.inside(root, escaping)


def test_a_server_that_hangs_up_mid_body_leaves_a_partial_file_to_resume(server, tmp_path):
    server.hang_up_at = len(DATA) // 2  # it promised the whole file in Content-Length
    with pytest.raises(SpecDeskError) as error:
        hub.download(REPO, GGUF_NAME)
    assert f"{REPO}/{GGUF_NAME} (the download stopped at" in one_line(error)
    (partial,) = cache(tmp_path).rglob("*.incomplete")
    kept = partial.stat().st_size
    assert 0 < kept <= len(DATA) // 2 and partial.read_bytes() == DATA[:kept]
    server.hang_up_at = None
    assert hub.download(REPO, GGUF_NAME).read_bytes() == DATA
    # The server logs a request when its handler ends: the cut-off one may end after the resumed
    # one, and the resumed one's log may land just after the client has its last byte.
    deadline = time.monotonic() + 10
    while True:
        cdn = server.requests("GET", "/cdn/")
        resumed = [r for r in cdn if r.range is not None]
        if resumed or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert resumed and resumed[-1].range == f"bytes={kept}-" and resumed[-1].sent == len(DATA) - kept
    assert all(r.sent < len(DATA) for r in cdn)  # nothing was fetched whole again


def test_a_size_in_the_headers_that_differs_from_the_listing_is_refused(server, tmp_path):
    server.fake_size = len(DATA) * 10  # X-Linked-Size says ten times what the listing says
    with pytest.raises(SpecDeskError) as error:
        hub.download(REPO, GGUF_NAME)
    assert f"two sizes for this file: {len(DATA)} bytes in the listing, {len(DATA) * 10} in its headers" \
        in one_line(error)
    assert not server.requests("GET", "/cdn/") and no_model_in_cache(tmp_path)
