"""The engine host: the child process that owns one loaded model set (a target and its drafts).

llama.cpp ends a process with GGML_ASSERT or an uncaught C++ exception on model files it
cannot run, and a chat template or a kernel can hang; in a child process neither takes the
app down (app/runtime/engine_client.py starts it and speaks for it). The protocol is pickled tuples
over a multiprocessing Connection; StepEvents travel in small batches (SEND_INTERVAL_S):

    client -> host   ("generate", gen_id, GenerationRequest)   ("cancel", gen_id)
                     ("call", name, args, kwargs)                ("close",)
    host -> client   ("ready", facts) ("progress", fraction) ("events", [StepEvent, ...])
                     ("done", [StepEvent, ...]) ("result", value) ("error", kind, message)
                     ("alive",)  every HEARTBEAT_S while loading, generating or in a call

The host reads cancel messages between steps, where the in-process engine checks its
cancel event, so a stopped generation ends after the step in progress as before. The
heartbeat comes from its own thread (llama.cpp's calls release the GIL): a host that sends
nothing for a while is stopped (SIGSTOP, a debugger) or stuck in native code, however long
its steps take, and a client with a watchdog ends it (app/runtime/engine_client.py).
Everything here runs in the child except `engine_facts`, which the client side never needs.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from specdesk.engines.types import SpecDeskError

# Steps go to the client at most this often (the first at once, the last with the end). Every
# message wakes the client, and on a machine whose cores all run the model's threads that
# wake-up takes a core from them; the GUI shows events no more often than this anyway.
SEND_INTERVAL_S = float(os.environ.get("SPECDESK_HOST_SEND_INTERVAL_S", 1 / 60))
HEARTBEAT_S = 0.5  # while busy; sent only then, so an idle client's pipe never fills with them


class _Connection:
    """The host's end of the pipe: sends from the heartbeat thread and the main thread one at
    a time; `busy` says whether heartbeats go out now."""

    def __init__(self, conn):
        self._conn = conn
        self._lock = threading.Lock()
        self.busy = True  # loading
        threading.Thread(target=self._beat, name="specdesk-heartbeat", daemon=True).start()

    def send(self, message) -> None:
        with self._lock:
            self._conn.send(message)

    def recv(self):
        return self._conn.recv()

    def poll(self, timeout: float = 0.0) -> bool:
        return self._conn.poll(timeout)

    def _beat(self) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            if self.busy:
                try:
                    self.send(("alive",))
                except (OSError, EOFError, ValueError):  # the client went away
                    return


@dataclass(frozen=True)
class HostSpec:
    """What the host loads: a GGUF target on llama.cpp, or an HF folder on PyTorch."""

    target: str
    kind: str = "llama"  # "llama" or "torch"
    n_ctx: int = 0
    n_threads: Optional[int] = None
    device: str = "auto"  # torch: auto, cpu, cuda, mps; llama.cpp: auto, CPU or a device `specdesk devices` lists
    gpu_layers: str = "auto"  # llama.cpp: the target's layers on `device` (auto, all or a number)
    draft_device: str = "auto"  # llama.cpp: where a draft model or drafter GGUF sits ...
    draft_gpu_layers: str = "auto"  # ... and how many of its layers
    rpc: tuple[str, ...] = ()  # llama.cpp: RPC servers (HOST:PORT) whose devices are added first
    draft_weights: str = "q8"  # llama.cpp: a float draft model on the CPU from a Q8_0 copy ("q8") or its file

    def placement_options(self) -> dict:
        """The placement fields, for starting the same engine again."""
        return {"gpu_layers": self.gpu_layers, "draft_device": self.draft_device,
                "draft_gpu_layers": self.draft_gpu_layers, "rpc": self.rpc, "draft_weights": self.draft_weights}


def open_engine(spec: HostSpec, progress: Optional[Callable[[float], None]] = None):
    from specdesk.app.storage.paths import cache_dir

    if spec.kind == "torch":
        from specdesk.engines.torch.engine import TorchEngine

        engine = TorchEngine(spec.target, n_ctx=spec.n_ctx, device=spec.device, n_threads=spec.n_threads)
    else:
        from specdesk.engines.llama.engine import LlamaEngine

        from specdesk.engines.llama.placement import Placement

        engine = LlamaEngine(spec.target, n_ctx=spec.n_ctx, n_threads=spec.n_threads, progress=progress,
                             placement=Placement.parse(spec.device, spec.gpu_layers, "--gpu-layers"),
                             draft_placement=Placement.parse(spec.draft_device, spec.draft_gpu_layers,
                                                             "--draft-gpu-layers"),
                             rpc=spec.rpc, draft_weights=spec.draft_weights)
    engine.cost_cache_dir = cache_dir() / "costs"  # method auto's measured pass and drafting costs
    return engine


# --- what the client may ask besides generate ------------------------------------
def draft_verdicts(engine, paths: dict[str, str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """For each draft choice (-> its GGUF path): the reasons it cannot serve the loaded target,
    from a vocabulary-only read of the file (no weights are loaded)."""
    from specdesk.engines.llama.binding import GgufModel
    from specdesk.engines.speculation.compat import incompatibilities

    verdicts = []
    for choice, path in paths.items():
        try:
            draft = GgufModel(path, vocab_only=True)
        except SpecDeskError as e:
            verdicts.append((choice, (str(e),)))
            continue
        try:
            verdicts.append((choice, tuple(incompatibilities(engine.target, draft))))
        finally:
            draft.close()
    return tuple(verdicts)


def engine_facts(engine, draft_path: Optional[str] = None, draft_kind: str = "draft",
                 verdict_paths: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """What a UI shows about a loaded engine: methods it can run now (or why not), size, threads."""
    model = engine.target
    availability = engine.method_availability()
    if draft_path and draft_kind != "draft":
        availability["draft"] = f"the loaded draft is a {draft_kind} drafter: choose a draft model for this method"
    return {
        "availability": availability,
        "n_params": int(model.n_params),
        "size_bytes": int(model.size_bytes),
        "threads": engine.n_threads,
        "has_chat_template": model.chat_template() is not None,
        "verdicts": draft_verdicts(engine, verdict_paths or {}),
        "placement": engine.placement_report() if hasattr(engine, "placement_report") else {},
    }


def chat_prompt(engine, messages: list[dict]) -> list[int]:
    from specdesk.app.chat.prompting import chat_prompt as render

    return render(engine, messages)


def draft_prompt(engine, spec, messages: list[dict]) -> str:
    from specdesk.app.chat.prompting import draft_prompt as render

    return render(engine, spec, messages)


def token_table(engine) -> list[bytes]:
    """Every token's bytes, sent once so the client detokenizes locally (per-token calls would cost a round trip each)."""
    model = engine.target
    return [model.token_bytes(token) for token in range(model.n_vocab)]


