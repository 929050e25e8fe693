"""Chat history: SQLite in WAL mode; a message is durable once add_message returns."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specdesk.app.storage.history import SCHEMA_VERSION, History, snippet
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


# --- schema versions -----------------------------------------------------------------------
FIXTURE_V1 = Path(__file__).parent / "data" / "history_v1.sql"


def v1_database(path: Path) -> list[tuple]:
    """A history in schema version 1 (written by that version's History()); its messages as rows."""
    db = sqlite3.connect(path)
    db.executescript(FIXTURE_V1.read_text(encoding="utf-8"))
    rows = db.execute("SELECT id, chat_id, role, content, meta FROM messages ORDER BY id").fetchall()
    assert db.execute("PRAGMA user_version").fetchone()[0] == 1
    db.close()
    return rows


def test_a_version_1_history_migrates_keeping_every_message(tmp_path):
    path = tmp_path / "history.sqlite3"
    before = v1_database(path)
    assert len(before) == 7 and len({row[1] for row in before}) == 2
    history = History(path)
    assert history._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    shown = [(m.id, m.chat_id, m.role, m.content, json.dumps(m.meta))
             for chat in history.chats() for m in history.messages(chat.id)]
    assert sorted(shown) == before  # every message, on the path each chat shows, with its meta
    for chat in history.chats():  # in the order they were written, each the only version of itself
        messages = history.messages(chat.id)
        assert [m.id for m in messages] == sorted(m.id for m in messages)
        assert all(m.alternatives == 1 for m in messages)
        assert [m.parent_id for m in messages] == ([None] + [m.id for m in messages[:-1]])[:len(messages)]
    [parse_args] = [c for c in history.chats() if c.title == "parse args"]
    assert history.messages(parse_args.id)[1].meta == {"draft_spans": [[4, True], [11, False]], "tok_s": 41.5}
    assert parse_args.system_prompt == ""
    history.add_message(parse_args.id, "user", "after the migration")
    assert history.messages(parse_args.id)[-1].parent_id == max(row[0] for row in before if row[1] == parse_args.id)
    history.close()
    again = History(path)  # opening a migrated history again changes nothing
    assert len(again.all_messages(parse_args.id)) == 5
    assert again._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert again._db.execute("PRAGMA foreign_key_check").fetchall() == []
    again.close()


def test_a_history_from_a_newer_version_is_refused_untouched(tmp_path):
    path = tmp_path / "history.sqlite3"
    History(path).close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 9")
    db.close()
    digest = path.read_bytes()
    newer = "written by a newer SpecDesk \\(history schema 9, this one reads up to 2\\)"
    with pytest.raises(SpecDeskError, match=newer):
        History(path)
    assert path.read_bytes() == digest


# --- branches --------------------------------------------------------------------------------
def conversation(history: History) -> tuple[int, list[int]]:
    chat = history.create_chat("branches")
    ids = [history.add_message(chat, "user", "hi"), history.add_message(chat, "assistant", "hello"),
           history.add_message(chat, "user", "write a loop"), history.add_message(chat, "assistant", "for x in y:")]
    return chat, ids


def test_editing_a_message_keeps_both_branches_and_switching_shows_either(tmp_path):
    history = History(tmp_path / "h.sqlite3")
    chat, (hi, hello, loop, reply) = conversation(history)
    edited = history.add_alternative(loop, "write a while loop")
    answer = history.add_message(chat, "assistant", "while True:")
    shown = history.messages(chat)
    assert [m.content for m in shown] == ["hi", "hello", "write a while loop", "while True:"]
    assert (shown[2].alternative, shown[2].alternatives) == (1, 2)
    assert (shown[3].alternative, shown[3].alternatives) == (0, 1)
    assert history.alternatives(edited) == [loop, edited]
    assert [m.id for m in history.messages_before(answer)] == [hi, hello, edited]  # what wrote `answer`
    assert [m.id for m in history.messages_before(loop)] == [hi, hello] and history.messages_before(hi) == []
    assert history.switch_alternative(edited, -1) == loop  # back to the first version and its reply
    assert [m.content for m in history.messages(chat)] == ["hi", "hello", "write a loop", "for x in y:"]
    assert history.switch_alternative(loop, -1) == loop  # clamped at the first
    history.switch_alternative(loop, +1)
    assert [m.id for m in history.messages(chat)] == [hi, hello, edited, answer]
    assert len(history.all_messages(chat)) == 6
    history.close()


def test_regenerating_a_reply_keeps_the_old_one(tmp_path):
    history = History(tmp_path / "h.sqlite3")
    chat, (hi, hello, loop, reply) = conversation(history)
    again = history.add_alternative(reply, "for item in items:", {"draft_spans": [[18, True]]})
    assert [m.content for m in history.messages(chat)][-1] == "for item in items:"
    assert history.messages(chat)[-1].meta == {"draft_spans": [[18, True]]}
    assert [history.chat(chat).id, history.alternatives(reply)] == [chat, [reply, again]]
    history.select(reply)
    assert history.messages(chat)[-1].id == reply
    history.select(hello)  # the newest path below it
    assert history.messages(chat)[-1].id == again
    history.close()


def test_deleting_a_message_takes_what_follows_and_moves_the_head_up(tmp_path):
    history = History(tmp_path / "h.sqlite3")
    chat, (hi, hello, loop, reply) = conversation(history)
    history.delete_message(loop)
    assert [m.id for m in history.messages(chat)] == [hi, hello]
    assert len(history.all_messages(chat)) == 2
    new = history.add_message(chat, "user", "next")
    assert history.messages(chat)[-1].parent_id == hello and history.messages(chat)[-1].id == new
    history.delete_message(hi)
    assert history.messages(chat) == [] and history.all_messages(chat) == []
    history.add_message(chat, "user", "from the start")
    assert [m.content for m in history.messages(chat)] == ["from the start"]
    history.close()


def test_a_parent_from_another_chat_or_a_missing_message_is_refused(tmp_path):
    history = History(tmp_path / "h.sqlite3")
    chat, (hi, *_rest) = conversation(history)
    other = history.create_chat("other")
    with pytest.raises(SpecDeskError, match=f"message {hi} is not in chat {other}"):
        history.add_message(other, "user", "x", parent_id=hi)
    with pytest.raises(SpecDeskError, match="message 999 is not in the chat history"):
        history.add_alternative(999, "x")
    with pytest.raises(SpecDeskError, match="message 999 is not in the chat history"):
        history.select(999)
    history.close()


# --- system prompt, rename, search, export -------------------------------------------------
def test_system_prompt_and_rename(tmp_path):
    history = History(tmp_path / "h.sqlite3")
    chat = history.create_chat("first", system_prompt="You are terse.")
    assert history.chat(chat).system_prompt == "You are terse."
    history.set_system_prompt(chat, "Answer in French.")
    history.rename_chat(chat, "  a new\nname ")
    assert (history.chat(chat).title, history.chat(chat).system_prompt) == ("a new name", "Answer in French.")
    with pytest.raises(SpecDeskError, match="a chat's name cannot be empty"):
        history.rename_chat(chat, " \n ")
    assert len(history.chat(history.create_chat("x" * 500)).title) == 200
    history.close()


def test_search_finds_titles_and_text_on_any_branch_ignoring_case(tmp_path):
    history = History(tmp_path / "h.sqlite3")
    chat, (hi, hello, loop, reply) = conversation(history)
    history.add_alternative(reply, "ÉCOLE while True")  # the path now shows this reply
    other = history.create_chat("Parsing ARGS")
    history.add_message(other, "user", "nothing here")
    assert [(h.chat.id, h.message_id) for h in history.search("for x in")] == [(chat, reply)]  # an old branch
    assert [h.snippet for h in history.search("école")] == ["ÉCOLE while True"]
    assert [(h.chat.id, h.message_id, h.snippet) for h in history.search("args")] == [(other, None, "Parsing ARGS")]
    assert history.search("100%") == [] and history.search("_") == []  # LIKE's wildcards are text here
    assert [h.chat.id for h in history.search("  ")] == [other, chat]
    history.close()


def test_snippet_cuts_around_the_match():
    text = "word " * 40 + "NEEDLE" + " more" * 40
    cut = snippet(text, "needle", width=30)
    assert "NEEDLE" in cut and cut.startswith("…") and cut.endswith("…") and len(cut) <= 32
    assert snippet("short\ntext", "text") == "short text"


def test_export_markdown_shows_the_path_and_json_keeps_every_branch(tmp_path):
    history = History(tmp_path / "h.sqlite3")
    chat, (hi, hello, loop, reply) = conversation(history)
    history.set_system_prompt(chat, "Be brief.")
    again = history.add_alternative(reply, "```python\nwhile True:\n    pass\n```")
    markdown = history.export_markdown(chat)
    assert markdown == ("# branches\n\n## System\n\nBe brief.\n\n## You\n\nhi\n\n## Model\n\nhello\n\n"
                        "## You\n\nwrite a loop\n\n## Model\n\n```python\nwhile True:\n    pass\n```\n")
    exported = json.loads(history.export_json(chat))
    assert exported["title"] == "branches" and exported["system_prompt"] == "Be brief."
    assert exported["head_id"] == again
    assert [(m["id"], m["parent_id"], m["content"]) for m in exported["messages"]] == [
        (hi, None, "hi"), (hello, hi, "hello"), (loop, hello, "write a loop"), (reply, loop, "for x in y:"),
        (again, loop, "```python\nwhile True:\n    pass\n```")]
    with pytest.raises(SpecDeskError, match="chat 999 is not in the chat history"):
        history.export_json(999)
    history.close()
