"""A local HTTP server that speaks the part of the Hugging Face Hub API huggingface_hub uses.

Endpoints (as on huggingface.co):
- GET /api/models?search=&author=&filter=&limit=           model search
- GET /api/models/{repo}[/revision/{rev}][?blobs=true]     model info with siblings (sizes, LFS sha256)
- GET /api/models/{repo}/tree/{rev}[/{path}]               file listing with sizes and LFS sha256
- HEAD/GET /{repo}/resolve/{rev}/{file}                    ETag, X-Repo-Commit; LFS files redirect (302)
                                                           to a CDN URL on another origin with
                                                           X-Linked-Etag / X-Linked-Size, as the hub does
- GET /cdn/{sha256}                                        the LFS content, with Range (206) support
A renamed repository answers 307 with a relative Location; private repositories need
`Authorization: Bearer <token>`. Every request is logged (method, path, Range, bytes sent),
so tests can prove what was (not) fetched. `throttle` slows the body to make cancels land
mid-file; `corrupt` flips one byte of a file's body.

Hostile modes, for tests of what a client trusts: `fake_commit`, `fake_etag` and
`fake_location` replace X-Repo-Commit, the ETag (X-Linked-Etag for LFS files) and the CDN
redirect of every resolve answer, `fake_size` the X-Linked-Size of LFS files; `overlong`
sends each GET body that many times over, with no Content-Length (ended by closing the
connection) unless `overlong_length` is set; `hang_up_at` closes the connection after that
many bytes of a body it promised in full.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional
from urllib.parse import parse_qs, quote, unquote, urlparse

LFS_SUFFIXES = (".gguf", ".safetensors", ".bin")
CHUNK = 16 * 1024


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # a client that cancelled or was killed mid-transfer
        super().handle_error(request, client_address)


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class RepoFile:
    path: str
    data: bytes = b""
    claimed_size: Optional[int] = None  # a size advertised without content (free-disk tests)

    @property
    def size(self) -> int:
        return self.claimed_size if self.claimed_size is not None else len(self.data)

    @property
    def lfs(self) -> bool:
        return self.path.endswith(LFS_SUFFIXES)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest() if self.claimed_size is None else "f" * 64

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else git_blob_sha1(self.data)


@dataclass
class Repo:
    repo_id: str
    files: dict[str, RepoFile]
    commit: str
    private: bool = False
    tags: list = field(default_factory=list)
    downloads: int = 0

    def info(self, blobs: bool) -> dict:
        siblings = []
        for f in self.files.values():
            sibling = {"rfilename": f.path}
            if blobs:
                sibling.update(size=f.size, blobId=git_blob_sha1(f.data))
                if f.lfs:
                    sibling["lfs"] = {"size": f.size, "sha256": f.sha256, "pointerSize": 134}
            siblings.append(sibling)
        author = self.repo_id.split("/")[0]
        return {"_id": self.commit[:24], "id": self.repo_id, "modelId": self.repo_id, "author": author,
                "sha": self.commit, "private": self.private, "gated": False, "disabled": False,
                "downloads": self.downloads, "likes": 0, "tags": list(self.tags), "library_name":
                "gguf" if "gguf" in self.tags else "transformers", "lastModified": "2026-01-01T00:00:00.000Z",
                "createdAt": "2026-01-01T00:00:00.000Z", "siblings": siblings}


@dataclass
class LoggedRequest:
    method: str
    path: str
    range: Optional[str]
    sent: int  # body bytes written
    authorization: Optional[str]


class HubServer:
    """Start with `with HubServer() as hub:`; hub.url is the endpoint (HF_ENDPOINT)."""

    def __init__(self, token: Optional[str] = None):
        self.repos: dict[str, Repo] = {}
        self.aliases: dict[str, str] = {}  # old repo id -> new (renamed repositories)
        self.token = token
        self.log: list[LoggedRequest] = []
        self.throttle_s: float = 0.0  # pause after each CHUNK of a body
        # A body stops at this offset until `released` is set: a test can kill or cancel a client
        # mid-transfer however slow or loaded the machine is.
        self.hold_at: Optional[int] = None
        self.released = threading.Event()
        self.corrupt: set[str] = set()  # "repo/path" whose body gets one byte flipped
        self.fake_commit: Optional[str] = None
        self.fake_etag: Optional[str] = None
        self.fake_location: Optional[str] = None
        self.overlong: int = 0
        self.overlong_length: bool = False
        self.hang_up_at: Optional[int] = None
        self.fake_size: Optional[int] = None
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), self._handler())
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.cdn_url = f"http://localhost:{self.port}"  # another origin, as the hub's CDN is
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="hub-server",
                                        daemon=True)

    def __enter__(self) -> "HubServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def add_repo(self, repo_id: str, files: dict[str, bytes | int], private: bool = False,
                 tags: Optional[list] = None, downloads: int = 0) -> Repo:
        entries = {}
        for path, content in files.items():
            entries[path] = (RepoFile(path, claimed_size=content) if isinstance(content, int)
                             else RepoFile(path, bytes(content)))
        commit = hashlib.sha1(repo_id.encode() + b"".join(sorted(p.encode() for p in files))).hexdigest()
        repo = Repo(repo_id, entries, commit, private, list(tags or []), downloads)
        self.repos[repo_id] = repo
        return repo

    def requests(self, method: Optional[str] = None, contains: str = "") -> list[LoggedRequest]:
        with self._lock:
            return [r for r in self.log if (method is None or r.method == method) and contains in r.path]

    def bytes_sent(self, contains: str = "") -> int:
        return sum(r.sent for r in self.requests("GET", contains))

    # --- handler ------------------------------------------------------------------
    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                self._dispatch(head=True)

            def do_GET(self) -> None:
                self._dispatch(head=False)

            # -- plumbing --
            def _dispatch(self, head: bool) -> None:
                self._sent = 0
                url = urlparse(self.path)
                try:
                    self._route(unquote(url.path), parse_qs(url.query), head)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client cancelled
                finally:
                    with hub._lock:
                        hub.log.append(LoggedRequest(self.command, self.path, self.headers.get("Range"),
                                                     self._sent, self.headers.get("Authorization")))

            def _json(self, payload, status: int = 200, headers: Optional[dict] = None) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                    self._sent += len(body)

            def _error(self, status: int, code: str, message: str, commit: Optional[str] = None) -> None:
                headers = {"X-Error-Code": code, "X-Error-Message": message}
                if commit:
                    headers["X-Repo-Commit"] = commit
                self._json({"error": message}, status, headers)

            def _repo(self, repo_id: str) -> Optional[Repo]:
                repo = hub.repos.get(repo_id)
                if repo is None:
                    self._error(404, "RepoNotFound", "Repository not found")
                    return None
                if repo.private and self.headers.get("Authorization") != f"Bearer {hub.token}":
                    self._error(401, "RepoNotFound", "Invalid credentials in Authorization header")
                    return None
                return repo

            def _route(self, path: str, query: dict, head: bool) -> None:
                if path == "/api/models":
                    return self._search(query)
                m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path)
                if m:
                    return self._tree(m.group(1), m.group(3) or "", query)
                m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
                if m:
                    repo = self._repo(m.group(1))
                    if repo:
                        self._json(repo.info(query.get("blobs", ["false"])[0].lower() == "true"))
                    return
                m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
                if m:
                    return self._resolve(m.group(1), m.group(2), m.group(3), head)
                m = re.fullmatch(r"/cdn/([0-9a-f]{64})/(.+)", path)
                if m:
                    return self._cdn(m.group(1), m.group(2), head)
                self._error(404, "NotFound", f"no route for {path}")

            def _search(self, query: dict) -> None:
                text = query.get("search", [""])[0].lower()
                author = query.get("author", [None])[0]
                filters = query.get("filter", [])
                limit = int(query.get("limit", ["1000"])[0])
                found = []
                for repo in sorted(hub.repos.values(), key=lambda r: -r.downloads):
                    if repo.private and self.headers.get("Authorization") != f"Bearer {hub.token}":
                        continue
                    if text and text not in repo.repo_id.lower():
                        continue
                    if author and repo.repo_id.split("/")[0] != author:
                        continue
                    if any(f not in repo.tags for f in filters):
                        continue
                    info = repo.info(blobs=False)
                    if "full" not in query:
                        info.pop("siblings")
                    found.append(info)
                self._json(found[:limit])

            def _tree(self, repo_id: str, prefix: str, query: dict) -> None:
                repo = self._repo(repo_id)
                if repo is None:
                    return
                recursive = query.get("recursive", ["false"])[0].lower() == "true"
                prefix = prefix.strip("/")
                entries, folders = [], set()
                for f in repo.files.values():
                    if prefix and not f.path.startswith(prefix + "/"):
                        continue
                    rest = f.path[len(prefix) + 1:] if prefix else f.path
                    if "/" in rest and not recursive:
                        folders.add((prefix + "/" if prefix else "") + rest.split("/")[0])
                        continue
                    entry = {"type": "file", "oid": git_blob_sha1(f.data), "size": f.size, "path": f.path}
                    if f.lfs:
                        entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
                    entries.append(entry)
                dirs = [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in sorted(folders)]
                self._json(dirs + entries)

            def _resolve(self, repo_id: str, revision: str, filename: str, head: bool) -> None:
                if repo_id in hub.aliases:  # renamed: relative redirect, followed by huggingface_hub
                    self.send_response(307)
                    self.send_header("Location", f"/{hub.aliases[repo_id]}/resolve/{revision}/{quote(filename)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                repo = self._repo(repo_id)
                if repo is None:
                    return
                if revision not in ("main", repo.commit):
                    return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                f = repo.files.get(filename)
                if f is None:
                    return self._error(404, "EntryNotFound", f"{filename} does not exist", repo.commit)
                commit = hub.fake_commit if hub.fake_commit is not None else repo.commit
                if f.lfs:
                    location = f"{hub.cdn_url}/cdn/{f.sha256}/{quote(f.path)}?repo={repo_id}"
                    self.send_response(302)
                    self.send_header("Location", hub.fake_location if hub.fake_location is not None else location)
                    self.send_header("X-Repo-Commit", commit)
                    self.send_header("X-Linked-Etag", f'"{hub.fake_etag or f.sha256}"')
                    self.send_header("X-Linked-Size", str(hub.fake_size if hub.fake_size is not None else f.size))
                    self.send_header("ETag", f'"{git_blob_sha1(f.data)}"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self._body(f, head, {"X-Repo-Commit": commit, "ETag": f'"{hub.fake_etag or f.etag}"'},
                           f"{repo_id}/{f.path}")

            def _cdn(self, sha256: str, name: str, head: bool) -> None:
                for repo in hub.repos.values():
                    for f in repo.files.values():
                        if f.lfs and f.sha256 == sha256 and f.claimed_size is None:
                            return self._body(f, head, {"ETag": f'"{sha256}"'}, f"{repo.repo_id}/{f.path}")
                self._error(404, "EntryNotFound", "no such object")

            def _body(self, f: RepoFile, head: bool, headers: dict, key: str) -> None:
                data = f.data
                if key in hub.corrupt and data:
                    middle = len(data) // 2
                    data = data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]
                if (hub.overlong or hub.hang_up_at is not None) and not head:
                    return self._hostile_body(data, headers)
                start, end, status = 0, len(data), 200
                requested = self.headers.get("Range")
                if requested:
                    m = re.fullmatch(r"bytes=(\d+)-(\d*)", requested.strip())
                    if m:
                        start = int(m.group(1))
                        end = int(m.group(2)) + 1 if m.group(2) else len(data)
                        if start >= len(data) and len(data):
                            self.send_response(416)
                            self.send_header("Content-Range", f"bytes */{len(data)}")
                            self.send_header("Content-Length", "0")
                            self.end_headers()
                            return
                        status = 206
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(end - start))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
                self.end_headers()
                if head:
                    return
                for offset in range(start, end, CHUNK):
                    if hub.hold_at is not None and offset >= hub.hold_at:
                        hub.released.wait(120)
                    piece = data[offset:min(end, offset + CHUNK)]
                    self.wfile.write(piece)
                    self.wfile.flush()
                    self._sent += len(piece)
                    if hub.throttle_s:
                        time.sleep(hub.throttle_s)

            def _hostile_body(self, data: bytes, headers: dict) -> None:
                """The whole file, `overlong` times over or cut at `hang_up_at`; Range is ignored."""
                self.send_response(200)
                for k, v in headers.items():
                    self.send_header(k, v)
                if hub.overlong:
                    data = data * hub.overlong
                if hub.overlong_length or hub.hang_up_at is not None:
                    self.send_header("Content-Length", str(len(data)))
                if not hub.overlong_length:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                if hub.hang_up_at is not None:
                    data = data[:hub.hang_up_at]
                for offset in range(0, len(data), CHUNK):
                    piece = data[offset:offset + CHUNK]
                    self.wfile.write(piece)
                    self.wfile.flush()
                    self._sent += len(piece)

        return Handler