def max_token_chars(model, special: bool) -> int:
    from specdesk.engines.speculation.loop import max_token_chars as longest

    return longest(model, special)


def _target_call(method: str):
    return lambda engine, *args, **kwargs: getattr(engine.target, method)(*args, **kwargs)


def _prepare(engine, spec) -> None:
    from specdesk.engines.speculation.proposers import prepare

    prepare(engine, spec)


def _set_threads(engine, n_threads: int) -> int:
    engine.set_threads(n_threads)
    return engine.n_threads


# The whole surface a client can reach: nothing else in the host is callable by name.
CALLS: dict[str, Callable[..., Any]] = {
    "ping": lambda engine: None,  # the transport's own round trip (benchmarks/engine_host.py)
    "load_draft": lambda engine, path, progress=None: engine.load_draft(path, progress=progress),
    "load_native": lambda engine, method, path=None: engine.load_native(method, path),
    "method_availability": lambda engine: engine.method_availability(),
    "set_threads": _set_threads,
    "reset_chat": lambda engine: engine.reset_chat(),
    "tokenize": lambda engine, text, add_bos=True: engine.tokenize(text, add_bos=add_bos),
    "detokenize": lambda engine, tokens: engine.detokenize(tokens),
    "device_description": lambda engine: getattr(engine, "device_description", "CPU"),
    "placement": lambda engine: engine.placement_report() if hasattr(engine, "placement_report") else {},
    "top_logits": lambda engine, tokens, n=2: engine.top_logits(list(tokens), n),
    "logit_noise": lambda engine, tokens: engine.logit_noise(list(tokens)),
    "target.tokenize": _target_call("tokenize"),
    "target.token_text": _target_call("token_text"),
    "target.detokenize": _target_call("detokenize"),
    "target.is_eog": _target_call("is_eog"),
    "token_table": token_table,
    "max_token_chars": lambda engine, special=True: max_token_chars(engine.target, special),
    "chat_prompt": chat_prompt,
    "draft_prompt": draft_prompt,
    "facts": engine_facts,
    "prepare": lambda engine, spec: _prepare(engine, spec),
}
RETURNS_NOTHING = {"ping", "load_draft", "load_native", "reset_chat", "prepare"}


