"""The Hugging Face Hub: search, list a repository's files, download into the standard cache.

Everything speaks huggingface_hub, so `HF_ENDPOINT`, `HF_TOKEN` (or a `hf auth login`
token) and `HF_HUB_CACHE` / `HF_HOME` work as in every HF tool, and a downloaded file sits
in the standard cache layout (blobs/, snapshots/<commit>/, refs/) where hf_hub_download,
transformers and the rest find it.

The transfer itself is a small loop over huggingface_hub's HTTP session instead of
hf_hub_download, because a download here must (1) stop when the user cancels, between
chunks, (2) resume after a cancel or a crash without fetching finished bytes again, which
needs a partial file that outlives the process (`blobs/<etag>.incomplete`, the name older
huggingface_hub versions used), and (3) check the LFS sha256 (or the git blob id) of what
arrived before it enters the cache. A file name or revision that would escape the cache is
refused before any request, and free disk space is checked before the first byte.

Nothing a server sends is trusted with a path: the commit hash and ETag that name the
snapshot folder and the blob must look like git / sha256 object ids, the download URL must
be http(s), the sizes of the listing and of the file's headers must agree, and the body is
cut off at that size. Every path written, linked, renamed or removed is resolved first and
must lie inside the cache folder (`inside`), so a file outside it is never touched.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import socket
import threading
import urllib.request
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Callable, Optional
from urllib.parse import urljoin, urlparse

from specdesk.engines.types import SpecDeskError

from ..storage.paths import hf_cache_dir

DEFAULT_ENDPOINT = "https://huggingface.co"
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
QUANT = re.compile(r"(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|[BM]?F\d{1,2}|BF16|TQ\d_\d)(?![A-Za-z0-9])", re.I)
COMMIT = re.compile(r"[0-9a-f]{40}")  # huggingface_hub's REGEX_COMMIT_HASH; used with fullmatch
OBJECT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # an ETag: git blob sha1, or LFS sha256
REF_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")  # what git refuses in a ref name (git check-ref-format)
NAME_MAX_BYTES = 255  # the longest file name ext4, APFS and NTFS take
CHUNK_BYTES = 1 << 20
TIMEOUT_S = 30.0
REACH_TIMEOUT_S = 3.0  # resolving the hub's host, and again connecting to it, before any request


class DownloadCancelled(SpecDeskError):
    """The user stopped the download; its partial file is kept for resuming."""


@dataclass(frozen=True)
class SearchResult:
    repo_id: str
    author: Optional[str]
    downloads: int
    likes: int
    tags: tuple[str, ...]
    gguf: bool
    last_modified: Optional[str]


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: Optional[str]  # LFS files
    blob_id: Optional[str]  # git blob sha1
    quantization: Optional[str]  # from the file name (GGUF)

    @property
    def is_gguf(self) -> bool:
        return self.path.endswith(".gguf")


@dataclass(frozen=True)
class DownloadProgress:
    repo_id: str
    filename: str
    done: int  # bytes in the partial file, resumed ones included
    total: int
    resumed_from: int  # bytes that were already there when this attempt started


def endpoint() -> str:
    """HF_ENDPOINT, read at call time (a mirror set after start-up still counts)."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _api():
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint())  # no token given: huggingface_hub reads HF_TOKEN or the login


def check_repo_id(repo_id: str) -> str:
    if not REPO_ID.match(repo_id or "") or ".." in repo_id:
        raise SpecDeskError(f"{repo_id!r} is not a repository id: use OWNER/NAME, for example Qwen/Qwen3-8B-GGUF")
    return repo_id


