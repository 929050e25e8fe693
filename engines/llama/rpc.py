"""llama.cpp's RPC backend: layers on a device that another process (or machine) serves.

A client adds servers as llama.cpp's `--rpc HOST:PORT[,HOST:PORT]` does (common/arg.cpp):
ggml_backend_rpc_add_server through the RPC registry's proc address, then
ggml_backend_register; each server's devices then appear in ggml's device list
(devices.llama_devices) as "RPC0", "RPC1" ... and are placed like any other device.

ggml ends the process when a server does not answer (GGML_ABORT in the RPC client), so every
address is first checked here, in Python, with the protocol's own HELLO and DEVICE_COUNT
commands: a dead or foreign address is one SpecDeskError, never an abort.

`RpcServer` serves this machine's CPU device from a child process
(ggml_backend_rpc_start_server): the offload device of machines without a GPU, and of tests.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import socket
import struct
import tempfile
import threading
import time
from typing import Optional

from ..types import SpecDeskError

RPC_PROTO_MAJOR = 7  # ggml-rpc.h RPC_PROTO_MAJOR_VERSION of the pinned llama.cpp
RPC_CMD_HELLO = 14
RPC_CMD_DEVICE_COUNT = 15
RPC_CONN_CAPS_SIZE = 24  # ggml-rpc/transport.h
PROBE_TIMEOUT_S = 3.0

_added: dict[str, int] = {}  # endpoint -> its device count, once added in this process
_add_lock = threading.Lock()


def parse_endpoints(text: str) -> list[str]:
    """"HOST:PORT[,HOST:PORT]" -> ["HOST:PORT", ...]; a malformed address is one line naming it."""
    endpoints = []
    for raw in (text or "").split(","):
        endpoint = raw.strip()
        if not endpoint:
            continue
        host, sep, port = endpoint.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise SpecDeskError(f"--rpc {endpoint!r} is not HOST:PORT (e.g. 127.0.0.1:50052): "
                                "give the address an RPC server listens on")
        endpoints.append(endpoint)
    if text and text.strip() and not endpoints:
        raise SpecDeskError(f"--rpc {text!r} names no server: give HOST:PORT[,HOST:PORT]")
    return endpoints


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the server closed the connection")
        data += chunk
    return data


def _command(sock: socket.socket, cmd: int, payload: bytes, reply_size: int) -> bytes:
    """One request (| cmd: 1 byte | size: u64 | payload |) and its reply (| size: u64 | data |)."""
    sock.sendall(bytes([cmd]) + struct.pack("<Q", len(payload)) + payload)
    size = struct.unpack("<Q", _recv_exact(sock, 8))[0]
    if size != reply_size:
        raise ConnectionError(f"a reply of {size} bytes where {reply_size} were expected")
    return _recv_exact(sock, size)


def probe(endpoint: str, timeout_s: float = PROBE_TIMEOUT_S) -> int:
    """How many devices the RPC server at `endpoint` serves; one line when it does not answer,
    answers with another protocol, or is busy (a server serves one client at a time)."""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            hello = _command(sock, RPC_CMD_HELLO, bytes(RPC_CONN_CAPS_SIZE), 4 + RPC_CONN_CAPS_SIZE)
            major, minor, patch = hello[0], hello[1], hello[2]
            if major != RPC_PROTO_MAJOR:
                raise SpecDeskError(f"--rpc {endpoint}: the server speaks RPC protocol {major}.{minor}.{patch}, "
                                    f"this llama.cpp speaks {RPC_PROTO_MAJOR}.x: run an rpc-server of the same "
                                    "llama.cpp version")
            count = struct.unpack("<I", _command(sock, RPC_CMD_DEVICE_COUNT, b"", 4))[0]
    except SpecDeskError:
        raise
    except socket.timeout:
        raise SpecDeskError(f"--rpc {endpoint}: the server did not answer within {timeout_s:.0f} s "
                            "(busy with another client, or not an RPC server): check the address") from None
    except (OSError, ConnectionError) as e:
        reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
        raise SpecDeskError(f"--rpc {endpoint}: no RPC server answers there ({reason}): start one "
                            "(llama.cpp's rpc-server) or check the address") from None
    if count == 0:
        raise SpecDeskError(f"--rpc {endpoint}: the server offers no device")
    return count


def _ggml(name: str, restype, argtypes: list):
    from .binding import ggml_function

    return ggml_function(name, restype, argtypes)


def _rpc_proc(name: bytes) -> int:
    """A function of the RPC backend, through its registry (a module of its own in a
    GGML_BACKEND_DL build, so never a symbol of libggml)."""
    reg_by_name = _ggml("ggml_backend_reg_by_name", ctypes.c_void_p, [ctypes.c_char_p])
    proc = _ggml("ggml_backend_reg_get_proc_address", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p])
    rpc_reg = reg_by_name(b"RPC")
    address = proc(rpc_reg, name) if rpc_reg else None
    if not address:
        raise SpecDeskError(f"this llama.cpp's RPC backend has no {name.decode()}: set up again with GGML_RPC=ON "
                            "(scripts/setup.sh does)")
    return address


def rpc_supported() -> bool:
    from .binding import llama_lib

    return bool(llama_lib().llama_supports_rpc())


def add_servers(endpoints: list[str]) -> None:
    """Register each server's devices with ggml in this process (once per endpoint), after
    checking that it answers: --rpc as llama.cpp's own tools take it."""
    if not endpoints:
        return
    if not rpc_supported():
        raise SpecDeskError("--rpc: this llama.cpp was built without the RPC backend: set up again with "
                            "GGML_RPC=ON (scripts/setup.sh does)")
    with _add_lock:
        for endpoint in endpoints:
            if endpoint in _added:
                continue
            count = probe(endpoint)
            register = _ggml("ggml_backend_register", None, [ctypes.c_void_p])
            address = _rpc_proc(b"ggml_backend_rpc_add_server")
            add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(address)
            reg = add_server(endpoint.encode())
            if not reg:
                raise SpecDeskError(f"--rpc {endpoint}: the server offers no device")
            register(reg)
            _added[endpoint] = count