def ready_facts(engine) -> dict[str, Any]:
    """What the client keeps from the start: it answers these without a round trip."""
    model = engine.target
    return {
        "name": engine.name,
        "n_ctx": engine.n_ctx,
        "n_threads": engine.n_threads,
        "path": str(model.path),
        "n_vocab": int(model.n_vocab),
        "chat_template": model.chat_template(),
        "pid": os.getpid(),
        "placement": engine.placement_report() if hasattr(engine, "placement_report") else {},
        "notes": list(getattr(engine, "notes", ())),
    }


# --- the child's main ------------------------------------------------------------
def _redirect_output(log_path: str) -> None:
    """Our stdout and stderr (and llama.cpp's, which writes to the same descriptors) go to a
    file the client reads after a crash; a CLI's stdout stays clean."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    faulthandler.enable(sys.stderr)  # a segfault in native code leaves a Python traceback behind


def _error_message(error: BaseException) -> tuple[str, str]:
    if isinstance(error, SpecDeskError):
        return "user", str(error)
    if isinstance(error, MemoryError):
        return "memory", "out of memory: choose a smaller model, a smaller context or max tokens"
    traceback.print_exc()  # a bug: the traceback goes to the log the client shows as details
    return "bug", f"{type(error).__name__}: {error}"


def _generate(conn, engine, gen_id: int, request) -> None:
    cancel = threading.Event()
    batch: list = []
    last_sent: Optional[float] = None
    try:
        for event in engine.generate(request, cancel):
            batch.append(event)
            now = time.perf_counter()
            if last_sent is None or now - last_sent >= SEND_INTERVAL_S:
                conn.send(("events", batch))
                batch, last_sent = [], now
            while conn.poll():  # between steps: the only message a running generation gets is its cancel
                message = conn.recv()
                if message[0] == "cancel" and message[1] == gen_id:
                    cancel.set()
        conn.send(("done", batch))  # the last steps travel with the end: the run's end time stays exact
    except (BrokenPipeError, EOFError):
        raise
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the client as one message
        conn.send(("error", *_error_message(e)))


def _call(conn, engine, name: str, args: tuple, kwargs: dict) -> None:
    function = CALLS.get(name)
    try:
        if function is None:
            raise SpecDeskError(f"the engine process has no operation {name!r}")
        if kwargs.get("progress") is True:
            kwargs = {**kwargs, "progress": lambda fraction: conn.send(("progress", fraction))}
        value = function(engine, *args, **kwargs)
        conn.send(("result", None if name in RETURNS_NOTHING else value))
    except (BrokenPipeError, EOFError):
        raise
    except BaseException as e:  # noqa: BLE001
        conn.send(("error", *_error_message(e)))


def host_main(conn, spec: HostSpec, log_path: str) -> None:
    """Entry point of the child process (multiprocessing 'spawn')."""
    _redirect_output(log_path)
    # ggml answers an assert by attaching gdb and dumping every thread's stack: seconds of
    # waiting and hundreds of lines that bury its one-line reason under "Details".
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    conn = _Connection(conn)
    try:
        engine = open_engine(spec, progress=lambda fraction: conn.send(("progress", fraction)))
    except BaseException as e:  # noqa: BLE001
        conn.send(("error", *_error_message(e)))
        return
    try:
        conn.send(("ready", ready_facts(engine)))
        while True:
            conn.busy = False
            message = conn.recv()
            conn.busy = True
            if message[0] == "generate":
                _generate(conn, engine, message[1], message[2])
            elif message[0] == "call":
                _call(conn, engine, message[1], message[2], message[3])
            elif message[0] == "close":
                break
            # a "cancel" here came after its generation ended: nothing to do
    except (BrokenPipeError, EOFError):
        pass  # the client went away: end with it
    finally:
        engine.close()
