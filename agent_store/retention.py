"""Retention: purge expired sessions in batches, erase everything of one user.

Both take locks in the one order commits use (the user's lock, then session rows), so neither deadlocks with
a run committing at the same moment, and a racing commit lands wholly before the erasure or not at all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from . import codec, telemetry
from .database import Database
from .models import ErasureReport
from .statements import lock_user
from .tables import (
    checkpoint_workflows_t,
    checkpoints_t,
    erasures_t,
    messages_t,
    sessions_t,
    state_t,
    ui_snapshots_t,
    user_state_t,
)

S = sessions_t.c
FENCE_KEPT = timedelta(days=7)


def user_key(user_id: str) -> str:
    """What an erasure keeps of a user id: a SHA-256, enough to recognise the id, not to read it."""
    return hashlib.sha256(user_id.encode()).hexdigest()


async def erased_since(db: AsyncConnection, user_id: str, since: datetime) -> bool:
    """Whether the user was erased after ``since`` (a run's load): such a run may not write for the user."""
    e = erasures_t.c
    found = await db.execute(select(e.user_key).where(e.user_key == user_key(user_id), e.erased_at >= since))
    return found.first() is not None


async def purge_expired(db: Database, batch_size: int, progress: Callable[[int], None] | None) -> int:
    """Delete expired sessions, ``batch_size`` per short transaction; returns how many were deleted."""
    codec.check_int(batch_size, "batch_size", low=1, high=100_001)
    total = 0
    with telemetry.operation("purge") as span:
        while True:
            async with db.transaction(write=True, doing="purging expired sessions") as conn:
                # SKIP LOCKED (PostgreSQL): a session a live run is committing to is left for the next purge.
                batch = (
                    select(S.id)
                    .where(S.expires_at <= datetime.now(UTC))
                    .order_by(S.expires_at)
                    .limit(batch_size)
                    .with_for_update(skip_locked=True)
                )
                deleted = (await conn.execute(delete(sessions_t).where(S.id.in_(batch.scalar_subquery())))).rowcount
                if not total:  # erasure fences older than any run can be in flight
                    old = datetime.now(UTC) - FENCE_KEPT
                    await conn.execute(delete(erasures_t).where(erasures_t.c.erased_at < old))
            total += deleted
            if progress is not None:
                progress(deleted)
            if deleted < batch_size:
                break
        span.set_attribute("sessions", total)
    telemetry.sessions_purged.add(total)
    return total


async def count_expired(db: Database) -> int:
    async with db.transaction(write=False, replica=True, doing="counting expired sessions") as conn:
        return int((await conn.execute(select(func.count()).where(S.expires_at <= datetime.now(UTC)))).scalar_one())


async def erase_user(db: Database, user_id: str) -> ErasureReport:
    """Delete every session, message, state row, user-scoped key, workflow checkpoint and AG-UI snapshot (scope
    = the user id) of ``user_id``, in one transaction."""
    codec.check_id(user_id, "user_id", required=True)
    mine = select(S.id).where(S.user_id == user_id)
    count = func.count()
    async with db.transaction(write=True, doing="erasing a user") as conn:
        # The user's lock first (commits writing user: keys or creating a session of the user take it first
        # too), then the session rows: a commit in flight on one of them finishes before the counts below.
        await lock_user(conn, user_id, exclusive=True)
        sessions = len((await conn.execute(mine.with_for_update())).all())
        ids = mine.scalar_subquery()
        n_messages = (
            await conn.execute(select(count).select_from(messages_t).where(messages_t.c.session_id.in_(ids)))
        ).scalar_one()
        n_state = (
            await conn.execute(select(count).select_from(state_t).where(state_t.c.session_id.in_(ids)))
        ).scalar_one()
        n_user = (await conn.execute(delete(user_state_t).where(user_state_t.c.user_id == user_id))).rowcount
        await conn.execute(delete(sessions_t).where(S.user_id == user_id))  # messages, state, runs cascade
        n_checkpoints = (await conn.execute(delete(checkpoints_t).where(checkpoints_t.c.user_id == user_id))).rowcount
        await conn.execute(delete(checkpoint_workflows_t).where(checkpoint_workflows_t.c.user_id == user_id))
        await conn.execute(delete(ui_snapshots_t).where(ui_snapshots_t.c.scope == user_id))  # AG-UI: scope = user
        # A fence for runs still in flight: they loaded before now and may not write for this user after it.
        fence = {"user_key": user_key(user_id), "erased_at": datetime.now(UTC)}
        upsert = (postgresql if conn.dialect.name == "postgresql" else sqlite).insert(erasures_t)
        await conn.execute(upsert.on_conflict_do_update(index_elements=["user_key"], set_=fence), fence)
    return ErasureReport(
        user_id=user_id,
        sessions=sessions,
        messages=n_messages,
        state_rows=n_state,
        user_state_rows=n_user,
        checkpoints=n_checkpoints,
    )
