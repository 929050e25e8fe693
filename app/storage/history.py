"""Chat history in SQLite (WAL) under the platformdirs data dir.

A message is written, in its own transaction, when it is complete: a user message when it
is sent, a model reply when its generation ends (finished or stopped). Killing the app
mid-generation therefore loses at most the reply being generated. WAL mode keeps each
commit cheap and readers unblocked.

`meta` is a small JSON object per message: for replies, the run's numbers and the
accepted-draft spans (`draft_spans`: [[n_chars, from_draft], ...]) so highlighting survives
a restart.

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
SCHEMA_VERSION = 1
APPLICATION_ID = 0x53504443  # "SPDC": marks the file as SpecDesk's chat history
OUR_TABLES = {"chats": {"id", "title", "created", "updated"},  # table -> columns
              "messages": {"id", "chat_id", "role", "content", "meta", "created"}}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS chats (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    meta TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_chat ON messages(chat_id, id);
"""


@dataclass(frozen=True)
class Chat:
    id: int
    title: str
    created: float
    updated: float


@dataclass(frozen=True)
class Message:
    id: int
    chat_id: int
    role: str  # "user" or "assistant"
    content: str
    meta: dict = field(default_factory=dict)


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
            self._db.executescript("BEGIN;" + _SCHEMA + "COMMIT;")
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            self._db.execute(f"PRAGMA application_id={APPLICATION_ID}")
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
    def create_chat(self, title: str = "New chat") -> int:
        now = time.time()
        with self._transaction():
            cursor = self._db.execute("INSERT INTO chats(title, created, updated) VALUES (?, ?, ?)",
                                      (title, now, now))
        return int(cursor.lastrowid)

    def chats(self) -> list[Chat]:
        """Newest activity first."""
        rows = self._db.execute("SELECT id, title, created, updated FROM chats ORDER BY updated DESC, id DESC")
        return [Chat(*row) for row in rows]

    def chat(self, chat_id: int) -> Optional[Chat]:
        row = self._db.execute("SELECT id, title, created, updated FROM chats WHERE id = ?", (chat_id,)).fetchone()
        return Chat(*row) if row else None

    def rename_chat(self, chat_id: int, title: str) -> None:
        with self._transaction():
            self._db.execute("UPDATE chats SET title = ? WHERE id = ?", (title, chat_id))

    def delete_chat(self, chat_id: int) -> None:
        with self._transaction():
            self._db.execute("DELETE FROM chats WHERE id = ?", (chat_id,))

    # --- messages -----------------------------------------------------------
    def add_message(self, chat_id: int, role: str, content: str, meta: Optional[dict] = None) -> int:
        now = time.time()
        with self._transaction():
            cursor = self._db.execute(
                "INSERT INTO messages(chat_id, role, content, meta, created) VALUES (?, ?, ?, ?, ?)",
                (chat_id, role, content, json.dumps(meta or {}), now))
            self._db.execute("UPDATE chats SET updated = ? WHERE id = ?", (now, chat_id))
        return int(cursor.lastrowid)

    def delete_message(self, message_id: int) -> None:
        with self._transaction():
            self._db.execute("DELETE FROM messages WHERE id = ?", (message_id,))

    def messages(self, chat_id: int) -> list[Message]:
        rows = self._db.execute(
            "SELECT id, chat_id, role, content, meta FROM messages WHERE chat_id = ? ORDER BY id", (chat_id,))
        return [Message(id, chat, role, content, _load_meta(meta)) for id, chat, role, content, meta in rows]


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
            ours = tables <= set(OUR_TABLES) and all(
                {row[1] for row in db.execute("SELECT * FROM pragma_table_info(?)", (table,))} == OUR_TABLES[table]
                for table in tables)
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