def check_filename(filename: str) -> str:
    """Refuse a repository file name that would land outside the cache (before any request)."""
    problem = None
    if not filename or filename.strip() != filename:
        problem = "it is empty or has surrounding spaces"
    elif "\0" in filename or "\\" in filename:
        problem = "it contains a backslash or a NUL character"
    elif PurePosixPath(filename).is_absolute() or PureWindowsPath(filename).is_absolute() or \
            PureWindowsPath(filename).drive or filename.startswith("/"):
        problem = "it is an absolute path"
    elif any(part in ("..", ".", "") for part in filename.split("/")):
        problem = "it has a '..', '.' or empty path segment"
    if problem:
        raise SpecDeskError(f"refused file name {filename!r}: {problem}, so it would escape the download folder")
    longest = max(filename.split("/"), key=lambda part: len(part.encode()))
    if len(longest.encode()) > NAME_MAX_BYTES:
        raise SpecDeskError(f"refused file name {_short(filename)!r}: its name {_short(longest)!r} is "
                            f"{len(longest.encode())} bytes long, more than the {NAME_MAX_BYTES} a file system "
                            f"allows; the repository cannot be stored on disk under this name")
    return filename


def check_revision(revision: str) -> str:
    """Refuse a revision that is not a git branch, tag or commit (before any request).

    A revision becomes the path refs/<revision> in the cache, so the rules are git's own for
    ref names (git check-ref-format): they leave no way out of the refs folder.
    """
    problem = None
    if not revision:
        problem = "it is empty"
    elif len(revision.encode()) > NAME_MAX_BYTES:
        problem = f"it is longer than {NAME_MAX_BYTES} bytes"
    elif REF_FORBIDDEN.search(revision):
        problem = "it contains a space, a control character, a backslash or one of ~^:?*["
    elif revision.startswith("/") or revision.endswith("/") or "//" in revision:
        problem = "it starts or ends with '/' or has an empty segment"
    elif ".." in revision or "@{" in revision or revision == "@":
        problem = "it contains '..' or '@{'"
    elif any(part.startswith(".") or part.endswith((".lock", ".")) for part in revision.split("/")):
        problem = "a segment starts with '.' or ends with '.' or '.lock'"
    if problem:
        raise SpecDeskError(f"refused revision {_short(revision)!r}: {problem}; give a branch, a tag or a "
                            f"commit hash (for example main)")
    return revision


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def quantization_of(filename: str) -> Optional[str]:
    if not filename.endswith(".gguf"):
        return None
    found = QUANT.findall(Path(filename).stem)
    return found[-1].upper() if found else None


def _explain(error: Exception, what: str) -> SpecDeskError:
    """One line for a hub error, saying what to do (token, name, network)."""
    from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, HfHubHTTPError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    if isinstance(error, GatedRepoError):
        return SpecDeskError(f"{what}: the repository is gated: accept its terms on the hub, then set HF_TOKEN")
    if isinstance(error, RepositoryNotFoundError):
        return SpecDeskError(f"{what}: repository not found, or private: check the name, or set HF_TOKEN "
                             f"to a token that can read it")
    if isinstance(error, RevisionNotFoundError):
        return SpecDeskError(f"{what}: no such revision")
    if isinstance(error, EntryNotFoundError):
        return SpecDeskError(f"{what}: no such file in the repository")
    if isinstance(error, HfHubHTTPError):
        return SpecDeskError(f"{what}: the hub answered: {str(error).splitlines()[0]}")
    return SpecDeskError(f"{what}: cannot reach {endpoint()} ({type(error).__name__}: {error}); "
                         f"check the network or HF_ENDPOINT")


def _reach_point(url: str) -> tuple[str, int]:
    """The host and port a request to `url` connects to first: the proxy's where the
    environment names one for it (as huggingface_hub's client would use), else the URL's own."""
    parts = urlparse(url)
    host = parts.hostname or ""
    proxy = None if urllib.request.proxy_bypass(host) else urllib.request.getproxies().get(parts.scheme)
    if proxy:
        parts = urlparse(proxy if "://" in proxy else "http://" + proxy)
        host = parts.hostname or host
    try:
        port = parts.port
    except ValueError:
        port = None
    return host, port or (443 if parts.scheme == "https" else 80)


