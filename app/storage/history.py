"""Chat history in SQLite (WAL) under the platformdirs data dir.

A message is written, in its own transaction, when it is complete: a user message when it
is sent, a model reply when its generation ends (finished or stopped). Killing the app
mid-generation therefore loses at most the reply being generated. WAL mode keeps each
commit cheap and readers unblocked.

`meta` is a small JSON object per message: for replies, the run's numbers and the
accepted-draft spans (`draft_spans`: [[n_chars, from_draft], ...]) so highlighting survives
a restart.

A chat is a tree of messages. Each message has a parent (None for the first); messages with
the same parent are alternatives of one another: editing a user message or regenerating a
reply adds an alternative rather than replacing it. The chat shows one path, from its first
message down to its head (`chats.head_id`); switching to another alternative moves the head
to the newest message below that alternative, as LM Studio and Jan do. A chat also keeps
its own system prompt.

The schema is versioned with `PRAGMA user_version`. Version 1 (a flat list of messages per
chat) is migrated in one transaction: each message's parent becomes the message before it in
its chat and the head the chat's last message, so every message stays where it was.

Our databases carry `PRAGMA application_id = APPLICATION_ID`. A file at the history's path
that is another program's SQLite database (or not a database, or not a file) is refused
before anything is written to it, so it is never altered; the app then keeps a
`History.temporary()` for the session, whose folder is removed when it closes.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from specdesk.engines.types import SpecDeskError

from .paths import data_dir

HISTORY_FILE = "history.sqlite3"
SCHEMA_VERSION = 2
MAX_TITLE = 200  # characters of a chat's name
APPLICATION_ID = 0x53504443  # "SPDC": marks the file as SpecDesk's chat history
_V1_TABLES = {"chats": {"id", "title", "created", "updated"},
              "messages": {"id", "chat_id", "role", "content", "meta", "created"}}
OUR_TABLES = {"chats": _V1_TABLES["chats"] | {"system_prompt", "head_id"},  # table -> columns (this version)
              "messages": _V1_TABLES["messages"] | {"parent_id"}}
KNOWN_TABLES = (_V1_TABLES, OUR_TABLES)  # every version's tables, to recognise an unmarked file of ours

_SCHEMA = """
CREATE TABLE chats (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    head_id INTEGER
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    meta TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL,
    parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE
);
CREATE INDEX messages_by_chat ON messages(chat_id, id);
CREATE INDEX messages_by_parent ON messages(parent_id, id);
"""

# Version 1 -> 2: branches and a system prompt per chat. The parent of each message is the
# one before it in its chat, the head is the chat's last message: the same conversations.
_MIGRATE_1_TO_2 = """
ALTER TABLE chats ADD COLUMN system_prompt TEXT NOT NULL DEFAULT '';
ALTER TABLE chats ADD COLUMN head_id INTEGER;
ALTER TABLE messages ADD COLUMN parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE;
UPDATE messages SET parent_id = (SELECT MAX(p.id) FROM messages p
                                 WHERE p.chat_id = messages.chat_id AND p.id < messages.id);
