"""Chats kept as they go: one SQLite file in the data directory, written as each message completes.

Every message is its own committed transaction, so a crash or a kill loses at most the reply being written.
The file is private (0600, in a 0700 folder): chats are personal. Pure Python (no Textual): the chat screen,
tests and any future command share it. :class:`ChatJournal` does the screen's writes in order on one
background thread, so the interface never waits on the disk.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from clover_local import settings
from clover_local.conversations import Conversation, now, title_from
from clover_local.engine.types import ChatMessage
from clover_local.errors import CloverError
from clover_local.user_files import make_private_dir

SCHEMA = """
CREATE TABLE IF NOT EXISTS chats (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL DEFAULT '',
    model TEXT NOT NULL DEFAULT '',
    system_prompt TEXT NOT NULL DEFAULT '',
    created TEXT NOT NULL,
    updated TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    PRIMARY KEY (chat_id, position)
);
"""
_ROLES = ("user", "assistant")


@dataclass(frozen=True)
class StoredChat:
    """A listing entry: enough to show, pick, rename or delete a chat."""

    id: int
    title: str
    model: str
    updated: str
    n_messages: int


def store_path() -> Path:
    return settings.data_dir() / "chats" / "chats.sqlite3"


class ChatStore:
    """The chats file. Each call opens its own connection, so any thread may use it."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or store_path()

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        try:
            _create_private(self.path)
            db = sqlite3.connect(self.path, timeout=10)
        except (OSError, sqlite3.Error) as exc:
            raise _store_error(self.path, exc) from None
        try:
            db.execute("PRAGMA foreign_keys = ON")
            db.executescript(SCHEMA)
            with db:  # one transaction, committed on leaving
                yield db
        except sqlite3.Error as exc:
            raise _store_error(self.path, exc) from None
        finally:
            db.close()

    def start(self, model: str, system_prompt: str, created: str = "") -> int:
        """A new, empty chat; its id."""
        stamp = created or now()
        with self._db() as db:
            cur = db.execute(
                "INSERT INTO chats (model, system_prompt, created, updated) VALUES (?, ?, ?, ?)",
                (model, system_prompt, stamp, stamp),
            )
            assert cur.lastrowid is not None
            return cur.lastrowid

    def put(self, chat_id: int, position: int, message: ChatMessage) -> None:
        """Message ``position`` of the chat (0-based), replacing whatever was there and after it."""
        if message.role not in _ROLES:
            return
        with self._db() as db:
            db.execute("DELETE FROM messages WHERE chat_id = ? AND position >= ?", (chat_id, position))
            db.execute(
                "INSERT INTO messages (chat_id, position, role, content) VALUES (?, ?, ?, ?)",
                (chat_id, position, message.role, message.content),
            )
            self._touch(db, chat_id)

    def truncate(self, chat_id: int, keep: int) -> None:
        """Keep the first ``keep`` messages (a failed turn, a regenerated reply, an edited message)."""
        with self._db() as db:
            db.execute("DELETE FROM messages WHERE chat_id = ? AND position >= ?", (chat_id, keep))
            self._touch(db, chat_id)

    def set_system_prompt(self, chat_id: int, text: str) -> None:
        with self._db() as db:
            db.execute("UPDATE chats SET system_prompt = ? WHERE id = ?", (text, chat_id))

    def rename(self, chat_id: int, title: str) -> None:
        with self._db() as db:
            db.execute("UPDATE chats SET title = ? WHERE id = ?", (" ".join(title.split()), chat_id))

    def delete(self, chat_id: int) -> None:
        with self._db() as db:
            db.execute("DELETE FROM chats WHERE id = ?", (chat_id,))

    def list(self, search: str = "") -> list[StoredChat]:
        """Chats with at least one message, most recently written first; ``search`` matches the title or any
        message's text (case-insensitive)."""
        query = (
            "SELECT c.id, c.title, c.model, c.updated, COUNT(m.position),"
            " (SELECT content FROM messages f WHERE f.chat_id = c.id AND f.role = 'user'"
            "  ORDER BY f.position LIMIT 1)"
            " FROM chats c JOIN messages m ON m.chat_id = c.id"
        )
        args: tuple[str, ...] = ()
        if search.strip():
            like = f"%{_escape_like(search.strip())}%"
            query += (
                " WHERE c.title LIKE ? ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages s"
                " WHERE s.chat_id = c.id AND s.content LIKE ? ESCAPE '\\')"
            )
            args = (like, like)
        query += " GROUP BY c.id ORDER BY c.updated DESC, c.id DESC"
        with self._db() as db:
            rows = db.execute(query, args).fetchall()
        return [
            StoredChat(id, title or title_from([ChatMessage("user", first or "")]), model, updated, n)
            for id, title, model, updated, n, first in rows
        ]

    def load(self, chat_id: int) -> Conversation:
        with self._db() as db:
            row = db.execute(
                "SELECT title, model, system_prompt, created FROM chats WHERE id = ?", (chat_id,)
            ).fetchone()
            if row is None:
                raise CloverError(f"No chat {chat_id} in {self.path}: it was deleted.")
            messages = tuple(
                ChatMessage(role, content)
                for role, content in db.execute(
                    "SELECT role, content FROM messages WHERE chat_id = ? ORDER BY position", (chat_id,)
                )
            )
        title, model, system_prompt, created = row
        return Conversation(
            title=title or title_from(messages),
            messages=messages,
            system_prompt=system_prompt,
            model=model,
            created=created,
        )

    @staticmethod
    def _touch(db: sqlite3.Connection, chat_id: int) -> None:
        db.execute("UPDATE chats SET updated = ? WHERE id = ?", (now(), chat_id))