def offline_reason(url: str, timeout: float = REACH_TIMEOUT_S) -> Optional[str]:
    """Why `url` cannot be reached, found with one try in at most about twice `timeout`
    seconds (the host name does not resolve, the connection is refused or times out), or None
    when a connection opens. The hub client retries five times with waits up to 8 s, which
    tells an offline user nothing for half a minute."""
    host, port = _reach_point(url)
    found: list = []

    def resolve() -> None:
        try:
            found.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except (OSError, UnicodeError) as e:
            found.append(e)

    # getaddrinfo takes no timeout: it runs on a thread that is left behind if the resolver hangs
    resolver = threading.Thread(target=resolve, name="hub-resolve", daemon=True)
    resolver.start()
    resolver.join(timeout)
    if not found:
        return f"the host name {host} did not resolve within {timeout:g} s"
    if isinstance(found[0], Exception):
        return f"the host name {host} does not resolve"
    last: Optional[OSError] = None
    for family, kind, proto, _, address in found[0]:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.settimeout(timeout)
                probe.connect(address)
            return None
        except OSError as e:
            last = e
    if isinstance(last, ConnectionRefusedError):
        return f"{host}:{port} refused the connection"
    if isinstance(last, socket.timeout):
        return f"{host}:{port} did not accept a connection within {timeout:g} s"
    return f"{host}:{port}: {getattr(last, 'strerror', None) or last}"


def require_online(what: str) -> None:
    """One line, within a few seconds, when the hub (HF_ENDPOINT) cannot be reached at all."""
    reason = offline_reason(endpoint())
    if reason is not None:
        raise SpecDeskError(f"{what}: cannot reach {endpoint()} ({reason}); check the network or HF_ENDPOINT")


def _hub_errors():
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError

    return (HfHubHTTPError, httpx2.HTTPError, OSError)


# --- search and listing ------------------------------------------------------------
def search(query: str = "", gguf_only: bool = False, author: Optional[str] = None,
           limit: int = 50) -> list[SearchResult]:
    """Models whose id contains `query`, most downloaded first."""
    require_online(f"search {query!r}")
    try:
        models = list(_api().list_models(search=query or None, author=author or None,
                                         filter="gguf" if gguf_only else None, sort="downloads", limit=limit))
    except _hub_errors() as e:
        raise _explain(e, f"search {query!r}") from e
    results = []
    for m in models:
        tags = tuple(m.tags or ())
        modified = m.last_modified.isoformat() if getattr(m, "last_modified", None) else None
        results.append(SearchResult(m.id, m.author, int(m.downloads or 0), int(m.likes or 0), tags,
                                    "gguf" in tags or (m.library_name == "gguf"), modified))
    return results


def list_files(repo_id: str, revision: Optional[str] = None, folder: Optional[str] = None) -> list[RemoteFile]:
    """Every file of a repository (or one folder of it), with size, checksum and quantization."""
    from huggingface_hub.hf_api import RepoFile

    check_repo_id(repo_id)
    if revision is not None:
        check_revision(revision)
    require_online(repo_id)
    try:
        tree = list(_api().list_repo_tree(repo_id, path_in_repo=folder, recursive=True, revision=revision))
    except _hub_errors() as e:
        raise _explain(e, repo_id) from e
    files = []
    for item in tree:
        if isinstance(item, RepoFile):
            files.append(RemoteFile(item.path, int(item.size or 0), item.lfs.sha256 if item.lfs else None,
                                    item.blob_id, quantization_of(item.path)))
    return sorted(files, key=lambda f: f.path)


def remote_file(repo_id: str, filename: str, revision: Optional[str] = None) -> RemoteFile:
    folder = str(PurePosixPath(filename).parent)
    for f in list_files(repo_id, revision, None if folder == "." else folder):
        if f.path == filename:
            return f
    raise SpecDeskError(f"{repo_id}: has no file {filename!r}")


# --- the cache layout ----------------------------------------------------------------
def repo_folder(cache: Path, repo_id: str) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def inside(root: Path, path: Path) -> Path:
    """`path` with its folders resolved, refused unless it lies inside `root` (the cache folder).

    Called before every write, link, rename and removal. The last part is not followed: unlink,
    replace and symlink act on a link itself, never on what it points to.
    """
    real_root = Path(os.path.realpath(root))
    real = Path(os.path.realpath(path.parent)) / path.name
    if path.name in ("", ".", "..") or real_root not in real.parents:
        raise SpecDeskError(f"refused to write {path}: it lies outside the download folder {real_root}; "
                            f"nothing outside it was changed")
    return real


