"""Waking a journal's readers when a batch lands (journal/facade.py ``follow``).

PostgreSQL: every batch sends a NOTIFY (journal/statements.py) on ``NOTIFY_CHANNEL``; one connection per Journal
LISTENs and wakes the readers of that run. LISTEN holds its connection between transactions, which PgBouncer in
transaction mode cannot give: behind it (``pgbouncer=true``), readers poll, unless ``listen_url`` names the server
directly (NOTIFY itself passes through PgBouncer: it is sent inside the batch's statement). A reader never relies on
a wake-up alone: it also reads again at least every ``poll`` (a missed NOTIFY costs latency, never an event).
A cancel is a NOTIFY too: a writer of this worker hears it at once (else with its next batch or heartbeat).
SQLite: readers poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import weakref
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy.engine import make_url

from agent_store.db.database import Database
from agent_store.db.journal_tables import NOTIFY_CHANNEL

__all__ = ["Wakeups"]
log = logging.getLogger("agent_store.journal")


class Wakeups:
    def __init__(self, db: Database, listen_url: str | None) -> None:
        self.db, self.listen_url = db, listen_url
        self.waiting: dict[tuple[str, str], set[asyncio.Event]] = {}
        # This worker's live writers, told at once of a cancel asked on any worker (a NOTIFY "cancel ...").
        self.writers: weakref.WeakValueDictionary[tuple[str, str], Any] = weakref.WeakValueDictionary()
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
        woken = asyncio.Event()
        self.waiting.setdefault((user, stream_id), set()).add(woken)
        try:
            if self._can_listen() and not self.live:
                await self._open()
            yield woken
        finally:
            waiters = self.waiting.get((user, stream_id), set())
            waiters.discard(woken)
            if not waiters:
                self.waiting.pop((user, stream_id), None)

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
        self.writers[(user, stream_id)] = writer
        if self._can_listen() and not self.live:
            await self._open()

    def _notified(self, connection: Any, pid: int, channel: str, payload: str) -> None:
        try:
            head, user, stream_id = json.loads(payload)
        except (ValueError, TypeError):  # not one of ours (someone else's NOTIFY on the channel): no wake-up
            log.warning("the run journal's channel carried a payload it does not know: %r", payload[:80])
            return
        if head == "cancel":
            if (writer := self.writers.get((user, stream_id))) is not None:
                writer.cancel_seen()
            return
        for woken in self.waiting.get((user, stream_id), ()):
            woken.set()

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            await conn.close(timeout=5)
