"""A run's journal (migration 0019): ``store.journal``. One run's data flow:

    writer = await store.journal.start(stream_id, user_id=..., kind="agui")   # the stream row, in_progress
    async with writer:                                    # completed at the end; failed / cancelled on raise
        async for event in the run:
            await writer.append(event)                    # numbered 1, 2, 3, ...; sent in batches (writer.py)
            if writer.cancel_requested: break             # asked from any worker: journal.cancel(stream_id)
    ...
    async for event in store.journal.follow(stream_id, user_id=..., after=n):   # any worker: after n, then live
        ...

A worker that starts (``recover()``) marks every run whose lease ran out ``incomplete``, and its own (a
restarted worker's, by its ``worker_id``) too: none is left ``in_progress`` after its worker died.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite

from agent_store.db import codec, sealing, tenancy
from agent_store.db.database import Database
from agent_store.db.journal_tables import NOTIFY_CHANNEL, streams_t
from agent_store.errors import AgentStoreError, InvalidValueError, StreamBusyError, StreamNotFoundError
from agent_store.journal.listen import Wakeups, payload
from agent_store.journal.statements import READ, event_row, row_now
from agent_store.journal.writer import StreamWriter

__all__ = ["Journal", "JournalEvent"]
log = logging.getLogger("agent_store.journal")
T = streams_t.c
LOST = "its worker stopped before the run ended (its lease ran out, or the worker restarted)"


@functools.cache
def _starting(dialect: str) -> Any:
    """A run's row, unless its id is taken: one statement (on the driver path, no transaction around it)."""
    values = {column.name: bindparam(column.name, type_=column.type) for column in streams_t.c}
    made = (postgresql if dialect == "postgresql" else sqlite).insert(streams_t).values(values)
    return made.on_conflict_do_nothing().returning(T.stream_id)


@dataclass(frozen=True)
class JournalEvent:
    seq: int
    event: Any