def _link(cache: Path, blob: Path, pointer: Path) -> None:
    """snapshots/<commit>/<file> -> ../../blobs/<etag>, as huggingface_hub makes it."""
    inside(cache, blob)
    inside(cache, pointer)
    inside(cache, pointer.parent).mkdir(parents=True, exist_ok=True)
    if pointer.exists() or pointer.is_symlink():
        pointer.unlink()
    try:
        os.symlink(os.path.relpath(blob, pointer.parent), pointer)
    except OSError:  # no symlinks (Windows without developer mode): a hard link, else a copy
        try:
            os.link(blob, pointer)
        except OSError:
            shutil.copy2(blob, pointer)


def _write_ref(cache: Path, storage: Path, revision: str, commit: str) -> None:
    """refs/<branch or tag> holds the commit it stands for, as huggingface_hub writes it."""
    ref = inside(cache, storage / "refs" / revision)
    inside(cache, ref.parent).mkdir(parents=True, exist_ok=True)
    temporary = inside(cache, ref.with_name(f"{ref.name}.{os.getpid()}.tmp"))
    temporary.write_text(commit)
    os.replace(temporary, ref)  # replaces a link at refs/<revision> itself, never what it points to


def _free_bytes(folder: Path) -> tuple[Path, int]:
    for path in (folder, *folder.parents):
        if path.exists():
            return path, shutil.disk_usage(path).free
    return folder, 0


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


class _Checksum:
    """The LFS sha256, or the git blob sha1 of a small file; fed with bytes as they arrive."""

    def __init__(self, lfs: bool, size: int):
        self.lfs = lfs
        self.digest = hashlib.sha256() if lfs else hashlib.sha1(b"blob %d\0" % size)

    def update(self, data: bytes) -> None:
        self.digest.update(data)

    def hexdigest(self) -> str:
        return self.digest.hexdigest()


def _resume_state(partial: Path, size: int, lfs: bool) -> tuple[int, _Checksum]:
    checksum = _Checksum(lfs, size)
    done = partial.stat().st_size if partial.is_file() else 0
    if done > size:  # not a prefix of this file: start over
        partial.unlink()
        done = 0
    if done:
        with open(partial, "rb") as f:
            for chunk in iter(lambda: f.read(CHUNK_BYTES), b""):
                checksum.update(chunk)
    return done, checksum


# --- what the server says about a file ------------------------------------------------
@dataclass(frozen=True)
class _Served:
    """The HEAD answer for one file, checked: safe to put into paths and to download from."""

    commit: str
    etag: str
    url: str
    size: int


