"""EngineClient: an engine in its own process (app/runtime/engine_host.py), with the engine's interface.

`generate(request, cancel)` yields the same StepEvents as an in-process engine, so chat,
compare, sweep and charts do not know the difference. What the process cannot survive (an
abort in llama.cpp, an out-of-memory kill) ends the host, not the app: the client raises
EngineHostDied with one sentence and the host's last output lines. A step or a chat template
that never returns is ended by Stop: after STOP_GRACE_S (longer for a model whose steps
take longer) the client ends the host and says so. A client with `watchdog` (the CLI and
`specdesk serve`, which have no Stop button) also ends a host that sends nothing, not even
its heartbeat, for that same grace while it works: a stopped or stuck process.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from specdesk.engines.types import GenerationRequest, SpecDeskError, StepEvent

from .engine_host import HostSpec, host_main

STOP_GRACE_S = 2.0  # how long Stop waits for a step to end before it ends the host
SLOW_STEP_FACTOR = 2.0  # ... or this many times the slowest step this host has taken, if longer
CLOSE_GRACE_S = 1.0  # how long close() waits for the host to unload before ending it
LOAD_SILENCE_S = 30.0  # the watchdog's patience while a model (or a drafter) loads
POLL_S = 0.05  # how often a waiting client looks at its cancel event
DETAIL_LINES = 30  # host output lines kept behind "Details"


class EngineHostDied(SpecDeskError):
    """The engine process ended (a crash, a kill, or Stop on a step that did not return).

    The message is one sentence for the user; `details` holds the host's last output lines."""

    def __init__(self, message: str, details: str = "", exitcode: Optional[int] = None):
        super().__init__(message)
        self.details = details
        self.exitcode = exitcode


def describe_exit(exitcode: Optional[int]) -> str:
    if exitcode is None:
        return "no exit status"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        if name == "SIGKILL":
            return "SIGKILL, which often means the system ran out of memory"
        return name
    return f"exit status {exitcode}"


class RemoteTarget:
    """The host's target model, as far as the app reads it: fixed facts are kept here,
    tokenization goes to the host, token bytes come once as a table."""

    def __init__(self, client: "EngineClient", facts: dict[str, Any]):
        self._client = client
        self.path = Path(facts["path"])
        self.n_vocab: int = facts["n_vocab"]
        self._chat_template: Optional[str] = facts["chat_template"]
        self._token_table: Optional[list[bytes]] = None

    def chat_template(self) -> Optional[str]:
        return self._chat_template

    def token_bytes(self, token: int) -> bytes:
        return self.token_table()[token]

    def token_table(self) -> list[bytes]:
        if self._token_table is None:
            self._token_table = self._client.call("token_table")
        return self._token_table

    def tokenize(self, text: str, add_bos: Optional[bool] = None, parse_special: bool = False) -> list[int]:
        return self._client.call("target.tokenize", text, add_bos=add_bos, parse_special=parse_special)

    def token_text(self, token: int) -> str:
        return self._client.call("target.token_text", token)

    def detokenize(self, tokens) -> str:
        return self._client.call("target.detokenize", list(tokens))

    def is_eog(self, token: int) -> bool:
        return self._client.call("target.is_eog", token)