def added_servers() -> dict[str, int]:
    return dict(_added)


# --- a server on this machine ------------------------------------------------------------
def serve(endpoint: str, n_threads: int = 1, cache_dir: Optional[str] = None, device: str = "CPU") -> None:
    """Serve `device` (a ggml device name) at `endpoint` until the process ends (blocks)."""
    by_name = _ggml("ggml_backend_dev_by_name", ctypes.c_void_p, [ctypes.c_char_p])
    address = _rpc_proc(b"ggml_backend_rpc_start_server")
    start = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                             ctypes.c_void_p)(address)
    dev = by_name(device.encode())
    if not dev:
        raise SpecDeskError(f"rpc server: no device named {device!r} here")
    devices = (ctypes.c_void_p * 1)(dev)
    start(endpoint.encode(), cache_dir.encode() if cache_dir else None, n_threads, 1,
          ctypes.cast(devices, ctypes.c_void_p))
    raise SpecDeskError(f"rpc server: could not listen at {endpoint} (the port in use?)")


def _server_main(endpoint: str, n_threads: int, log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    serve(endpoint, n_threads)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class RpcServer:
    """An RPC server for this machine's CPU device in a child process; `endpoint` once it answers."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, n_threads: int = 1, start_timeout_s: float = 30.0):
        self.endpoint = f"{host}:{port or free_port(host)}"
        log = tempfile.NamedTemporaryFile(prefix="specdesk-rpc-", suffix=".log", delete=False)
        log.close()
        self.log_path = log.name
        context = multiprocessing.get_context("spawn")
        self.process = context.Process(target=_server_main, args=(self.endpoint, n_threads, self.log_path),
                                       name="specdesk-rpc-server", daemon=True)
        self.process.start()
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                probe(self.endpoint, timeout_s=1.0)
                return
            except SpecDeskError:
                if not self.process.is_alive() or time.monotonic() > deadline:
                    self.stop()
                    raise SpecDeskError(f"the RPC server at {self.endpoint} did not start: {self.output_tail()}")
                time.sleep(0.1)

    def output_tail(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return " | ".join(f.read().splitlines()[-3:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        try:
            os.unlink(self.log_path)
        except OSError:
            pass

    def __enter__(self) -> "RpcServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
