"""The journal's statements (migration 0019), built once and bound per call.

A batch on PostgreSQL is one statement, sent with no transaction around it (one round trip): the stream row
moves to the batch's last sequence number (only if it still stands where this writer left it: this owner,
``in_progress``, ``last_seq`` the batch's first minus one), then the events go in only if it did, then a NOTIFY
wakes the readers. On SQLite the same three steps are one transaction. Either way a batch lands whole or not at
all, after the one before it, and never after its run was ended elsewhere.
"""

from __future__ import annotations

import functools
from typing import Any

import aiosqlite
from sqlalchemy import BigInteger, String, Text, and_, bindparam, cast, exists, func, insert, select, update
from sqlalchemy.dialects.postgresql import JSONB

from agent_store.db import sealing
from agent_store.db.column_types import UTCDateTime
from agent_store.db.database import Database
from agent_store.db.driver_path import DriverPath
from agent_store.db.journal_tables import NOTIFY_CHANNEL, stream_events_t, streams_t
from agent_store.errors import StreamLostError
from agent_store.journal.listen import payload

__all__ = ["READ", "row_now", "send_batch"]
T, E = streams_t.c, stream_events_t.c
_MINE = (T.user_id == bindparam("user"), T.stream_id == bindparam("sid"), T.owner == bindparam("owner"),
         T.status == "in_progress", T.last_seq == bindparam("prev", type_=BigInteger))  # fmt: skip


def move_statement() -> Any:
    """The stream row's move to the batch's end (status: ``in_progress``, or the run's final one)."""
    return (update(streams_t).where(*_MINE)
            .values(last_seq=bindparam("last", type_=BigInteger), status=bindparam("status"),
                    error=bindparam("error"), owner=bindparam("next_owner"), lease_until=bindparam("lease"),
                    updated_at=bindparam("now"), expires_at=bindparam("expires"))
            .returning(T.cancel_requested))  # fmt: skip


@functools.cache
def batch_statement() -> Any:
    """PostgreSQL: the move, the events (``batch``: one JSON array, numbered from ``prev + 1``), the NOTIFY."""
    moved = move_statement().cte("moved")
    events = func.jsonb_array_elements(cast(bindparam("batch", type_=Text), JSONB))
    numbered = events.table_valued("value", with_ordinality="n").render_derived()
    rows = select(cast(bindparam("user"), String), cast(bindparam("sid"), String),
                  bindparam("prev", type_=BigInteger) + numbered.c.n, numbered.c.value)
    written = insert(stream_events_t).from_select(["user_id", "stream_id", "seq", "event"],
                                                  rows.where(exists(select(moved.c.cancel_requested))))
    notify = func.pg_notify(NOTIFY_CHANNEL, bindparam("payload", type_=Text))
    return select(moved.c.cancel_requested, notify.label("notified")).add_cte(written.cte("written"))


def _read() -> Any:
    """A stream's row and its events after ``after`` (at most ``n``; sequence numbers have no gap, so a range)."""
    window = and_(E.user_id == T.user_id, E.stream_id == T.stream_id, E.seq > bindparam("after", type_=BigInteger),
                  E.seq <= bindparam("after", type_=BigInteger) + bindparam("n", type_=BigInteger))  # fmt: skip
    query = select(T.status, T.last_seq, T.lease_until, T.error, T.kind, T.conversation_id, E.seq, E.event)
    query = query.select_from(streams_t.outerjoin(stream_events_t, window))
    return query.where(T.user_id == bindparam("user"), T.stream_id == bindparam("sid")).order_by(E.seq)


READ = _read()


# SQLite: the same batch in one hop to the connection's thread (as run/commit_sqlite.py commits a run).
_MOVE_SQLITE = """UPDATE agent_streams SET last_seq = :last, status = :status, error = :error, owner = :next_owner,
    lease_until = :lease, updated_at = :now, expires_at = :expires
WHERE user_id = :user AND stream_id = :sid AND owner = :owner AND status = 'in_progress' AND last_seq = :prev
RETURNING cancel_requested"""
_EVENT_SQLITE = "INSERT INTO agent_stream_events (user_id, stream_id, seq, event) VALUES (?, ?, ?, ?)"