class EngineClient:
    """Starts an engine host for `target` and speaks for it. One request at a time."""

    def __init__(self, target: str | os.PathLike, kind: str = "llama", n_ctx: int = 0,
                 n_threads: Optional[int] = None, device: str = "auto",
                 progress: Optional[Callable[[float], None]] = None, cancel: Optional[threading.Event] = None,
                 watchdog: bool = False, **placement):
        """Start the host and wait until it has loaded `target`; `cancel` ends a load at once.
        `watchdog`: end a host that sends nothing for stop_grace_s() while it works.
        `placement`: HostSpec's gpu_layers, draft_device, draft_gpu_layers and rpc (llama.cpp)."""
        self.spec = HostSpec(str(target), kind, n_ctx, n_threads, device, **placement)
        self.watchdog = watchdog
        self._heard = False  # whether the host has sent anything yet (it starts a fresh interpreter first)
        self._lock = threading.Lock()
        self._owner: Optional[int] = None  # the thread holding _lock
        self._watched: Optional[threading.Event] = None
        self._generations = 0
        self._slowest_step_s = 0.0  # a big model on a CPU may legitimately take seconds per step
        self._closed = False
        self._dead: Optional[EngineHostDied] = None
        log = tempfile.NamedTemporaryFile(prefix="specdesk-engine-", suffix=".log", delete=False)
        log.close()
        self.log_path = log.name
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no Qt or threads copied by fork
        self._conn, child_conn = context.Pipe(duplex=True)
        self._process = context.Process(target=host_main, args=(child_conn, self.spec, self.log_path),
                                        name="specdesk-engine", daemon=True)
        self._process.start()
        child_conn.close()  # only the child holds its end: its death reads as end-of-file here
        facts = self._wait(f"loading {Path(target).name}", progress, cancel)
        self.name: str = facts["name"]
        self.n_ctx: int = facts["n_ctx"]
        self.n_threads: int = facts["n_threads"]
        self.pid: int = facts["pid"]
        self.placement: dict = facts.get("placement", {})  # where the models sit: placement_report()
        self.notes: list[str] = facts.get("notes", [])  # one line each: what loaded otherwise than asked
        self.target = RemoteTarget(self, facts)

    # --- state ---------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._dead is None and not self._closed and self._process.is_alive()

    @contextmanager
    def watching(self, cancel: threading.Event):
        """While inside, a call that does not return is ended (with the host) when `cancel` is set:
        Stop must also end a chat template that hangs while rendering."""
        previous, self._watched = self._watched, cancel
        try:
            yield self
        finally:
            self._watched = previous

    # --- the engine's interface -------------------------------------------------
    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[StepEvent]:
        # Consumers detokenize while the run goes on, and nothing else can be asked of the
        # host then: the token table comes first.
        self.target.token_table()
        with self._exclusive():
            self._check_usable()
            self._generations += 1
            gen_id = self._generations
            self._send(("generate", gen_id, request), "generating")
            finished = False
            sent, first = time.monotonic(), True
            try:
                for message in self._replies("generating", cancel, lambda: self._send(("cancel", gen_id),
                                                                                      "generating")):
                    if message[0] in ("events", "done"):
                        for event in message[1]:
                            # the host's own step timing; the first event also waited for the prompt
                            took = time.monotonic() - sent if first else event.draft_s + event.verify_s
                            self._slowest_step_s, first = max(self._slowest_step_s, took), False
                            yield event
                        if message[0] == "done":
                            finished = True
                            return
                    else:
                        finished = True
                        raise self._error(message)
            finally:
                if not finished and self.alive:  # the consumer stopped early: end the run before the next request
                    stop = threading.Event()
                    stop.set()
                    for message in self._replies("stopping", stop, lambda: self._send(("cancel", gen_id), "stopping")):
                        if message[0] in ("done", "error"):
                            break

    def call(self, name: str, *args, progress: Optional[Callable[[float], None]] = None, **kwargs) -> Any:
        """Run one of engine_host.CALLS in the host; its errors are raised here."""
        with self._exclusive():
            self._check_usable()
            if progress is not None:
                kwargs["progress"] = True
            activity = name.replace("_", " ").replace("target.", "")
            self._send(("call", name, args, kwargs), activity)
            cancel = self._watched
            for message in self._replies(activity, cancel, None, progress, loading=name.startswith("load")):
                if message[0] == "result":
                    return message[1]
                raise self._error(message)

    def load_draft(self, path, progress: Optional[Callable[[float], None]] = None) -> None:
        self.call("load_draft", str(path), progress=progress)

    def load_native(self, method: str, path=None) -> None:
        """An MTP, DFlash or EAGLE-3 drafter for the target (both engines load them this way)."""
        self.call("load_native", method, None if path is None else str(path))

    def method_availability(self) -> dict[str, Optional[str]]:
        return self.call("method_availability")

    def prepare(self, spec) -> None:
        """What a method needs before its first run (auto: this machine's costs, cached after the
        first time), done now in the engine process (engines/speculation/proposers.prepare)."""
        self.call("prepare", spec)

    def set_threads(self, n_threads: int) -> None:
        self.n_threads = self.call("set_threads", n_threads)

    def reset_chat(self) -> None:
        self.call("reset_chat")

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return self.call("tokenize", text, add_bos=add_bos)

    def detokenize(self, tokens) -> str:
        return self.call("detokenize", list(tokens))

    def top_logits(self, tokens, n: int = 2) -> list[tuple[int, float]]:
        """The target's n highest logits for the token after `tokens` (see LlamaEngine.top_logits)."""
        return [tuple(pair) for pair in self.call("top_logits", list(tokens), n)]

    def logit_noise(self, tokens) -> float:
        """The target's batched-against-single logit noise on `tokens` (see LlamaEngine.logit_noise)."""
        return float(self.call("logit_noise", list(tokens)))

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        """The conversation in the model's chat template, rendered in the host (a template can hang)."""
        return self.call("chat_prompt", [dict(m) for m in messages])

    def draft_prompt(self, spec, messages: list[dict]) -> str:
        """The conversation in a cross-vocabulary draft's own template, rendered in the host
        (app/chat/prompting.draft_prompt); "" for other runs."""
        return self.call("draft_prompt", spec, [dict(m) for m in messages])

    def facts(self, draft_path: Optional[str] = None, draft_kind: str = "draft",
              verdict_paths: Optional[dict[str, str]] = None) -> dict[str, Any]:
        return self.call("facts", draft_path, draft_kind, verdict_paths or {})

    @property
    def device_description(self) -> str:
        return self.call("device_description")

    def placement_report(self) -> dict:
        """Where each loaded model sits and what llama.cpp allocated on each device (engine.py)."""
        self.placement = self.call("placement")
        return self.placement

    # --- ending ------------------------------------------------------------------
    def close(self, timeout_s: float = CLOSE_GRACE_S) -> None:
        """Unload and end the host; one that does not end within `timeout_s` is killed."""
        if self._closed:
            return
        self._closed = True
        if self._process.is_alive():
            try:
                self._conn.send(("close",))
            except OSError:
                pass
            self._process.join(timeout_s)
        self._end()
        self._conn.close()
        self._remove_log()

    def kill(self) -> None:
        """End the host at once. Safe from any thread: it only sends the signal, and a client
        waiting on the host then reads end-of-file (the waiting thread reaps the process)."""
        if self._process.exitcode is None:
            self._process.kill()

    def _end(self) -> None:
        self.kill()
        self._process.join(CLOSE_GRACE_S)

    def stop_grace_s(self) -> float:
        """How long Stop waits for the step in progress before ending the host."""
        return max(STOP_GRACE_S, SLOW_STEP_FACTOR * self._slowest_step_s)

    # --- plumbing ------------------------------------------------------------------
    @contextmanager
    def _exclusive(self):
        """One request at a time; a call from inside a running generation is a bug, not a wait forever."""
        if self._owner == threading.get_ident():
            raise RuntimeError("the engine process is busy with a generation on this thread")
        with self._lock:
            self._owner = threading.get_ident()
            try:
                yield
            finally:
                self._owner = None

    def _check_usable(self) -> None:
        if self._dead is not None:
            raise EngineHostDied(f"the engine process for {Path(self.spec.target).name} has stopped: "
                                 "reload the model to continue", self._dead.details, self._dead.exitcode)
        if self._closed:
            raise SpecDeskError("the engine is closed: load a model first")

    def _send(self, message: tuple, activity: str) -> None:
        try:
            self._conn.send(message)
        except OSError:
            raise self._died(activity) from None

    def _replies(self, activity: str, cancel: Optional[threading.Event], on_cancel: Optional[Callable[[], None]],
                 progress: Optional[Callable[[float], None]] = None, loading: bool = False) -> Iterator[tuple]:
        """Messages from the host until the caller stops reading; ends a host that does not
        answer within stop_grace_s() of `cancel` being set, and with the watchdog one that
        sends nothing for as long (LOAD_SILENCE_S while `loading`: a library's import can hold
        the interpreter for seconds; and not before the host's first message, while it starts)."""
        cancelled_at = None
        grace = self.stop_grace_s()
        silence = max(grace, LOAD_SILENCE_S) if loading else grace
        heard_at = time.monotonic()
        while True:
            if cancel is not None and cancel.is_set() and cancelled_at is None:
                cancelled_at = time.monotonic()
                if on_cancel is not None:
                    on_cancel()
            if cancelled_at is not None and time.monotonic() - cancelled_at > grace:
                self._end()
                self._dead = self._died_error(
                    f"the engine process did not answer within {grace:.0f} s of Stop while {activity} "
                    f"and was ended: reload the model to continue")
                raise self._dead
            if self.watchdog and self._heard and time.monotonic() - heard_at > silence:
                self._end()
                self._dead = EngineHostDied(
                    f"the engine process for {Path(self.spec.target).name} sent nothing for {silence:.0f} s while "
                    f"{activity} (it is stopped or stuck) and was ended", "", self._process.exitcode)
                raise self._dead
            try:
                ready = self._conn.poll(POLL_S)
                message = self._conn.recv() if ready else None
            except (EOFError, OSError):
                raise self._died(activity) from None
            if message is None:
                continue
            heard_at, self._heard = time.monotonic(), True
            if message[0] == "alive":  # the host's heartbeat (engine_host.HEARTBEAT_S)
                continue
            if message[0] == "progress":
                if progress is not None:
                    progress(message[1])
                continue
            yield message

    def _wait(self, activity: str, progress: Optional[Callable[[float], None]],
              cancel: Optional[threading.Event]) -> dict:
        def stop_loading() -> None:  # nothing is lost by ending a load: no waiting for it
            raise SpecDeskError(f"{activity} was stopped")

        try:
            for message in self._replies(activity, cancel, stop_loading, progress, loading=True):
                if message[0] == "ready":
                    return message[1]
                raise self._error(message)
        except BaseException:
            self._end()
            self._closed = True
            self._conn.close()
            self._remove_log()
            raise
        raise AssertionError("unreachable")

    def _error(self, message: tuple) -> Exception:
        kind, text = message[1], message[2]
        if kind == "memory":
            return MemoryError(text)
        if kind == "bug":
            return RuntimeError(text)
        return SpecDeskError(text)

    def _died(self, activity: str) -> EngineHostDied:
        self._process.join(CLOSE_GRACE_S)
        if self._process.is_alive():  # the pipe broke but the process lives on: end it
            self._end()
        how = describe_exit(self._process.exitcode)
        self._dead = self._died_error(f"the engine process for {Path(self.spec.target).name} stopped ({how}) "
                                      f"while {activity}: reload it, or choose another model")
        return self._dead

    def _died_error(self, message: str) -> EngineHostDied:
        return EngineHostDied(message, self.output_tail(), self._process.exitcode)

    def output_tail(self, lines: int = DETAIL_LINES) -> str:
        """The host's last output lines (llama.cpp's assert messages end up here)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 16384))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _remove_log(self) -> None:
        try:
            os.unlink(self.log_path)
        except OSError:
            pass

    def __enter__(self) -> "EngineClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