class ChatJournal:
    """One open chat's writes, done in order on one background thread. The chat row is made with the first
    message, so an empty chat leaves nothing behind. ``on_error`` is called (on that thread) with a
    CloverError when the disk refuses a write; the chat goes on in memory."""

    def __init__(self, store: ChatStore, on_error: Callable[[CloverError], None]) -> None:
        self.store = store
        self.on_error = on_error
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chat-journal")
        self._lock = threading.Lock()
        self._chat_id: int | None = None
        self._model = ""
        self._system_prompt = ""
        self._created = ""

    @property
    def chat_id(self) -> int | None:
        """The open chat's id once its first message is written (after :meth:`flush`)."""
        with self._lock:
            return self._chat_id

    def begin(self, model: str, system_prompt: str, chat_id: int | None = None, created: str = "") -> None:
        """Write to a new chat from now on (``chat_id`` None), or to a stored one."""

        def switch() -> None:
            with self._lock:
                self._chat_id = chat_id
                self._model, self._system_prompt, self._created = model, system_prompt, created

        self._submit(switch)

    def put(self, position: int, message: ChatMessage) -> None:
        self._submit(lambda: self.store.put(self._ensure_chat(), position, message))

    def truncate(self, keep: int) -> None:
        def write() -> None:
            if self._chat_id is not None:
                self.store.truncate(self._chat_id, keep)

        self._submit(write)

    def set_system_prompt(self, text: str) -> None:
        def write() -> None:
            self._system_prompt = text
            if self._chat_id is not None:
                self.store.set_system_prompt(self._chat_id, text)

        self._submit(write)

    def flush(self) -> None:
        """Wait until every write asked for so far is on disk."""
        self._submit(lambda: None).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _ensure_chat(self) -> int:
        with self._lock:
            if self._chat_id is None:
                self._chat_id = self.store.start(self._model, self._system_prompt, self._created)
            return self._chat_id

    def _submit(self, write: Callable[[], object]) -> Future[None]:
        def run() -> None:
            try:
                write()
            except CloverError as exc:
                self.on_error(exc)

        try:
            return self._pool.submit(run)
        except RuntimeError:  # closed: the screen is gone
            done: Future[None] = Future()
            done.set_result(None)
            return done


def _create_private(path: Path) -> None:
    """The folder (0700) and the file (0600), made private before SQLite writes anything in them."""
    make_private_dir(path.parent, close=True)
    if not path.exists():
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _store_error(path: Path, exc: Exception) -> CloverError:
    return CloverError(
        f"Could not write your chats to {path}: {exc}.",
        "Check that the folder is writable and the disk is not full, or set CLOVER_DATA_DIR to another folder.",
    )