class SqliteBatch:
    """``__call__(sqlite3 connection)``: the batch's transaction, in the connection's thread; its outcome as
    ``send_batch`` gives it (whether a cancel is asked; None if the stream row was not where it was left)."""

    def __init__(self, params: dict[str, Any], rows: list[tuple[str, str, int, str]]) -> None:
        self.params, self.rows = params, rows

    def __call__(self, conn: Any) -> bool | None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            moved = conn.execute(_MOVE_SQLITE, self.params).fetchone()
            if moved is not None and self.rows:
                conn.executemany(_EVENT_SQLITE, self.rows)
            conn.execute("COMMIT" if moved is not None else "ROLLBACK")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return None if moved is None else bool(moved[0])


_SQLITE_HOP = DriverPath.sqlite_thread_available(aiosqlite.Connection)  # else a SQLAlchemy transaction


async def send_batch(db: Database, params: dict[str, Any], batch: list[str]) -> bool | None:
    """One batch (``params``: the stream, this owner, ``prev``/``last``, the status and lease): whether a cancel
    is asked; None if the stream row was not where this writer left it (nothing was written)."""
    user, sid = params["user"], params["sid"]
    fence = functools.partial(_still_there, db, user, sid)
    if (cipher := await sealing.for_user(db, user, writing=True, fence=fence)) is not None:
        batch = [sealing.seal_json(cipher, event_row(sid, params["prev"] + n), text)  # per-user keys: each sealed
                 for n, text in enumerate(batch, start=1)]  # fmt: skip
    if db.dialect == "postgresql":
        rows = await db.one_statement(batch_statement(), {**params, "batch": "[" + ",".join(batch) + "]",
                                                          "payload": payload("batch", user, sid)},
                                      doing="writing a run's journal")  # fmt: skip
        return bool(rows[0].cancel_requested) if rows else None
    numbered = [(user, sid, params["prev"] + n, text) for n, text in enumerate(batch, start=1)]
    if _SQLITE_HOP:  # one hop to the connection's thread: the transaction whole
        to_text = UTCDateTime().bind_processor(db.engine.dialect)
        times = {k: to_text(params[k]) if to_text and params[k] is not None else params[k]
                 for k in ("lease", "now", "expires")}  # fmt: skip
        return await db.in_sqlite_thread(SqliteBatch({**params, **times}, numbered), doing="writing a run's journal",
                                         committing=lambda: None)  # fmt: skip
    async with db.transaction(write=True, doing="writing a run's journal") as conn:
        moved = (await conn.execute(move_statement(), params)).first()
        if moved is not None and numbered:
            keys = ("user_id", "stream_id", "seq", "event")
            await conn.execute(insert(stream_events_t), [dict(zip(keys, row, strict=True)) for row in numbered])
        return None if moved is None else bool(moved.cancel_requested)


async def row_now(db: Database, user: str, sid: str) -> Any:
    """The stream row's (last_seq, status, owner, cancel_requested) now, None if it is gone (erased, purged)."""
    async with db.transaction(write=False, doing="reading a run's journal") as conn:
        query = select(T.last_seq, T.status, T.owner, T.cancel_requested).where(T.user_id == user, T.stream_id == sid)
        return (await conn.execute(query)).first()


async def _still_there(db: Database, user: str, sid: str) -> None:
    """Before a first key of the user's is made (db/sealing.py ``ready``): a stream erased (or purged) meanwhile
    takes no more events, and must not leave a key behind for its erased user."""
    if await row_now(db, user, sid) is None:
        raise StreamLostError(f"stream {sid!r} is gone (erased, purged or ended): nothing more was written")


def event_row(stream_id: str, seq: int) -> str:
    """What a sealed event is bound to (db/sealing.py): its stream and its place in it."""
    return f"e\0{stream_id}\0{seq}"
