"""Per-user data keys (issue 41): the key provider interface, and the default, a local key file.

A store opened with ``keys=`` seals each user's message and state content with that user's own data key
(db/sealing.py), and ``erase_user`` destroys the key with the rows: every copy of the content still somewhere,
a backup taken before the erasure included, can then never be read again (crypto-shredding).

So **the keys must not live in the database they protect**: a backup of the database would hold them too.
``KeyFile`` keeps them in a SQLite file of their own, beside the application. A deployment with a KMS plugs in
its own provider: three coroutines, below. A provider may keep a user's keys in memory for a while, but must
hand out none of them once ``destroy`` has returned.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import sqlite3
import threading
import time
from pathlib import Path
from typing import Protocol, runtime_checkable

from agent_store.errors import ConfigurationError

KEY_BYTES = 32  # AES-256-GCM


@runtime_checkable
class KeyProvider(Protocol):
    """Where each user's data keys come from. A user id of ``""`` is the store's no-user owner."""

    async def keys(self, user_id: str) -> dict[str, bytes]:
        """Every live data key of ``user_id`` by key id (``{}`` for none): old ones still open what they sealed."""
        ...

    async def new_key(self, user_id: str) -> tuple[str, bytes]:
        """A new data key for ``user_id``, and its id: what is sealed from now on."""
        ...

    async def destroy(self, user_id: str) -> int:
        """Destroy every key of ``user_id`` for good; how many there were."""
        ...


class KeyFile:
    """Data keys in a local SQLite file (created ``0600``), one row a key, the user named by the SHA-256 of
    their id (the file lists no user ids).

    ``destroy`` deletes the rows with ``secure_delete`` on, so SQLite overwrites the freed bytes with zeros, in a
    rollback journal that is deleted at commit (no WAL, which would keep a copy until a checkpoint). A copy of
    the file (a backup, a snapshot of the disk) keeps what it held: back this file up apart from the database,
    on a shorter retention than the longest time an erasure may take to reach every copy.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()  # one connection, used from worker threads one at a time
        self._conn: sqlite3.Connection | None = None

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)  # never readable by others, even briefly
                os.close(fd)
                conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
                conn.execute("PRAGMA secure_delete = ON")
                conn.execute("PRAGMA journal_mode = DELETE")
                conn.execute("PRAGMA busy_timeout = 5000")  # several processes may share the file
                conn.execute("CREATE TABLE IF NOT EXISTS agent_store_keys (key_id TEXT PRIMARY KEY, "
                             "owner TEXT NOT NULL, key BLOB NOT NULL)")  # fmt: skip
                conn.execute("CREATE INDEX IF NOT EXISTS agent_store_keys_owner ON agent_store_keys (owner)")
            except (OSError, sqlite3.Error) as exc:
                raise ConfigurationError(f"the key file {str(self.path)!r} cannot be used: {exc}") from exc
            self._conn = conn
        return self._conn

    def _run(self, sql: str, *args: object) -> list[tuple[object, ...]]:
        with self._lock:
            conn = self._connection()
            try:
                return conn.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise ConfigurationError(f"the key file {str(self.path)!r} failed: {exc}") from exc

    async def keys(self, user_id: str) -> dict[str, bytes]:
        rows = await asyncio.to_thread(self._run, "SELECT key_id, key FROM agent_store_keys WHERE owner = ?",
                                       _owner(user_id))  # fmt: skip
        return {str(key_id): bytes(key) for key_id, key in rows}  # type: ignore[call-overload]

    async def new_key(self, user_id: str) -> tuple[str, bytes]:
        key_id = f"{time.time_ns():x}{secrets.token_hex(4)}"  # sorts by age: the newest seals
        key = secrets.token_bytes(KEY_BYTES)
        await asyncio.to_thread(self._run, "INSERT INTO agent_store_keys VALUES (?, ?, ?)", key_id, _owner(user_id),
                                key)  # fmt: skip
        return key_id, key

    async def destroy(self, user_id: str) -> int:
        rows = await asyncio.to_thread(self._run, "DELETE FROM agent_store_keys WHERE owner = ? RETURNING key_id",
                                       _owner(user_id))  # fmt: skip
        return len(rows)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _owner(user_id: str) -> str:
    return hashlib.sha256(user_id.encode()).hexdigest()
