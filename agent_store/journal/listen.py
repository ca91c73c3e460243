"""Waking a journal's readers when a batch lands (journal/facade.py ``follow``).

PostgreSQL: every batch sends a NOTIFY (journal/statements.py) on ``NOTIFY_CHANNEL``; one connection per Journal
LISTENs and wakes the readers of that run. LISTEN holds its connection between transactions, which PgBouncer in
transaction mode cannot give: behind it (``pgbouncer=true``), readers poll, unless ``listen_url`` names the server
directly (NOTIFY itself passes through PgBouncer: it is sent inside the batch's statement). A reader never relies on
a wake-up alone: it also reads again at least every ``poll`` (a missed NOTIFY costs latency, never an event).
A cancel is a NOTIFY too: a writer of this worker hears it at once (else with its next batch or heartbeat).
SQLite: readers poll.

Anyone who can connect can LISTEN and NOTIFY on any channel (row-level security does not reach them), so a
payload names its run only by :func:`channel_key`, a hash that says neither the user nor the run, and a cancel
heard is only a reason to read the run's row (under its user's name): a forged one costs one read, never a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import weakref
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy.engine import make_url

from agent_store.db.database import Database
from agent_store.db.journal_tables import NOTIFY_CHANNEL

__all__ = ["Wakeups", "channel_key", "payload"]
log = logging.getLogger("agent_store.journal")


def channel_key(user: str, stream_id: str) -> str:
    """How a NOTIFY names a run: a hash of its user and id (a JSON pair: ids may hold any character)."""
    return hashlib.sha256(json.dumps([user, stream_id]).encode()).hexdigest()[:32]


def payload(head: str, user: str, stream_id: str) -> str:
    """A NOTIFY's payload: ``["batch" | "cancel", key]``."""
    return json.dumps([head, channel_key(user, stream_id)])


def _heard(text: str) -> tuple[str, str] | None:
    """(head, key) of a payload; one of an earlier version (``[head, user, stream_id]``) too; None if not ours."""
    try:
        found = json.loads(text)
    except ValueError:
        return None
    if isinstance(found, list) and all(isinstance(part, str) for part in found):
        if len(found) == 2:
            return found[0], found[1]
        if len(found) == 3:
            return found[0], channel_key(found[1], found[2])
    return None


class Wakeups:
    def __init__(self, db: Database, listen_url: str | None) -> None:
        self.db, self.listen_url = db, listen_url
        self.waiting: dict[str, set[asyncio.Event]] = {}  # by channel_key
        # This worker's live writers, told at once of a cancel asked on any worker (a NOTIFY "cancel ...").
        self.writers: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        self._checking: dict[str, asyncio.Task[None]] = {}  # a cancel heard: its row being read, once at a time
        self._conn: Any = None
        self._opening = asyncio.Lock()

    @property
    def live(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    def _can_listen(self) -> bool:
        if self.db.dialect != "postgresql":
            return False
        behind_pgbouncer = self.db.url.query.get("prepared_statement_cache_size") == "0"  # engine.py: pgbouncer=true
        return self.listen_url is not None or not behind_pgbouncer

    @contextlib.asynccontextmanager
    async def watch(self, user: str, stream_id: str) -> AsyncIterator[asyncio.Event]:
        woken, key = asyncio.Event(), channel_key(user, stream_id)
        self.waiting.setdefault(key, set()).add(woken)
        try:
            if self._can_listen() and not self.live:
                await self._open()
            yield woken
        finally:
            waiters = self.waiting.get(key, set())
            waiters.discard(woken)
            if not waiters:
                self.waiting.pop(key, None)

    async def _open(self) -> None:
        async with self._opening:
            if self.live:
                return
            import asyncpg

            # A connection of its own (LISTEN keeps it), to listen_url or the store's server; the store's own
            # connect_args (ssl, say) are not carried over: give listen_url for a server that needs them.
            url = make_url(self.listen_url) if self.listen_url is not None else self.db.url
            url = url.set(drivername="postgresql", query={})
            try:
                self._conn = await asyncpg.connect(url.render_as_string(hide_password=False), timeout=10)
                await self._conn.add_listener(NOTIFY_CHANNEL, self._notified)
            except (OSError, asyncpg.PostgresError, TimeoutError) as exc:  # readers poll instead: said, once
                log.warning("the run journal cannot LISTEN on %s (%s): its readers poll", self.db._where,
                            type(exc).__name__)  # fmt: skip
                await self.close()

    async def listen_for(self, user: str, stream_id: str, writer: Any) -> None:
        """Tell ``writer.cancel_seen()`` of a cancel asked anywhere, as it is asked (PostgreSQL, when listening)."""
        self.writers[channel_key(user, stream_id)] = writer
        if self._can_listen() and not self.live:
            await self._open()

    def _notified(self, connection: Any, pid: int, channel: str, text: str) -> None:
        if (heard := _heard(text)) is None:  # not one of ours (someone else's NOTIFY on the channel): no wake-up
            log.warning("the run journal's channel carried a payload it does not know: %r", text[:80])
            return
        head, key = heard
        if head == "cancel":
            if (writer := self.writers.get(key)) is not None and key not in self._checking:
                self._checking[key] = asyncio.get_running_loop().create_task(self._check_cancel(key, writer))
            return
        for woken in self.waiting.get(key, ()):
            woken.set()

    async def _check_cancel(self, key: str, writer: Any) -> None:
        """A cancel heard for ``writer``'s run: its row says whether one was asked (anyone can NOTIFY)."""
        try:
            if await writer.journal.cancel_asked(writer.stream_id, user_id=writer.user or None):
                writer.cancel_seen()
        except Exception as exc:  # said, not lost: its next batch or heartbeat brings the cancel anyway
            log.warning("the run journal could not read a run's cancel (%s): its next batch brings it",
                        type(exc).__name__)
        finally:
            self._checking.pop(key, None)

    async def close(self) -> None:
        for checking in list(self._checking.values()):
            checking.cancel()
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            await conn.close(timeout=5)