UPDATE chats SET head_id = (SELECT MAX(m.id) FROM messages m WHERE m.chat_id = chats.id);
CREATE INDEX messages_by_parent ON messages(parent_id, id);
"""


@dataclass(frozen=True)
class Chat:
    id: int
    title: str
    created: float
    updated: float
    system_prompt: str = ""


@dataclass(frozen=True)
class Message:
    id: int
    chat_id: int
    role: str  # "user" or "assistant"
    content: str
    meta: dict = field(default_factory=dict)
    parent_id: Optional[int] = None
    created: float = 0.0
    alternative: int = 0  # this message's place among its alternatives (same parent), from 0
    alternatives: int = 1  # how many alternatives there are, this one included


@dataclass(frozen=True)
class SearchHit:
    chat: Chat
    message_id: Optional[int]  # the first message that matches; None when only the title does
    snippet: str  # the matching text around the match, on one line


_HEAD = object()  # add_message's default parent: the chat's head


def history_path() -> Path:
    return data_dir() / HISTORY_FILE


class History:
    """Chats and their messages. Use from one thread (the GUI thread)."""

    def __init__(self, path: Optional[Path] = None):
        self.path = Path(path) if path is not None else history_path()
        self._folder: Optional[tempfile.TemporaryDirectory] = None  # owned by temporary()
        self._db: Optional[sqlite3.Connection] = None
        _refuse_foreign(self.path)  # read-only look first: never write to a file that is not ours
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(self.path), isolation_level=None)  # explicit transactions
            self._db.execute("PRAGMA journal_mode=WAL")
            # NORMAL: a commit survives an application crash (the WAL is written before the
            # commit returns); only a power loss may drop the last commits.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.create_function("specdesk_contains", 2, _contains, deterministic=True)
            _migrate(self._db, self.path)
            self._db.execute(f"PRAGMA application_id={APPLICATION_ID}")
        except SpecDeskError:
            self._db.close()
            raise
        except (sqlite3.Error, OSError) as e:
            if self._db is not None:
                self._db.close()
            raise SpecDeskError(f"{self.path} is not a usable chat history ({e}): move it away to start a new one") from e

    @classmethod
    def temporary(cls) -> "History":
        """A history for this session only, in a folder of its own that close() removes
        (and, should close() never run, the interpreter's exit)."""
        folder = tempfile.TemporaryDirectory(prefix="specdesk-history-")
        try:
            history = cls(Path(folder.name) / HISTORY_FILE)
        except BaseException:
            folder.cleanup()
            raise
        history._folder = folder
        return history

    # --- helpers ------------------------------------------------------------
    def _transaction(self):
        return _Transaction(self._db)

    @property
    def is_open(self) -> bool:
        return self._db is not None

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None

    # --- chats --------------------------------------------------------------
    def create_chat(self, title: str = "New chat", system_prompt: str = "") -> int:
        now = time.time()
        with self._transaction():
            cursor = self._db.execute("INSERT INTO chats(title, created, updated, system_prompt) VALUES (?, ?, ?, ?)",
                                      (chat_title(title, MAX_TITLE), now, now, system_prompt))
        return int(cursor.lastrowid)

    def chats(self) -> list[Chat]:
        """Newest activity first."""
        rows = self._db.execute(f"SELECT {_CHAT_COLUMNS} FROM chats ORDER BY updated DESC, id DESC")
        return [Chat(*row) for row in rows]

    def chat(self, chat_id: int) -> Optional[Chat]:
        row = self._db.execute(f"SELECT {_CHAT_COLUMNS} FROM chats WHERE id = ?", (chat_id,)).fetchone()
        return Chat(*row) if row else None

    def rename_chat(self, chat_id: int, title: str) -> None:
        """A title is one line, not empty: line breaks read as spaces; a blank one is refused."""
        title = chat_title(title, MAX_TITLE)
        if not title:
            raise SpecDeskError("a chat's name cannot be empty")
        with self._transaction():
            self._db.execute("UPDATE chats SET title = ? WHERE id = ?", (title, chat_id))

    def set_system_prompt(self, chat_id: int, text: str) -> None:
        with self._transaction():
            self._db.execute("UPDATE chats SET system_prompt = ? WHERE id = ?", (text, chat_id))

    def search(self, query: str) -> list[SearchHit]:
        """Chats whose title or any message (on any branch) contains `query`, ignoring case;
        newest activity first. A blank query matches every chat."""
        query = query.strip()
        hits = []
        for chat in self.chats():
            if not query:
                hits.append(SearchHit(chat, None, ""))
                continue
            row = self._db.execute("SELECT id, content FROM messages WHERE chat_id = ? "
                                   "AND specdesk_contains(content, ?) ORDER BY id LIMIT 1",
                                   (chat.id, query)).fetchone()
            if row is not None:
                hits.append(SearchHit(chat, row[0], snippet(row[1], query)))
            elif _contains(chat.title, query):
                hits.append(SearchHit(chat, None, snippet(chat.title, query)))
        return hits

    def delete_chat(self, chat_id: int) -> None:
        with self._transaction():
            self._db.execute("DELETE FROM chats WHERE id = ?", (chat_id,))

    # --- messages -----------------------------------------------------------
    def add_message(self, chat_id: int, role: str, content: str, meta: Optional[dict] = None,
                    parent_id=_HEAD) -> int:
        """A message below `parent_id` (by default the chat's head; None: a first message);
        it becomes the chat's head."""
        now = time.time()
        with self._transaction():
            if parent_id is _HEAD:
                parent_id = self._head(chat_id)
            elif parent_id is not None:
                self._check_in_chat(parent_id, chat_id)
            cursor = self._db.execute(
                "INSERT INTO messages(chat_id, role, content, meta, created, parent_id) VALUES (?, ?, ?, ?, ?, ?)",
                (chat_id, role, content, json.dumps(meta or {}), now, parent_id))
            message_id = int(cursor.lastrowid)
            self._db.execute("UPDATE chats SET updated = ?, head_id = ? WHERE id = ?", (now, message_id, chat_id))
        return message_id

    def add_alternative(self, message_id: int, content: str, meta: Optional[dict] = None) -> int:
        """Another version of a message (an edited user message, a regenerated reply): same
        chat, role and parent. It becomes the head; the original and what follows it are kept."""
        row = self._db.execute("SELECT chat_id, role, parent_id FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise SpecDeskError(f"message {message_id} is not in the chat history")
        chat_id, role, parent_id = row
        return self.add_message(chat_id, role, content, meta, parent_id=parent_id)

    def delete_message(self, message_id: int) -> None:
        """Delete a message and everything below it; the head moves to its parent if it was below."""
        with self._transaction():
            row = self._db.execute("SELECT chat_id, parent_id FROM messages WHERE id = ?", (message_id,)).fetchone()
            if row is None:
                return
            chat_id, parent_id = row
            head = self._head(chat_id)
            on_path = head is not None and message_id in self._ancestors(head)
            self._db.execute("DELETE FROM messages WHERE id = ?", (message_id,))
            if on_path:
                self._db.execute("UPDATE chats SET head_id = ? WHERE id = ?", (parent_id, chat_id))

    def messages(self, chat_id: int) -> list[Message]:
        """The chat's active path: its first message down to its head."""
        head = self._head(chat_id)
        return self._path(chat_id, head) if head is not None else []

    def messages_before(self, message_id: int) -> list[Message]:
        """The conversation that led to a message (its parent's path, without the message): what
        a model is given to write an alternative of it."""
        row = self._db.execute("SELECT chat_id, parent_id FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise SpecDeskError(f"message {message_id} is not in the chat history")
        chat_id, parent_id = row
        return self._path(chat_id, parent_id) if parent_id is not None else []

    def all_messages(self, chat_id: int) -> list[Message]:
        """Every message of the chat, on every branch, oldest first."""
        return self._with_alternatives(chat_id, None)

    def alternatives(self, message_id: int) -> list[int]:
        """The ids of a message's alternatives (itself included), oldest first."""
        row = self._db.execute("SELECT chat_id, parent_id FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            return []
        rows = self._db.execute("SELECT id FROM messages WHERE chat_id = ? AND parent_id IS ? ORDER BY id", row)
        return [r[0] for r in rows]

    def select(self, message_id: int) -> None:
        """Show the path through `message_id`: the head moves to the newest message below it
        (following the newest alternative at each step)."""
        row = self._db.execute("SELECT chat_id FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise SpecDeskError(f"message {message_id} is not in the chat history")
        head = message_id
        while True:
            child = self._db.execute("SELECT MAX(id) FROM messages WHERE parent_id = ?", (head,)).fetchone()[0]
            if child is None:
                break
            head = child
        with self._transaction():
            self._db.execute("UPDATE chats SET head_id = ? WHERE id = ?", (head, row[0]))

    def switch_alternative(self, message_id: int, step: int) -> int:
        """Show the alternative `step` places after (or before, when negative) `message_id`,
        clamped to the first and last; returns the alternative now shown."""
        siblings = self.alternatives(message_id)
        if not siblings:
            raise SpecDeskError(f"message {message_id} is not in the chat history")
        chosen = siblings[max(0, min(len(siblings) - 1, siblings.index(message_id) + step))]
        self.select(chosen)
        return chosen

    def export_markdown(self, chat_id: int) -> str:
        return chat_markdown(self._existing(chat_id), self.messages(chat_id))

    def export_json(self, chat_id: int) -> str:
        chat = self._existing(chat_id)
        return json.dumps(chat_json(chat, self.all_messages(chat_id), self._head(chat_id)),
                          ensure_ascii=False, indent=2) + "\n"

    # --- queries --------------------------------------------------------------
    def _existing(self, chat_id: int) -> Chat:
        chat = self.chat(chat_id)
        if chat is None:
            raise SpecDeskError(f"chat {chat_id} is not in the chat history")
        return chat

    def _head(self, chat_id: int) -> Optional[int]:
        row = self._db.execute("SELECT head_id FROM chats WHERE id = ?", (chat_id,)).fetchone()
        return row[0] if row else None

    def _check_in_chat(self, message_id: int, chat_id: int) -> None:
        row = self._db.execute("SELECT chat_id FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None or row[0] != chat_id:
            raise SpecDeskError(f"message {message_id} is not in chat {chat_id}")

    def _ancestors(self, message_id: int) -> list[int]:
        """`message_id`, its parent, its parent's parent ... up to the chat's first message."""
        rows = self._db.execute("""
            WITH RECURSIVE up(id, parent_id, depth) AS (
                SELECT id, parent_id, 0 FROM messages WHERE id = ?
                UNION ALL
                SELECT m.id, m.parent_id, up.depth + 1 FROM messages m JOIN up ON m.id = up.parent_id)
            SELECT id FROM up ORDER BY depth""", (message_id,))
        return [r[0] for r in rows]

    def _path(self, chat_id: int, last: int) -> list[Message]:
        """The messages from the chat's first down to `last`."""
        path = list(reversed(self._ancestors(last)))
        rows = {m.id: m for m in self._with_alternatives(chat_id, path)}
        return [rows[i] for i in path]

    def _with_alternatives(self, chat_id: int, ids: Optional[list[int]]) -> list[Message]:
        """The chat's messages (only `ids` when given), each with its place among its alternatives."""
        rows = self._db.execute("""
            SELECT id, chat_id, role, content, meta, parent_id, created,
                   ROW_NUMBER() OVER (PARTITION BY parent_id ORDER BY id) - 1,
                   COUNT(*) OVER (PARTITION BY parent_id)
            FROM messages WHERE chat_id = ? ORDER BY id""", (chat_id,))
        wanted = set(ids) if ids is not None else None
        return [Message(id, chat, role, content, _load_meta(meta), parent, created, place, count)
                for id, chat, role, content, meta, parent, created, place, count in rows
                if wanted is None or id in wanted]


_CHAT_COLUMNS = "id, title, created, updated, system_prompt"


def _migrate(db: sqlite3.Connection, path: Path) -> None:
    """Bring the schema to SCHEMA_VERSION in one transaction; refuse a newer one untouched."""
    db.execute("BEGIN IMMEDIATE")
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        has_chats = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'chats'").fetchone()
        if version > SCHEMA_VERSION:
            raise SpecDeskError(f"{path} was written by a newer SpecDesk (history schema {version}, this one "
                                f"reads up to {SCHEMA_VERSION}): update SpecDesk, or move the file away to "
                                "start a new history")
        if not has_chats:
            _run_script(db, _SCHEMA)
        elif version <= 1:  # from before versions were checked, the schema was version 1
            _run_script(db, _MIGRATE_1_TO_2)
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _run_script(db: sqlite3.Connection, script: str) -> None:
    """Statements one by one inside the open transaction (executescript would commit it)."""
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


def chat_title(text: str, limit: int = 48) -> str:
    """A chat's title from any text (a first message, a name typed in): one line, spaces
    collapsed, at most `limit` characters."""
    title = " ".join(text.split())
    return title if len(title) <= limit else title[: limit - 1] + "…"


def _contains(text: Optional[str], query: Optional[str]) -> bool:
    return bool(text) and bool(query) and query.casefold() in text.casefold()


def snippet(text: str, query: str, width: int = 80) -> str:
    """The text around the first match of `query` (ignoring case), on one line, at most about
    `width` characters, with "…" where it was cut."""
    flat = " ".join(text.split())
    at = flat.casefold().find(query.casefold())
    if at < 0 or len(flat) <= width:
        return flat if len(flat) <= width else flat[: width - 1] + "…"
    start = max(0, min(at - (width - len(query)) // 2, len(flat) - width))
    end = start + width
    return ("…" if start else "") + flat[start:end].strip() + ("…" if end < len(flat) else "")


def chat_markdown(chat: Chat, messages: list[Message]) -> str:
    """A chat as Markdown: its title, its system prompt, and each message of the path shown
    under a heading naming who wrote it."""
    parts = [f"# {chat.title}\n"]
    if chat.system_prompt:
        parts.append(f"## System\n\n{chat.system_prompt.strip()}\n")
    for message in messages:
        who = {"user": "You", "assistant": "Model", "system": "System"}.get(message.role, message.role)
        parts.append(f"## {who}\n\n{message.content.rstrip()}\n")
    return "\n".join(parts)


def chat_json(chat: Chat, messages: list[Message], head_id: Optional[int]) -> dict:
    """A chat as a JSON-ready object that loses nothing: every message on every branch with its
    parent, and the head that picks the path shown."""
    return {"format": "specdesk-chat", "version": 1, "title": chat.title, "created": chat.created,
            "updated": chat.updated, "system_prompt": chat.system_prompt, "head_id": head_id,
            "messages": [{"id": m.id, "parent_id": m.parent_id, "role": m.role, "content": m.content,
                          "meta": m.meta, "created": m.created} for m in messages]}


def _refuse_foreign(path: Path) -> None:
    """Raise SpecDeskError unless `path` is missing, empty, or a SQLite database that is ours
    (our application_id, or, from before it was set, only our tables). Reads only."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise SpecDeskError(f"{path} is not a usable chat history ({e.strerror or e}): "
                            "move it away to start a new one") from None
    if not stat.S_ISREG(status.st_mode):
        raise SpecDeskError(f"{path} is not a usable chat history (it is not a regular file): "
                            "move it away to start a new one")
    if status.st_size == 0:
        return
    try:
        # mode=ro: looking must not change the file (no journal mode switch, no schema).
        db = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
        try:
            application_id = db.execute("PRAGMA application_id").fetchone()[0]
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            columns = {table: {row[1] for row in db.execute("SELECT * FROM pragma_table_info(?)", (table,))}
                       for table in tables}
            ours = any(tables <= set(known) and all(columns[t] == known[t] for t in tables)
                       for known in KNOWN_TABLES)
        finally:
            db.close()
    except sqlite3.Error as e:
        raise SpecDeskError(f"{path} is not a usable chat history ({e}): move it away to start a new one") from None
    # From before the mark was set, ours is recognised by its tables and their columns.
    if application_id == APPLICATION_ID or (application_id == 0 and ours):
        return
    raise SpecDeskError(f"{path} is another program's SQLite database (tables: {', '.join(sorted(tables)[:5]) or 'none'}"
                        f"{', …' if len(tables) > 5 else ''}): SpecDesk leaves it untouched; "
                        "move it away to keep chats")


def _load_meta(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class _Transaction:
    def __init__(self, db: sqlite3.Connection):
        self._db = db

    def __enter__(self):
        self._db.execute("BEGIN IMMEDIATE")
        return self._db

    def __exit__(self, kind, value, traceback):
        self._db.execute("COMMIT" if kind is None else "ROLLBACK")
        return False