class Journal:
    """A store's run journal. ``worker_id``: this worker's stable name (a restarted worker recovers its own runs at
    once); by default host and process id, unique to this process."""

    def __init__(self, db: Database, *, worker_id: str | None = None, batch_events: int = 64, batch_ms: float = 50,
                 lease_s: float = 30.0, ttl_s: float = 86_400.0, poll_s: float = 0.1,
                 listen_url: str | None = None) -> None:  # fmt: skip
        codec.check_id(worker_id, "worker_id")
        codec.check_int(batch_events, "batch_events", low=1, high=10_000)
        for name, value, top in (("batch_ms", batch_ms, 60_000), ("lease_s", lease_s, 86_400), ("ttl_s", ttl_s, 1e9),
                                 ("poll_s", poll_s, 60)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= top:
                raise InvalidValueError(f"{name} must be a number above 0 and at most {top}, not {value!r}"[:200])
        if lease_s < 0.3:
            raise InvalidValueError(f"lease_s must be at least 0.3 s (a third of it between heartbeats), not {lease_s}")
        self.db = db
        self.live: set[StreamWriter] = set()  # this journal's writers not yet ended (close() ends them)
        self.detached: set[Any] = set()  # its detached runs still going (detached.py; close() stops them)
        self.owner = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.batch_events, self.batch_ms, self.lease_s, self.ttl_s = batch_events, batch_ms, lease_s, ttl_s
        self.heartbeat_s = min(lease_s / 3, 2.0)
        self.max_event_bytes = db.settings.max_value_bytes
        self.poll_s = poll_s
        self.wakeups = Wakeups(db, listen_url)

    @tenancy.for_user
    async def start(self, stream_id: str, *, user_id: str | None, kind: str = "updates",
                    conversation_id: str | None = None) -> StreamWriter:  # fmt: skip
        """A new streamed run, ``in_progress``, written by this worker (a stream id is used once per user)."""
        codec.check_id(stream_id, "stream_id", required=True)
        codec.check_id(user_id, "user_id")
        codec.check_id(conversation_id, "conversation_id")
        if not isinstance(kind, str) or not 0 < len(kind) <= 32:
            raise InvalidValueError(f"kind must be a name of 1 to 32 characters, not {kind!r}"[:200])
        now, user = datetime.now(UTC), user_id or ""
        row = {"user_id": user, "stream_id": stream_id, "conversation_id": conversation_id, "kind": kind,
               "status": "in_progress", "last_seq": 0, "owner": self.owner, "cancel_requested": False,
               "lease_until": now + timedelta(seconds=self.lease_s), "created_at": now, "updated_at": now,
               "expires_at": now + timedelta(seconds=self.ttl_s)}  # fmt: skip
        for _ in range(3):
            made = await self.db.one_statement(_starting(self.db.dialect), row, doing="starting a run's journal",
                                               committing=lambda: None)  # one round trip  # fmt: skip
            if made:
                break
            await self._refused(stream_id, user_id, kind, conversation_id)  # raises, or the way is clear now
        else:
            raise StreamBusyError(f"conversation {conversation_id!r} keeps having a run in progress: try again")
        writer = StreamWriter(self, user, stream_id)
        writer.start_heartbeat()
        await self.wakeups.listen_for(user, stream_id, writer)
        return writer

    async def _refused(self, stream_id: str, user_id: str | None, kind: str, conversation_id: str | None) -> None:
        """Why a start was refused: its id is taken, or (an AG-UI run) its thread has a run in progress. A run
        in the way whose worker died (its lease ran out) is ended ``incomplete`` here, and one that ended since
        is gone: then the start is tried again."""
        if await row_now(self.db, user_id or "", stream_id) is not None:
            raise StreamBusyError(f"stream {stream_id!r} exists already: a run's stream id is used once")
        live = await self.live_run(conversation_id, user_id=user_id, kind=kind) if conversation_id else None
        if live is not None and not await self.recover(stream_id=live, user_id=user_id):
            raise StreamBusyError(f"conversation {conversation_id!r} has a run in progress ({live!r}): follow it,"
                                  " or start when it has ended", live_stream_id=live)  # fmt: skip

    @tenancy.for_user
    async def read(self, stream_id: str, *, user_id: str | None, after: int = 0,
                   limit: int = 500) -> tuple[list[JournalEvent], dict[str, Any]]:  # fmt: skip
        """The events after ``after`` (at most ``limit``) and the run's row (status, last_seq, lease_until, ...)."""
        codec.check_id(stream_id, "stream_id", required=True)
        codec.check_int(after, "after", low=0, high=codec.INT64)
        codec.check_int(limit, "limit", low=1, high=100_000)
        params = {"user": user_id or "", "sid": stream_id, "after": after, "n": limit}
        rows = await self.db.one_statement(READ, params, doing="reading a run's journal")
        if not rows:
            raise StreamNotFoundError(f"no stream {stream_id!r} for this user")
        head = rows[0]
        info = {"status": head.status, "last_seq": int(head.last_seq), "lease_until": head.lease_until,
                "error": head.error, "kind": head.kind, "conversation_id": head.conversation_id}  # fmt: skip
        cipher = await sealing.for_user(self.db, user_id, writing=False)  # sealed events (keys=): opened
        return [JournalEvent(int(r.seq), sealing.open_json(cipher, event_row(stream_id, int(r.seq)), r.event)[0])
                for r in rows if r.seq is not None], info  # fmt: skip

    @tenancy.for_user
    async def live_run(self, conversation_id: str, *, user_id: str | None, kind: str | None = None) -> str | None:
        """The id of the conversation's latest run still ``in_progress`` (of ``kind``, if given), or None."""
        codec.check_id(conversation_id, "conversation_id", required=True)
        query = select(T.stream_id).where(T.user_id == (user_id or ""), T.conversation_id == conversation_id,
                                          T.status == "in_progress")  # fmt: skip
        if kind is not None:
            query = query.where(T.kind == kind)
        async with self.db.transaction(write=False, doing="finding a conversation's live run") as conn:
            found = (await conn.execute(query.order_by(T.created_at.desc(), T.stream_id.desc()).limit(1))).first()
        return None if found is None else str(found[0])

    async def follow(self, stream_id: str, *, user_id: str | None, after: int = 0) -> AsyncIterator[JournalEvent]:
        """Every event after ``after``, then each new one as it is written, until the run has ended and all are
        read. A run whose writer's lease ran out is marked ``incomplete`` here, and the following ends."""
        user = user_id or ""
        async with self.wakeups.watch(user, stream_id) as woken:
            while True:
                events, info = await self.read(stream_id, user_id=user_id, after=after)
                for item in events:
                    yield item
                    after = item.seq
                if info["status"] != "in_progress" and after >= info["last_seq"]:
                    return
                if events:
                    continue
                lease = info["lease_until"]
                if lease is not None and lease < datetime.now(UTC):
                    await self.recover(stream_id=stream_id, user_id=user_id)
                    continue
                woken.clear()
                # Woken by a NOTIFY (PostgreSQL), or read again after a while anyway: a lost wake-up is latency.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), 1.0 if self.wakeups.live else self.poll_s)

    @tenancy.for_user
    async def cancel(self, stream_id: str, *, user_id: str | None) -> bool:
        """Ask the run to stop; False if it has ended. Its writer hears it at once on PostgreSQL (a NOTIFY), else
        with its next batch or heartbeat."""
        codec.check_id(stream_id, "stream_id", required=True)
        codec.check_id(user_id, "user_id")
        mine = (T.user_id == (user_id or ""), T.stream_id == stream_id, T.status == "in_progress")
        for _ in range(3):
            async with self.db.transaction(write=True, doing="cancelling a run") as conn:
                done = await conn.execute(update(streams_t).where(*mine)
                                          .values(cancel_requested=True, updated_at=datetime.now(UTC)))  # fmt: skip
                if done.rowcount and conn.dialect.name == "postgresql":  # its writer's worker hears it at once
                    asked = payload("cancel", user_id or "", stream_id)
                    await conn.execute(select(func.pg_notify(NOTIFY_CHANNEL, asked)))
            if done.rowcount:
                return True
            row = await row_now(self.db, user_id or "", stream_id)
            if row is None:
                raise StreamNotFoundError(f"no stream {stream_id!r} for this user")
            if row.status != "in_progress":
                return False
            # Started between the update and this read (its row was not there, now it is): ask again.
        raise StreamBusyError(f"stream {stream_id!r} could not be cancelled: try again")

    @tenancy.for_user
    async def cancel_asked(self, stream_id: str, *, user_id: str | None) -> bool:
        """Whether a cancel was asked for the run (a light read: detached.py's watch where no NOTIFY comes)."""
        row = await row_now(self.db, user_id or "", stream_id)
        return bool(row is not None and row.cancel_requested)

    @tenancy.for_user
    async def recover(self, *, stream_id: str | None = None, user_id: str | None = None) -> int:
        """Mark ``incomplete`` every run whose writer is gone: its lease ran out, or it is this worker's own (a
        worker that restarted under its ``worker_id`` has no live run yet). Returns how many."""
        now = datetime.now(UTC)
        if stream_id is None:  # at start-up: every run whose lease ran out, and this worker's own
            gone = or_(T.lease_until < now, T.owner == self.owner)
        else:  # one run a reader follows: only if its lease ran out (its writer may be this worker, alive)
            gone = (T.user_id == (user_id or "")) & (T.stream_id == stream_id) & (T.lease_until < now)
        query = update(streams_t).where(T.status == "in_progress", gone)
        query = query.values(status="incomplete", error=LOST, owner=None, lease_until=None, updated_at=now)
        async with self.db.transaction(write=True, doing="recovering runs") as conn:
            return int((await conn.execute(query)).rowcount)

    async def close(self) -> None:
        """Stop listening; a detached run still going is stopped, and a writer not yet ended is ended, both
        ``incomplete`` (the run stops with this worker)."""
        for run in list(self.detached):
            run.hard("incomplete")
            if run.task is not None:
                await asyncio.gather(run.task, return_exceptions=True)  # its end is in its journal
        for writer in list(self.live):
            try:
                await writer.finish("incomplete", error="the journal was closed before the run ended")
            except AgentStoreError as exc:  # its lease runs out instead: a reader marks it incomplete
                log.warning("stream %r was not ended at close (%s)", writer.stream_id, exc)
        await self.wakeups.close()

