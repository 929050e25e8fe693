"""Chat history: SQLite in WAL mode; a message is durable once add_message returns."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from specdesk.app.storage.history import History
from specdesk.engines.types import SpecDeskError


def test_chats_and_messages_round_trip(tmp_path):
    history = History(tmp_path / "h.sqlite3")
    first = history.create_chat("parse args")
    second = history.create_chat("other")
    history.add_message(first, "user", "def parse_args(argv):")
    reply = history.add_message(first, "assistant", "    return argv", {"draft_spans": [[4, True], [11, False]]})
    assert [c.id for c in history.chats()] == [first, second]  # the chat with the newest message first
    messages = history.messages(first)
    assert [(m.role, m.content) for m in messages] == [("user", "def parse_args(argv):"), ("assistant", "    return argv")]
    assert messages[1].meta == {"draft_spans": [[4, True], [11, False]]}
    history.delete_message(reply)
    assert len(history.messages(first)) == 1
    history.rename_chat(second, "renamed")
    assert history.chat(second).title == "renamed"
    history.delete_chat(first)  # its messages go with it
    assert history.chat(first) is None and history.messages(first) == []
    history.close()
    assert not history.is_open


def test_history_uses_wal_and_survives_reopening(tmp_path):
    path = tmp_path / "h.sqlite3"
    history = History(path)
    chat = history.create_chat("kept")
    history.add_message(chat, "user", "hello")
    history.close()
    again = History(path)
    assert again._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert [m.content for m in again.messages(chat)] == ["hello"]
    again.close()


def test_a_file_that_is_not_a_database_is_named(tmp_path):
    path = tmp_path / "h.sqlite3"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(SpecDeskError, match="h.sqlite3 is not a usable chat history"):
        History(path)


def test_meta_that_is_not_an_object_reads_as_empty(tmp_path):
    path = tmp_path / "h.sqlite3"
    history = History(path)
    chat = history.create_chat()
    history.add_message(chat, "user", "x")
    history._db.execute("UPDATE messages SET meta = 'not json'")
    assert history.messages(chat)[0].meta == {}
    history.close()


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_killing_the_writer_loses_nothing_already_written(tmp_path):
    """A process killed (SIGKILL, no cleanup) between messages: every earlier message is intact."""
    path = tmp_path / "h.sqlite3"
    script = textwrap.dedent(f"""
        import sys, time
        from specdesk.app.storage.history import History
        history = History({str(path)!r})
        chat = history.create_chat("before the crash")
        for i in range(20):
            history.add_message(chat, "user" if i % 2 == 0 else "assistant", f"message {{i}}")
        print("written", flush=True)
        time.sleep(60)  # a reply is being generated when the process dies
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "written"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
        child.stdout.close()
    history = History(path)
    chats = history.chats()
    assert [c.title for c in chats] == ["before the crash"]
    assert [m.content for m in history.messages(chats[0].id)] == [f"message {i}" for i in range(20)]
    assert history._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    history.close()
