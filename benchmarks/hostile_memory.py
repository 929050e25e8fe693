"""Peak memory under hostile peers: the served-engine client against servers that send too
much, and `specdesk serve` (with its engine process) against clients that do.

The bars (docs/security.md): under 500 MB for the client, under 1 GB for serve plus its
engine, whatever the peer sends. Prints one JSON line per case:

- {"side": "client", "case", "outcome", "seconds", "peak_rss_mb"}: the client
  (app/serving/endpoint.Endpoint) runs in a fresh child process against a raw-socket server
  of this process; its peak resident size is the child's own (getrusage).
- {"side": "serve", "case", "outcome", "seconds", "serve_peak_mb", "engine_peak_mb",
  "total_peak_mb"}: one real `specdesk serve` on the demo target for all cases; before each
  case the peak of the server and of its engine process is reset (/proc/PID/clear_refs),
  after it their peaks (VmHWM, sampled while the case runs so an engine that is replaced
  counts too) are read; the total is the sum of the peaks, a bound on the peak of the sum.
  The server runs with at most 1,024 open files (`ulimit -n 1024`), as the issue's case of
  1,100 half-open connections asks.

Linux only (/proc). Usage: python benchmarks/hostile_memory.py [--side client|serve|both]
[--seconds 30] [--target FILE]. --seconds is how long the timed cases run (64 KiB chunks, a
body that never ends); the suite (tests/test_hostile_memory.py) runs the same cases shorter.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

GIB = 2**30
MIB = 2**20
CHAT = [{"role": "user", "content": "Write a function that parses command line arguments."}]
MODELS = {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "someone"}]}


# --- peak resident size -------------------------------------------------------------------
def status_kib(pid: int, field: str) -> Optional[int]:
    """A size field of /proc/PID/status (VmHWM: peak resident, VmRSS: now) in KiB; None if gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def reset_peak(pid: int) -> None:
    """Set the process's peak resident size (VmHWM) back to what it holds now."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        pass


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for child in children(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


class TreePeak:
    """Peak resident size of a process and of each of its descendants, sampled from a thread
    (a descendant that ends keeps the last peak seen). `with` starts from the sizes held now."""

    def __init__(self, pid: int, every_s: float = 0.05):
        self.pid, self.every_s = pid, every_s
        self.peaks: dict[int, int] = {}
        self._stop = threading.Event()

    def sample(self) -> None:
        for pid in [self.pid, *descendants(self.pid)]:
            kib = status_kib(pid, "VmHWM")
            if kib is not None:
                self.peaks[pid] = max(self.peaks.get(pid, 0), kib)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def __enter__(self) -> "TreePeak":
        for pid in [self.pid, *descendants(self.pid)]:
            reset_peak(pid)
        self.sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def figures(self) -> dict:
        own = self.peaks.get(self.pid, 0)
        others = sum(kib for pid, kib in self.peaks.items() if pid != self.pid)
        return {"serve_peak_mb": round(own / 1024, 1), "engine_peak_mb": round(others / 1024, 1),
                "total_peak_mb": round((own + others) / 1024, 1)}


# --- hostile servers, for the client --------------------------------------------------------
def sse(text: str) -> bytes:
    return f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': text}}]})}\n\n".encode()


STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"


def sse_line(seconds: float) -> Iterator[bytes]:
    """One server-sent-events line of 1 GiB (it never ends before that)."""
    yield STREAM_HEAD + b"data: "
    piece = b"x" * 65536
    for _ in range(GIB // len(piece)):
        yield piece


def endless_stream(seconds: float) -> Iterator[bytes]:
    """Small events without end (up to 1 GiB), as fast as the client reads."""
    yield STREAM_HEAD
    event = sse("y" * 256)
    for _ in range(GIB // len(event)):
        yield event


def chunks_64k(seconds: float) -> Iterator[bytes]:
    """An event of 64 KiB of text after another, for `seconds`."""
    yield STREAM_HEAD
    event = sse("z" * 65536)
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        yield event


def trickle(seconds: float) -> Iterator[bytes]:
    """One byte a second, never a whole line."""
    yield STREAM_HEAD
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        yield b"x"
        time.sleep(1.0)


def json_reply_1gib(seconds: float) -> Iterator[bytes]:
    """A reply that is one JSON document of 1 GiB, with its length announced."""
    head = b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": "'
    yield (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
           + f"Content-Length: {GIB}\r\n\r\n".encode() + head)
    piece = b"w" * 65536
    for _ in range((GIB - len(head)) // len(piece)):
        yield piece


def deep_json_event(seconds: float) -> Iterator[bytes]:
    """An event whose JSON is nested 500,000 deep (within the 1 MiB line limit)."""
    yield STREAM_HEAD + b"data: " + b"[" * 500_000 + b"]" * 500_000 + b"\n\n"


CHAT_REPLIES: dict[str, Callable[[float], Iterator[bytes]]] = {
    "sse_line_1gib": sse_line, "endless_stream": endless_stream, "chunks_64k": chunks_64k, "trickle": trickle,
    "json_reply_1gib": json_reply_1gib, "deep_json_event": deep_json_event}
CLIENT_CASES = (*CHAT_REPLIES, "models_1gib")
# the tokens a case's client asks for: as many as a client may, except where the deadline the
# tokens set is the bound under test
MAX_TOKENS = {"trickle": 4}


class HostileServer:
    """A loopback server: /v1/models answers a model list (or 1 GiB of one, for models_1gib),
    /metrics 404, chat completions what the case writes, until the client hangs up."""

    def __init__(self, case: str, seconds: float):
        self.case, self.seconds = case, seconds
        self.sent = 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _answer(self, path: str) -> Iterator[bytes]:
        if path == "/v1/models" and self.case == "models_1gib":
            head = b'{"object": "list", "data": [{"id": "m", "pad": "'
            yield (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                   + f"Content-Length: {GIB}\r\n\r\n".encode() + head)
            for _ in range(GIB // 65536):
                yield b"p" * 65536
        elif path == "/v1/models":
            body = json.dumps(MODELS).encode()
            yield (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                   + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        elif path == "/v1/chat/completions" and self.case in CHAT_REPLIES:
            yield from CHAT_REPLIES[self.case](self.seconds)
        else:
            yield b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    more = conn.recv(65536)
                    if not more:
                        return
                    data += more
                head, _, body = data.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                length = next((int(v) for k, v in (line.split(":", 1) for line in lines[1:])
                               if k.strip().lower() == "content-length"), 0)
                while len(body) < length:
                    body += conn.recv(65536)
                for piece in self._answer(lines[0].split()[1]):
                    conn.sendall(piece)
                    self.sent += len(piece)
            except OSError:  # the client hung up: the end of every case
                pass

    def close(self) -> None:
        self.server.close()


CLIENT_CHILD = """
import json, sys, time
from specdesk.app.serving.endpoint import Endpoint, EndpointError
url, max_tokens, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
started = time.monotonic()
try:
    run = Endpoint(url, timeout=timeout).chat({chat}, max_tokens=max_tokens)
    outcome = f"{{run.result.finish_reason}}: {{len(run.result.text)}} characters"
    outcome += f" ({{run.note}})" if run.note else ""
