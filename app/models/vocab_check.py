"""Draft/target vocabulary verdicts from llama.cpp's own vocabulary loads, made in a child process.

Pairing compares vocabularies as llama.cpp loads them (engines/speculation/compat.py on two
vocabulary-only loads), so its verdict is the engine's. But llama.cpp ends the process on a
vocabulary it cannot load (GGML_ASSERT), and pairing runs in the app's window process and in
`models pair`: the loads happen in a child process instead. A file whose load ends that
process gets a verdict saying so, and the child is started again for the files after it.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from pathlib import Path

from specdesk.engines.types import SpecDeskError

from ..runtime.engine_client import describe_exit

ANSWER_TIMEOUT_S = 120.0  # one vocabulary load; the largest real ones take a second or two
START_TIMEOUT_S = 120.0  # a fresh interpreter importing llama.cpp on a loaded machine


def vocab_verdicts(target: str | os.PathLike, drafts: list[str]) -> dict[str, tuple[str, ...]]:
    """For each draft path: the reasons it cannot serve `target`, as pairing shows them (empty:
    it can). A target llama.cpp cannot read is a SpecDeskError."""
    verdicts: dict[str, tuple[str, ...]] = {}
    remaining = [str(d) for d in drafts]
    while remaining:
        done, culprit, how, said, ready = _run(str(target), remaining)
        verdicts.update(done)
        remaining = [d for d in remaining if d not in done]
        if culprit is not None:
            verdicts[culprit] = (f"llama.cpp stopped ({how}) while reading its vocabulary{said}: this file cannot "
                                 "be used",)
            remaining.remove(culprit)
        elif remaining and not ready:  # the target's own vocabulary ended the process
            raise SpecDeskError(f"{target}: llama.cpp stopped ({how}) while reading its vocabulary"
                                f"{said}: this file cannot be used as a target")
        elif remaining and not done:  # ended between two files, and again: no progress to make
            raise SpecDeskError(f"the vocabulary check ended ({how}) between files: try again")
    return verdicts


def _run(target: str, drafts: list[str]):
    """One child over `drafts`: (verdicts, the draft it ended on or None, how it ended, its last
    words, whether it had read the target's vocabulary)."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe(duplex=False)
    log = tempfile.NamedTemporaryFile(prefix="specdesk-vocab-", suffix=".log", delete=False)
    log.close()
    process = context.Process(target=_check, args=(child, target, drafts, log.name), name="specdesk-vocab",
                              daemon=True)
    process.start()
    child.close()
    verdicts: dict[str, tuple[str, ...]] = {}
    current, ready = None, False
    try:
        timeout = START_TIMEOUT_S
        while True:
            if not parent.poll(timeout):
                process.kill()
                return verdicts, current, f"no answer within {timeout:g} s", "", ready
            timeout = ANSWER_TIMEOUT_S
            try:
                message = parent.recv()
            except (EOFError, OSError):
                process.join(5)
                return verdicts, current, describe_exit(process.exitcode), _last_words(log.name), ready
            if message[0] == "target":
                raise SpecDeskError(message[1])
            if message[0] == "ready":
                ready = True
            elif message[0] == "checking":
                current = message[1]
            elif message[0] == "verdict":
                verdicts[message[1]] = tuple(message[2])
                current = None
            elif message[0] == "done":
                return verdicts, None, "", "", ready
    finally:
        parent.close()
        if process.is_alive():
            process.kill()
        process.join(5)
        try:
            os.unlink(log.name)
        except OSError:
            pass


def _last_words(log_path: str) -> str:
    """llama.cpp's assertion, when it left one: ' (GGML_ASSERT(...) failed)'."""
    try:
        text = Path(log_path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    asserts = [line.strip() for line in text.splitlines() if "GGML_ASSERT" in line]
    return f" ({asserts[-1].split(': ', 1)[-1][:160]})" if asserts else ""


def _check(conn, target: str, drafts: list[str], log_path: str) -> None:
    """In the child: the target's vocabulary, then each draft's against it."""
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)  # llama.cpp's log and its assertion message
    os.close(fd)
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    from specdesk.engines.llama.binding import GgufModel
    from specdesk.engines.speculation.compat import incompatibilities

    try:
        target_vocab = GgufModel(target, vocab_only=True)
    except SpecDeskError as e:
        conn.send(("target", str(e)))
        return
    conn.send(("ready",))
    with target_vocab:
        for path in drafts:
            conn.send(("checking", path))
            try:
                with GgufModel(path, vocab_only=True) as draft_vocab:
                    reasons = [f"{r} (target vs draft)" for r in incompatibilities(target_vocab, draft_vocab)]
            except SpecDeskError as e:  # a file the checks refuse: its own one line
                reasons = [str(e)]
            conn.send(("verdict", path, reasons))
    conn.send(("done",))