def _check_served(what: str, asked_url: str, meta, listed_size: int) -> _Served:
    where = endpoint()

    def refuse(header: str, value, why: str) -> SpecDeskError:
        shown = _short(str(value)) if value is not None else None
        return SpecDeskError(f"{what}: refused {header} {shown!r} from {where}: {why}; is HF_ENDPOINT a hub?")

    if not meta.commit_hash or not meta.etag:
        raise SpecDeskError(f"{what}: {where} did not send X-Repo-Commit and ETag: is HF_ENDPOINT a hub?")
    if not COMMIT.fullmatch(meta.commit_hash):
        raise refuse("X-Repo-Commit", meta.commit_hash, "a commit is 40 lowercase hex digits")
    if not OBJECT_ID.fullmatch(meta.etag):
        raise refuse("ETag", meta.etag, "an ETag is a git sha1 or a sha256 (40 or 64 lowercase hex digits)")
    url = urljoin(asked_url, meta.location or asked_url)  # a relative Location counts from the file's URL
    parts = urlparse(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise refuse("redirect", meta.location, "a download URL is http or https with a host")
    if listed_size < 0 or (meta.size is not None and meta.size != listed_size):
        raise SpecDeskError(f"{what}: {where} gives two sizes for this file: {listed_size} bytes in the listing, "
                            f"{meta.size} in its headers; is HF_ENDPOINT a hub?")
    return _Served(meta.commit_hash, meta.etag, url, listed_size)


def download(repo_id: str, filename: str, revision: str = "main", cache_dir: Optional[Path] = None,
             cancel: Optional[threading.Event] = None,
             progress: Optional[Callable[[DownloadProgress], None]] = None) -> Path:
    """Download one file into the HF cache; returns its snapshot path. Resumes a partial file."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    check_repo_id(repo_id)
    check_filename(filename)
    check_revision(revision)
    cancel = cancel or threading.Event()
    cache = Path(cache_dir) if cache_dir is not None else hf_cache_dir()
    storage = repo_folder(cache, repo_id)
    what = f"{repo_id}/{_short(filename, 120)}"
    if COMMIT.fullmatch(revision) and (storage / "snapshots" / revision / filename).exists():
        return storage / "snapshots" / revision / filename

    expected = remote_file(repo_id, filename, revision)
    url = hf_hub_url(repo_id, filename, revision=revision, endpoint=endpoint())
    try:
        meta = get_hf_file_metadata(url, endpoint=endpoint())
    except _hub_errors() as e:
        raise _explain(e, what) from e
    served = _check_served(what, url, meta, expected.size)
    lfs = expected.sha256 is not None
    want = expected.sha256 if lfs else (expected.blob_id or served.etag)
    try:
        return _store(cache, storage, repo_id, filename, revision, served, lfs, want, what, cancel, progress)
    except OSError as e:  # a path the file system refuses, a read-only cache: one line, not a traceback
        raise SpecDeskError(f"{what}: cannot write {_short(str(e.filename or cache), 120)}: "
                            f"{e.strerror or e}") from e


def _store(cache: Path, storage: Path, repo_id: str, filename: str, revision: str, served: _Served, lfs: bool,
           want: Optional[str], what: str, cancel: threading.Event,
           progress: Optional[Callable[[DownloadProgress], None]]) -> Path:
    """Fetch (or resume) the blob, check it, and link it into the snapshot; every path stays in `cache`."""
    from huggingface_hub.utils import WeakFileLock

    size = served.size
    # Checked here and again at each write; the paths handed back keep the cache's own spelling.
    blob = storage / "blobs" / served.etag
    pointer = storage / "snapshots" / served.commit / filename
    inside(cache, blob)
    inside(cache, pointer)
    if revision != served.commit:
        _write_ref(cache, storage, revision, served.commit)
    if pointer.exists():
        return pointer
    if blob.exists():
        _link(cache, blob, pointer)
        return pointer

    partial = inside(cache, blob.with_name(blob.name + ".incomplete"))
    lock = inside(cache, cache / ".locks" / storage.name / f"{served.etag}.lock")
    inside(cache, lock.parent).mkdir(parents=True, exist_ok=True)
    inside(cache, blob.parent).mkdir(parents=True, exist_ok=True)
    with WeakFileLock(str(lock)):
        done, checksum = _resume_state(partial, size, lfs)
        folder, free = _free_bytes(blob.parent)
        if free < size - done:
            raise SpecDeskError(f"{what}: not enough disk space: it needs {human_bytes(size - done)} more, "
                                f"{folder} has {human_bytes(free)} free (the disk is full); free some space "
                                f"or set HF_HUB_CACHE to a bigger disk")
        if done < size:
            done, checksum = _fetch(served.url, what, partial, done, size, checksum, cancel,
                                    lambda n, start: progress and progress(
                                        DownloadProgress(repo_id, filename, n, size, start)))
        actual = checksum.hexdigest()
        if want and actual != want:
            partial.unlink(missing_ok=True)
            kind = "sha256" if lfs else "git blob id"
            raise SpecDeskError(f"{what}: checksum mismatch: the {kind} of what arrived is {actual[:16]}…, the hub "
                                f"says {want[:16]}…; the corrupt download was deleted, download it again")
        os.chmod(partial, 0o644)
        os.replace(partial, blob)
    _link(cache, blob, pointer)
    return pointer


def _fetch(url: str, what: str, partial: Path, done: int, size: int, checksum: _Checksum,
           cancel: threading.Event, report: Callable[[int, int], None]) -> tuple[int, _Checksum]:
    """Append the missing bytes to the partial file, never past `size`; a cancel keeps it, a full disk removes it."""
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_stream_backoff

    headers = build_hf_headers()
    if urlparse(url).netloc != urlparse(endpoint()).netloc:
        headers.pop("authorization", None)  # a CDN URL is signed; the token stays on the hub
    if done:
        headers["Range"] = f"bytes={done}-"
    start = done
    try:
        # No retry on exceptions: one raised while reading the body would be thrown into the retrying
        # generator, which cannot yield a second response (RuntimeError); a new download resumes instead.
        with http_stream_backoff("GET", url, headers=headers, timeout=TIMEOUT_S, follow_redirects=True,
                                 retry_on_exceptions=(), retry_on_status_codes=(408, 429)) as response:
            hf_raise_for_status(response)
            mode = "ab"
            if done and response.status_code == 200:  # the server ignored Range: start over
                done, start, checksum, mode = 0, 0, _Checksum(checksum.lfs, size), "wb"
            _refuse_announced_overlong(what, response, size - done)
            report(done, start)
            with open(partial, mode) as out:
                for chunk in response.iter_bytes():
                    if cancel.is_set():
                        raise DownloadCancelled(f"{what}: download cancelled at {human_bytes(done)} of "
                                                f"{human_bytes(size)}; download it again to resume from there")
                    room = size - done
                    if len(chunk) > room:  # a close-delimited or lying body: keep what fits, not a byte more
                        out.write(chunk[:room])
                        checksum.update(chunk[:room])
                        raise SpecDeskError(f"{what}: the server sent more than the {size} bytes the hub listed; "
                                            f"the transfer was cut off at {size} bytes; check HF_ENDPOINT, then "
                                            f"download again (the checksum decides)")
                    out.write(chunk)
                    checksum.update(chunk)
                    done += len(chunk)
                    report(done, start)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            partial.unlink(missing_ok=True)
            raise SpecDeskError(f"{what}: the disk is full ({partial.parent}): the partial file was removed; "
                                f"free some space or set HF_HUB_CACHE to a bigger disk, then download again") from e
        raise SpecDeskError(f"{what}: cannot write {partial}: {e.strerror or e}") from e
    except (DownloadCancelled, SpecDeskError):
        raise
    except _hub_errors() as e:
        raise _explain(e, f"{what} (the download stopped at {human_bytes(done)}; download again to resume)") from e
    if done != size:
        raise SpecDeskError(f"{what}: the connection ended at {human_bytes(done)} of {human_bytes(size)}; "
                            f"download it again to resume")
    return done, checksum


def _refuse_announced_overlong(what: str, response, expected: int) -> None:
    """A Content-Length beyond the missing bytes is refused before a byte is written.

    Only for an unencoded body: a compressed one's length is not the file's (the hub gzips text files).
    """
    length = response.headers.get("Content-Length")
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if length and length.strip().isdigit() and encoding in ("", "identity") and int(length) > expected:
        raise SpecDeskError(f"{what}: the server announced {int(length)} bytes where {expected} were expected; "
                            f"nothing was written; check HF_ENDPOINT")


def download_files(repo_id: str, filenames: list[str], revision: str = "main", cache_dir: Optional[Path] = None,
                   cancel: Optional[threading.Event] = None,
                   progress: Optional[Callable[[DownloadProgress], None]] = None) -> list[Path]:
    """Several files of one repository; with no names, its GGUF files (or all of a checkpoint)."""
    check_repo_id(repo_id)
    check_revision(revision)
    for name in filenames:
        check_filename(name)
    if not filenames:
        files = list_files(repo_id, revision)
        filenames = [f.path for f in files if f.is_gguf] or [f.path for f in files]
    return [download(repo_id, name, revision, cache_dir, cancel, progress) for name in filenames]