except EndpointError as e:
    outcome = str(e)
# This process's own peak (VmHWM starts afresh at exec; ru_maxrss would also count the parent's
# pages at the fork before it: a large test process would read as this client's peak).
with open("/proc/self/status") as status:
    peak_kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
print(json.dumps({{"outcome": outcome, "seconds": round(time.monotonic() - started, 2),
                  "peak_rss_mb": round(peak_kb / 1024, 1)}}))
""".format(chat=repr(CHAT))


def client_case(case: str, seconds: float = 30.0, timeout: float = 10.0) -> dict:
    """The client in a fresh child process against one hostile server: its outcome and peak."""
    max_tokens = MAX_TOKENS.get(case, 2**31 - 1)
    server = HostileServer(case, seconds)
    try:
        child = subprocess.run([sys.executable, "-c", CLIENT_CHILD, server.url, str(max_tokens), str(timeout)],
                               capture_output=True, text=True, timeout=seconds + 600)
    finally:
        server.close()
    if child.returncode != 0 or not child.stdout.strip():
        raise RuntimeError(f"client case {case}: exit status {child.returncode}\n{child.stderr[-3000:]}")
    return {"side": "client", "case": case, **json.loads(child.stdout.strip().splitlines()[-1]),
            "server_sent_mb": round(server.sent / MIB, 1)}


# --- hostile clients, for serve --------------------------------------------------------------
def open_files(limit: int) -> Callable[[], None]:
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    return set_limit


def start_serve(target: str, *options: str, open_files_limit: Optional[int] = 1024) -> tuple[subprocess.Popen, str]:
    """`specdesk serve` on a free loopback port: (process, base URL without /v1)."""
    child = subprocess.Popen([sys.executable, "-m", "specdesk.app.main", "serve", "--port", "0", "--target", target,
                              "--method", "none", "--threads", "1", *options],
                             stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                             preexec_fn=open_files(open_files_limit) if open_files_limit else None)
    lines: list[str] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and child.poll() is None:
        if select.select([child.stderr], [], [], 1.0)[0]:
            lines.append(child.stderr.readline())
            match = re.search(r"at (http://\S+)/v1", lines[-1])
            if match:
                return child, match.group(1)
    child.kill()
    raise RuntimeError("specdesk serve did not start:\n" + "".join(lines))


def stop_serve(child: subprocess.Popen) -> str:
    """Ctrl-C, then what it wrote on stderr since it started serving."""
    child.send_signal(signal.SIGINT)
    try:
        return child.communicate(timeout=30)[1]
    except subprocess.TimeoutExpired:
        child.kill()
        return child.communicate()[1]


def address(base: str) -> tuple[str, int]:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def answer_status(sock: socket.socket, timeout: float = 60) -> str:
    """The status line of an HTTP answer, or how the connection ended without one."""
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\r\n" not in data:
            more = sock.recv(65536)
            if not more:
                return "closed without an answer" if not data else data.decode("latin-1")[:80]
            data += more
    except ConnectionResetError:
        return "reset"
    except socket.timeout:
        return f"no answer within {timeout:g} s"
    return data.split(b"\r\n", 1)[0].decode("latin-1")


def post_head(path: str, length: Optional[int]) -> bytes:
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{framing}\r\n\r\n").encode()


def send_body(base: str, path: str, body: bytes, chunked: bool = False) -> str:
    """POST a body as it is (all of it, as long as the server reads) and give the status line."""
    with socket.create_connection(address(base), timeout=60) as s:
        s.sendall(post_head(path, None if chunked else len(body)))
        try:
            step = 65536
            for i in range(0, len(body), step):
                piece = body[i:i + step]
                s.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece)
            if chunked:
                s.sendall(b"0\r\n\r\n")
        except OSError:  # the server refused before the end and closed
            pass
        return answer_status(s)


def get_models_s(base: str, timeout: float = 30) -> tuple[str, float]:
    started = time.monotonic()
    with socket.create_connection(address(base), timeout=timeout) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status = answer_status(s, timeout)
    return status, time.monotonic() - started


def prompt_body(model: str, body_bytes: int) -> bytes:
    """A completion request of about body_bytes, nearly all of it prompt (no character of it
    escaped in JSON, so the body's size is the prompt's)."""
    line = "def parse(argv): return [a.strip() for a in argv]; "
    head = json.dumps({"model": model, "max_tokens": 16, "prompt": ""}).encode()
    prompt = line * ((body_bytes - len(head)) // len(line))
    return json.dumps({"model": model, "max_tokens": 16, "prompt": prompt}).encode()


def case_prompt_50mb(base: str, model: str, seconds: float) -> str:
    return send_body(base, "/v1/completions", prompt_body(model, 50 * 10**6))


def case_prompt_50mb_chunked(base: str, model: str, seconds: float) -> str:
    return send_body(base, "/v1/completions", prompt_body(model, 50 * 10**6), chunked=True)


def case_prompt_under_body_limit(base: str, model: str, seconds: float) -> str:
    """A prompt just under the 8 MiB body limit: refused by its length before tokenizing."""
    return send_body(base, "/v1/completions", prompt_body(model, 8 * MIB - 1024))


def case_deep_json(base: str, model: str, seconds: float) -> str:
    return send_body(base, "/v1/completions", b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")


def case_chunks_64k(base: str, model: str, seconds: float) -> str:
    """A chunked body of 64 KiB chunks, sent for `seconds` or until the server answers."""
    with socket.create_connection(address(base), timeout=60) as s:
        s.sendall(post_head("/v1/completions", None) + b'a0\r\n{"prompt": "' + b"x" * 148 + b"\r\n")
        chunk = b"10000\r\n" + b"x" * 65536 + b"\r\n"
        ends, sent = time.monotonic() + seconds, 0
        try:
            while time.monotonic() < ends:
                if select.select([s], [], [], 0)[0]:
                    break  # the server answered (or closed)
                s.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        return f"{answer_status(s)} after {sent / MIB:.0f} MiB"


def case_header_1gib(base: str, model: str, seconds: float) -> str:
    """A header line that goes on (up to 1 GiB, or `seconds`)."""
    with socket.create_connection(address(base), timeout=60) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Pad: ")
        ends, sent = time.monotonic() + seconds, 0
        try:
            while sent < GIB and time.monotonic() < ends:
                if select.select([s], [], [], 0)[0]:
                    break
                s.sendall(b"p" * 65536)
                sent += 65536
        except OSError:
            pass
        return f"{answer_status(s)} after {sent / MIB:.1f} MiB"


def raise_open_files(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard) if hard != resource.RLIM_INFINITY else wanted,
                                                    hard))


def case_half_open(base: str, model: str, seconds: float, count: int = 1100) -> str:
    """`count` connections that send a request line and stop, held while /v1/models is asked."""
    raise_open_files(count + 256)
    held = []
    try:
        for _ in range(count):
            s = socket.create_connection(address(base), timeout=30)
            s.sendall(b"GET /v1/models HTTP/1.1\r\n")
            held.append(s)
        answers = []
        for _ in range(3):
            answers.append(get_models_s(base))
            time.sleep(0.5)
        statuses = ", ".join(sorted({status for status, _ in answers}))
        return f"/v1/models with {count} held: {statuses} in {', '.join(f'{t:.2f}' for _, t in answers)} s"
    finally:
        for s in held:
            s.close()


def case_abandoned(base: str, model: str, seconds: float, count: int = 20) -> str:
    """`count` non-streamed requests for many tokens, abandoned by their clients; then how long
    the next client waits for a short reply."""
    body = json.dumps({"model": model, "prompt": "import os\n", "max_tokens": 4096, "temperature": 0}).encode()
    sockets = []
    for _ in range(count):
        s = socket.create_connection(address(base), timeout=30)
        s.sendall(post_head("/v1/completions", len(body)) + body)
        sockets.append(s)
    time.sleep(0.5)
    for s in sockets:
        s.close()
    started = time.monotonic()
    short = json.dumps({"model": model, "prompt": "import os\n", "max_tokens": 8, "temperature": 0}).encode()
    status = send_body(base, "/v1/completions", short)
    return f"next client: {status} in {time.monotonic() - started:.1f} s"


def case_unread_stream(base: str, model: str, seconds: float) -> str:
    """A streamed request for many tokens whose client never reads the answer, for `seconds`."""
    body = json.dumps({"model": model, "prompt": "import os\n", "max_tokens": 100_000, "stream": True,
                       "temperature": 0}).encode()
    with socket.create_connection(address(base), timeout=30) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(post_head("/v1/completions", len(body)) + body)
        time.sleep(seconds)
    return f"held unread for {seconds:g} s"


SERVE_CASES: dict[str, Callable[[str, str, float], str]] = {
    "prompt_50mb": case_prompt_50mb, "prompt_50mb_chunked": case_prompt_50mb_chunked,
    "prompt_under_body_limit": case_prompt_under_body_limit, "deep_json": case_deep_json,
    "chunks_64k": case_chunks_64k, "header_1gib": case_header_1gib, "half_open_1100": case_half_open,
    "abandoned_20": case_abandoned, "unread_stream": case_unread_stream}


def serve_case(child: subprocess.Popen, base: str, model: str, case: str, seconds: float) -> dict:
    """One case against a running serve (model: the id it serves), with the peaks it caused."""
    started = time.monotonic()
    with TreePeak(child.pid) as peak:
        outcome = SERVE_CASES[case](base, model, seconds)
        time.sleep(0.5)  # what the server does after the answer counts too
    return {"side": "serve", "case": case, "outcome": outcome, "seconds": round(time.monotonic() - started, 2),
            **peak.figures()}


def default_target() -> str:
    """The demo target the app ships (derived into the cache on first use)."""
    from specdesk.app.demo.install import build_family

    return build_family()["target_gguf"]


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=("client", "serve", "both"), default="both")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long timed cases run (default 30)")
    parser.add_argument("--target", help="the model serve loads (default: the demo target)")
    parser.add_argument("--case", action="append", help="only these cases (repeatable)")
    args = parser.parse_args(argv)
    if not Path("/proc/self/status").exists():
        print("hostile_memory: needs Linux's /proc", file=sys.stderr)
        return 2
    if args.side in ("client", "both"):
        for case in CLIENT_CASES:
            if not args.case or case in args.case:
                print(json.dumps(client_case(case, args.seconds)), flush=True)
    if args.side in ("serve", "both"):
        target = args.target or default_target()
        child, base = start_serve(target)
        try:
            time.sleep(1.0)
            for case in SERVE_CASES:
                if not args.case or case in args.case:
                    print(json.dumps(serve_case(child, base, Path(target).stem, case, args.seconds)), flush=True)
        finally:
            err = stop_serve(child)
        print(json.dumps({"side": "serve", "case": "stderr", "lines": len(err.splitlines()),
                          "tracebacks": err.count("Traceback"), "last": err.splitlines()[-3:]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
