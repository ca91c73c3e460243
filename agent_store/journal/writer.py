"""Writing a run's journal: its events numbered 1, 2, 3, ... and sent in batches (journal/statements.py).

The batch rule: a batch goes when it holds ``batch_events`` events, or ``batch_ms`` after its first event, or
when the run ends; with no event for ``heartbeat_s``, an empty batch renews the lease (and brings a cancel asked
elsewhere). One batch is one round trip on PostgreSQL, one transaction on SQLite. A batch whose outcome is
unknown (the connection dropped) is read back before anything else is sent: the stream row says whether it
landed. The journal is not the transcript: the run's commit stays its one transaction, and nothing here waits
for it or is waited for by it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import aiosqlite
from sqlalchemy import insert, select

from agent_store.db import codec
from agent_store.db.column_types import UTCDateTime
from agent_store.db.database import Database
from agent_store.db.driver_path import DriverPath
from agent_store.db.journal_tables import STATUSES, stream_events_t, streams_t
from agent_store.errors import InvalidValueError, StorageUnavailableError, StreamLostError
from agent_store.journal.statements import SqliteBatch, batch_statement, move_statement

__all__ = ["StreamWriter"]
T = streams_t.c
_SQLITE_HOP = DriverPath.sqlite_thread_available(aiosqlite.Connection)  # else a SQLAlchemy transaction


class Journal(Protocol):
    """What a writer reads of its journal (facade.py's ``Journal``)."""

    db: Database
    owner: str
    batch_events: int
    batch_ms: int
    lease_s: float
    ttl_s: float
    heartbeat_s: float
    max_event_bytes: int


class StreamWriter:
    """The one writer of a streamed run's journal (``Journal.start`` makes it). ``async with`` ends it: completed,
    or failed (cancelled) if the block raised (was cancelled)."""

    def __init__(self, journal: Journal, user: str, stream_id: str) -> None:
        self.journal, self.user, self.stream_id = journal, user, stream_id
        self.last_seq = 0  # the last sequence number given out
        self.cancel_requested = False  # a cancel was asked elsewhere (seen with the last batch)
        self.on_cancel: Callable[[], Any] | None = None  # called once, when a batch first brings a cancel
        self._sent = 0  # the last sequence number known written
        self._pending: list[str] = []
        self._lock = asyncio.Lock()
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: asyncio.Task[None] | None = None
        self._beat: asyncio.Task[None] | None = None
        self._ended = False
        self._error: BaseException | None = None

    async def __aenter__(self) -> StreamWriter:
        return self

    async def __aexit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if self._ended:
            return
        if exc is None:
            await self.finish("completed")
        elif isinstance(exc, asyncio.CancelledError) or self.cancel_requested:
            await asyncio.shield(self.finish("cancelled"))
        else:
            await self.finish("failed", error=type(exc).__name__)

    def cancel_seen(self) -> None:
        """A cancel was asked (a batch brought it, or a NOTIFY): ``on_cancel`` is called once."""
        if self.cancel_requested or self._ended:
            return
        self.cancel_requested = True
        if self.on_cancel is not None:
            self.on_cancel()

    def start_heartbeat(self) -> None:
        self._beat = asyncio.get_running_loop().create_task(self._heartbeat())

    async def append(self, event: Any) -> int:
        """Number ``event`` (a JSON document) and queue it; returns its sequence number."""
        if self._ended:
            raise InvalidValueError(f"stream {self.stream_id!r} has ended: no more events")
        if self._error is not None:
            raise self._error
        text = codec.dumps(event, where=f"stream {self.stream_id!r} event", max_bytes=self.journal.max_event_bytes,
                           sort_keys=False)  # fmt: skip
        self._pending.append(text)
        self.last_seq += 1
        if len(self._pending) >= self.journal.batch_events:
            await self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.journal.batch_ms / 1000, self._due)
        return self.last_seq

    def _due(self) -> None:
        self._timer = None
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.get_running_loop().create_task(self._quietly_flush())

    async def _quietly_flush(self) -> None:
        try:
            await self.flush()
        except Exception as exc:  # kept: the next append or finish raises it
            self._error = exc

    async def _heartbeat(self) -> None:
        while not self._ended:
            await asyncio.sleep(self.journal.heartbeat_s)
            await self._quietly_flush()

    async def flush(self, status: str = "in_progress", error: str | None = None) -> None:
        """Send what is queued (maybe nothing: a heartbeat) as one batch; ``status`` other than in_progress ends
        the run with it."""
        async with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            batch, self._pending = self._pending, []
            prev = self._sent
            await self._send(batch, prev, status, error)
            self._sent = prev + len(batch)

    async def _send(self, batch: list[str], prev: int, status: str, error: str | None) -> None:
        journal, now = self.journal, datetime.now(UTC)
        last = prev + len(batch)
        final = status != "in_progress"
        params = {"user": self.user, "sid": self.stream_id, "owner": journal.owner, "prev": prev, "last": last,
                  "status": status, "error": error, "next_owner": None if final else journal.owner,
                  "lease": None if final else now + timedelta(seconds=journal.lease_s), "now": now,
                  "expires": now + timedelta(seconds=journal.ttl_s)}  # fmt: skip
        for attempt in range(3):
            try:
                found = await self._one_batch(params, batch)
            except StorageUnavailableError:
                if attempt == 2:
                    raise
                if await self._landed(last, status):  # its reply was lost, not the batch
                    return
                await asyncio.sleep(0.05 * (attempt + 1))
                continue
            if found is None:
                if await self._landed(last, status):
                    return
                raise StreamLostError(f"stream {self.stream_id!r} is no longer this writer's (its lease ran out "
                                      "and it was marked incomplete, or it was ended): the batch was not written")
            if found:
                self.cancel_seen()
            return

    async def _one_batch(self, params: dict[str, Any], batch: list[str]) -> bool | None:
        """The batch's outcome: whether a cancel is asked, None if the stream row was not where it was left."""
        db = self.journal.db
        if db.dialect == "postgresql":
            payload = f"{params['last']} {self.user}\x1f{self.stream_id}"
            rows = await db.one_statement(batch_statement(), {**params, "batch": "[" + ",".join(batch) + "]",
                                                              "payload": payload}, doing="writing a run's journal")
            return bool(rows[0].cancel_requested) if rows else None
        if _SQLITE_HOP:  # one hop to the connection's thread: the transaction whole
            to_text = UTCDateTime().bind_processor(db.engine.dialect)
            times = {k: to_text(params[k]) if to_text and params[k] is not None else params[k]
                     for k in ("lease", "now", "expires")}  # fmt: skip
            rows = [(self.user, self.stream_id, params["prev"] + n, text) for n, text in enumerate(batch, start=1)]
            work = SqliteBatch({**params, **times}, rows)
            return await db.in_sqlite_thread(work, doing="writing a run's journal", committing=lambda: None)
        async with db.transaction(write=True, doing="writing a run's journal") as conn:
            moved = (await conn.execute(move_statement(), params)).first()
            if moved is None:
                return None
            if batch:
                await conn.execute(insert(stream_events_t), [
                    {"user_id": self.user, "stream_id": self.stream_id, "seq": params["prev"] + n, "event": text}
                    for n, text in enumerate(batch, start=1)])  # fmt: skip
            return bool(moved.cancel_requested)

    async def _landed(self, last: int, status: str) -> bool:
        async with self.journal.db.transaction(write=False, doing="reading a run's journal") as conn:
            row = (await conn.execute(select(T.last_seq, T.status, T.owner).where(
                T.user_id == self.user, T.stream_id == self.stream_id))).first()  # fmt: skip
        if row is None:
            return False
        mine = row.owner == self.journal.owner or (status != "in_progress" and row.status == status)
        return bool(mine and row.last_seq >= last and (row.status == status or status == "in_progress"))

    async def finish(self, status: str = "completed", *, error: str | None = None) -> None:
        """Send the rest and end the run with ``status`` (completed, failed, cancelled, incomplete)."""
        if status not in STATUSES or status == "in_progress":
            raise InvalidValueError(f"a run ends {', '.join(STATUSES[1:])}, not {status!r}")
        if self._ended:
            return
        if self._beat is not None:
            self._beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beat
        try:
            await self.flush(status, error)
        finally:
            self._ended = True
