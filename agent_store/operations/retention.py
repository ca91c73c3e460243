"""Retention: purge expired sessions in batches, erase everything of one user.

Both take locks in the one order commits use (the user's lock, then session rows), so neither deadlocks with
a run committing at the same moment, and a racing commit lands wholly before the erasure or not at all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Row, Table, delete, exists, func, select, text, tuple_, update
from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

import agent_store.telemetry as telemetry
from agent_store.db import chains, codec, sealing, tenancy
from agent_store.db.database import Database
from agent_store.db.erasures import ERASURE_LOG_KEPT, user_key
from agent_store.db.hosted_tables import checkpoints_of
from agent_store.db.message_rows import ENCRYPTED
from agent_store.db.statements import lock_user
from agent_store.db.tables import (
    budgets_t,
    checkpoint_workflows_t,
    checkpoints_t,
    erasures_t,
    hosted_items_t,
    hosted_responses_t,
    messages_t,
    sessions_t,
    state_history_t,
    state_t,
    stream_events_t,
    streams_t,
    ui_snapshots_t,
    usage_t,
    user_state_t,
)
from agent_store.errors import ConfigurationError, InvalidValueError
from agent_store.models import ErasureReport

S, M, CP = sessions_t.c, messages_t.c, checkpoints_t.c
_BRANCH = sessions_t.alias("branch")  # a session whose base_id names another (0017)
BATCH_MESSAGES = 10_000  # messages one retention transaction deletes at most (see _within)
ERASE_BATCH = 500  # sessions one erasure transaction deletes at most


def _within(picked: Sequence[Row[Any, Any]], batch_messages: int) -> list[str]:
    """The first sessions of ``picked`` (id, next_seq) whose messages fit ``batch_messages``; at least one.

    ``next_seq`` counts every message a session ever had (truncated ones too): an upper bound, so a batch never
    deletes more than the budget, except a single session larger than it, which is a batch of its own."""
    ids: list[str] = []
    messages = 0
    for session_id, next_seq in picked:
        if ids and messages + next_seq > batch_messages:
            break
        ids.append(session_id)
        messages += next_seq
    return ids


async def _take(conn: AsyncConnection, picked: Sequence[Row[Any, Any]], batch_messages: int) -> tuple[list[str], int]:
    """This batch: (sessions to delete whole, messages deleted from the start of a session too big for one).

    A session with more than ``batch_messages`` messages left loses its oldest ``batch_messages`` per batch
    (under its row lock, which the caller holds; it is closed first, so no run commits to it, or revives it,
    meanwhile) until the rest fits a batch, then goes whole: no transaction deletes more than the budget."""
    ids = _within(picked, batch_messages)
    if len(ids) == 1 and picked[0].next_seq > batch_messages:
        low = (await conn.execute(select(func.min(M.seq)).where(M.session_id == ids[0]))).scalar_one()
        if low is not None and picked[0].next_seq - low > batch_messages:
            closed = {"closed_at": func.coalesce(S.closed_at, datetime.now(UTC))}
            await conn.execute(update(sessions_t).where(S.id == ids[0]).values(closed))
            oldest = delete(messages_t).where(M.session_id == ids[0], M.seq < low + batch_messages)
            return [], (await conn.execute(oldest)).rowcount
    return ids, 0


async def purge_expired(
    db: Database, batch_size: int, batch_messages: int, progress: Callable[[int], None] | None
) -> int:
    """Delete expired sessions in short transactions of at most ``batch_size`` sessions and ``batch_messages``
    messages; returns how many were deleted."""
    codec.check_int(batch_size, "batch_size", low=1, high=10_001)
    codec.check_int(batch_messages, "batch_messages", low=1, high=10_000_001)
    total, first = 0, True
    with telemetry.operation("purge") as span:
        while True:
            async with db.transaction(write=True, doing="purging expired sessions") as conn:
                # SKIP LOCKED (PostgreSQL): a session a live run is committing to is left for the next purge.
                picked = await conn.execute(
                    select(S.id, S.next_seq)
                    .where(S.expires_at <= datetime.now(UTC))
                    .where(~exists().where(chains.base_of(_BRANCH, sessions_t)))  # a base outlives its branches (0017)
                    .order_by(S.expires_at, S.id)
                    .limit(batch_size)
                    .with_for_update(skip_locked=True)
                )
                # A session too big for one batch is closed before its oldest messages go: a run that loaded it
                # before it expired cannot commit into it (and revive it) between two batches, its start gone.
                ids, trimmed = await _take(conn, picked.all(), batch_messages)
                if ids:  # messages, state, runs and tool calls cascade
                    # (the condition again, in this statement's snapshot: a branch made since the pick is seen)
                    no_branch = ~exists().where(chains.base_of(_BRANCH, sessions_t))
                    await conn.execute(delete(sessions_t).where(S.id.in_(ids), no_branch))
                if first and await _may_trim_erasures(conn):  # older than any backup a restore re-applies to
                    old = datetime.now(UTC) - ERASURE_LOG_KEPT
                    await conn.execute(delete(erasures_t).where(erasures_t.c.erased_at < old))
                # Run journals past their TTL (0019; their events cascade), a batch at a time, an ended run's or not
                J = streams_t.c
                expired = select(J.user_id, J.stream_id).where(J.expires_at <= datetime.now(UTC)).limit(batch_size)
                streams = (await conn.execute(delete(streams_t).where(tuple_(J.user_id, J.stream_id).in_(expired))))
            first = False
            if not ids and not trimmed and not streams.rowcount:
                break
            total += len(ids)
            if progress is not None:
                progress(len(ids))
        span.set_attribute("sessions", total)
    telemetry.sessions_purged.add(total)
    return total


async def _may_trim_erasures(conn: AsyncConnection) -> bool:
    """Whether this role may trim the erasure log: the application's role under docs/row-security.md's grants may
    not (only an operator's purge trims it; the app's leaves it for them)."""
    if conn.dialect.name != "postgresql":
        return True
    may = text("SELECT has_table_privilege(current_user, 'agent_erasures', 'DELETE')")
    return bool((await conn.execute(may)).scalar())


async def count_expired(db: Database) -> int:
    async with db.transaction(write=False, replica=True, doing="counting expired sessions") as conn:
        return int((await conn.execute(select(func.count()).where(S.expires_at <= datetime.now(UTC)))).scalar_one())


@tenancy.for_user  # under row-level security the application's role erases only what it names: the user
async def erase_user(
    db: Database, user_id: str, batch_messages: int, progress: Callable[[int], None] | None, *,
    again: bool = False,
) -> ErasureReport:
    """Delete every session, message, state row, user-scoped key, workflow checkpoint and AG-UI snapshot (scope
    = the user id) of ``user_id``.

    Sessions go in short transactions of at most ``ERASE_BATCH`` sessions and ``batch_messages`` messages, so no
    lock is held for long (a bigger session is closed and emptied oldest-first, see ``_take``); the last
    transaction finds no session left and deletes the user's own rows and
    leaves the fence. Every transaction takes the user's lock first (commits that create a session of the user
    or write its ``user:`` keys take it first too), then the session rows: a commit in flight on one of them
    lands wholly before its batch (and is erased) or finds the session gone. Sessions created while the erasure
    runs are erased by a later batch; after the last one, the fence refuses runs that loaded before it. An
    interrupted erasure leaves whole sessions (and at most one closed session missing its oldest messages): run
    it again to finish.

    ``again``: an erasure made before, re-applied to a restored copy (operations/backup.py). Its keys were
    destroyed then, so a store opened without keys may re-apply it (with keys, any left are destroyed again).
    """
    codec.check_id(user_id, "user_id", required=True)
    codec.check_int(batch_messages, "batch_messages", low=1, high=10_000_001)
    n = dict.fromkeys(("sessions", "messages", "state_rows", "usage_calls", "batches"), 0)
    if not again and db.settings.keys is None and await _has_sealed(db, user_id):
        raise ConfigurationError(
            f"user {user_id!r} has content sealed with per-user keys: erase with the store's keys (Store(keys=...), "
            "the CLI's $AGENT_STORE_KEYS) so that they are destroyed too (or a backup stays readable): nothing erased"
        )
    with telemetry.operation("erase_user"):
        # The user's keys go first (every copy of what they sealed, backups included, is unreadable from now on,
        # even if the rows' deletion is interrupted), and again at the end: a run that began meanwhile made one.
        n["keys_destroyed"] = await _shred(db, user_id)
        while True:
            async with db.transaction(write=True, doing="erasing a user") as conn:
                await lock_user(conn, user_id, exclusive=True)
                picked = await conn.execute(
                    select(S.id, S.next_seq)
                    .where(S.user_id == user_id)
                    .order_by(S.id)
                    .limit(ERASE_BATCH)
                    .with_for_update()
                )
                ids, trimmed = await _take(conn, picked.all(), batch_messages)
                if ids:
                    # The batch is the user's sessions up to the last id picked (the user's lock keeps others
                    # from creating one meanwhile): a range of the user's index, not a list of ids.
                    batch = (S.user_id == user_id) & (S.id <= ids[-1])
                    n["messages"] += await _count(conn, messages_t, batch)
                    n["state_rows"] += await _count(conn, state_t, batch)
                    n["usage_calls"] += await _count(conn, usage_t, batch)
                    await conn.execute(delete(sessions_t).where(batch))  # messages, state, runs, calls cascade
                elif not trimmed:
                    user_rows, checkpoints, n["hosted_responses"] = await _erase_user_rows(conn, user_id)
            n["batches"] += 1
            n["messages"] += trimmed
            if not ids and not trimmed:
                n["keys_destroyed"] += await _shred(db, user_id)
                return ErasureReport(user_id=user_id, user_state_rows=user_rows, checkpoints=checkpoints, **n)
            n["sessions"] += len(ids)
            if progress is not None:
                progress(len(ids))


async def _has_sealed(db: Database, user_id: str) -> bool:
    """Whether any row of the user's holds content sealed with per-user keys (db/sealing.py): a probe a table at a
    time, stopping at the first found (an unkeyed user's rows are all read once: an erasure reads them anyway)."""
    pg = db.dialect == "postgresql"

    def sealed(column: Any, key: str = sealing.SEALED) -> ColumnElement[bool]:
        return sealing.is_sealed(column, key, pg)  # type: ignore[no-any-return]

    mine, st, sh, us = S.user_id == user_id, state_t.c, state_history_t.c, user_state_t.c
    ev, hr = stream_events_t.c, hosted_responses_t.c
    probes = [
        select(M.seq).join(sessions_t, S.id == M.session_id).where(mine, sealed(M.body, ENCRYPTED)),
        select(st.key).join(sessions_t, S.id == st.session_id).where(mine, sealed(st.value)),
        select(sh.key).join(sessions_t, S.id == sh.session_id).where(mine, sealed(sh.value)),
        select(us.key).where(us.user_id == user_id, sealed(us.value)),
        select(CP.seq).where(checkpoints_of(CP.user_id, user_id), sealed(CP.payload)),
        select(hr.response_id).where(hr.user_id == user_id, sealed(hr.envelope)),
        select(ev.seq).where(ev.user_id == user_id, sealed(ev.event)),
        select(hosted_items_t.c.item_id).where(hosted_items_t.c.user_id == user_id, sealed(hosted_items_t.c.body)),
        select(ui_snapshots_t.c.thread_id).where(ui_snapshots_t.c.scope == user_id, sealed(ui_snapshots_t.c.snapshot)),
    ]
    async with db.transaction(write=False, doing="looking for a user's sealed content") as conn:
        for probe in probes:
            if (await conn.execute(probe.limit(1))).first() is not None:
                return True
    return False


async def _count(conn: AsyncConnection, table: Table, sessions: ColumnElement[bool]) -> int:
    """Rows of ``table`` in these sessions, counted session by session (an index range each, as the cascade
    deletes them): one count over hundreds of sessions may be planned as a scan of the whole table."""
    per_session = select(func.count()).where(table.c.session_id == S.id).scalar_subquery()
    found = await conn.execute(select(func.coalesce(func.sum(per_session), 0)).where(sessions))
    return int(found.scalar_one())


async def _erase_user_rows(conn: AsyncConnection, user_id: str) -> tuple[int, int, int]:
    """The user's rows outside sessions, and the fence (the erasure's last transaction): (user: keys, checkpoints,
    hosted responses)."""
    user_rows = (await conn.execute(delete(user_state_t).where(user_state_t.c.user_id == user_id))).rowcount
    # The user's checkpoints, and theirs per hosted workflow context (0018): exactly the prefix and a 24-character
    # hash (agentserver/foundry.py), never a longer owner that only starts with it.
    deleted = [(await conn.execute(delete(owner.table).where(checkpoints_of(owner, user_id)))).rowcount
               for owner in (checkpoints_t.c.user_id, checkpoint_workflows_t.c.user_id)]  # fmt: skip
    checkpoints = deleted[0]
    hosted = (await conn.execute(delete(hosted_responses_t).where(hosted_responses_t.c.user_id == user_id))).rowcount
    await conn.execute(delete(hosted_items_t).where(hosted_items_t.c.user_id == user_id))  # (links cascade)
    await conn.execute(delete(ui_snapshots_t).where(ui_snapshots_t.c.scope == user_id))  # AG-UI: scope = user
    await conn.execute(delete(streams_t).where(streams_t.c.user_id == user_id))  # run journals (0019; events cascade)
    await conn.execute(delete(budgets_t).where(budgets_t.c.scope == "user", budgets_t.c.subject == user_id))
    # A fence for runs still in flight: they loaded before now and may not write for this user after it.
    if conn.dialect.name == "postgresql":  # only forward, by a function the application's role may call (0026)
        await conn.execute(select(func.agent_store_erasure_fence(user_id)))
    else:
        fence = {"user_key": user_key(user_id), "erased_at": datetime.now(UTC)}
        upsert = sqlite.insert(erasures_t).on_conflict_do_update(index_elements=["user_key"], set_=fence)
        await conn.execute(upsert, fence)
    return user_rows, checkpoints, hosted


async def purge_checkpoints(db: Database, older_than: timedelta, *, keep_latest: bool, batch_size: int) -> int:
    """Delete checkpoints saved more than ``older_than`` ago, ``batch_size`` per short transaction; with
    ``keep_latest`` each workflow's latest checkpoint stays whatever its age (a paused workflow can resume)."""
    codec.check_int(batch_size, "batch_size", low=1, high=100_001)
    if not isinstance(older_than, timedelta) or older_than < timedelta(0):
        raise InvalidValueError(f"older_than must be a non-negative timedelta, not {older_than!r}")
    cutoff, total = datetime.now(UTC) - older_than, 0
    later = checkpoints_t.alias("later")
    newest = select(func.max(later.c.seq)).where(
        later.c.user_id == CP.user_id, later.c.workflow_name == CP.workflow_name
    )  # the unique (user_id, workflow_name, seq) index answers it
    old = select(CP.user_id, CP.checkpoint_id).where(CP.saved_at < cutoff).order_by(CP.saved_at).limit(batch_size)
    if keep_latest:
        old = old.where(CP.seq < newest.scalar_subquery())
    batch = delete(checkpoints_t).where(tuple_(CP.user_id, CP.checkpoint_id).in_(old))
    while True:
        async with db.transaction(write=True, doing="purging workflow checkpoints") as conn:
            deleted = (await conn.execute(batch)).rowcount
        total += deleted
        if deleted < batch_size:
            return total


async def _shred(db: Database, user_id: str) -> int:
    return await sealing.destroy(db, user_id) if db.settings.keys is not None else 0
