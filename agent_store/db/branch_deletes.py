"""Deleting sessions with the branches that read their history through them (migration 0017: a branch's base has no
foreign key, so the cascade is here), and a restart's delete, which never takes a live branch."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import delete, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db.chains import branches_of
from agent_store.db.scopes import owner_is
from agent_store.db.tables import sessions_t
from agent_store.errors import SessionExpiredError

__all__ = ["delete_if_expired", "delete_with_branches"]


async def delete_if_expired(db: AsyncConnection, session_id: str, user_id: str | None, now: datetime) -> None:
    """A restart's delete: the expired session, and its branches only if they all expired too. A branch still
    alive reads its history through it: the restart is refused (``SessionExpiredError``), nothing deleted."""
    c = sessions_t.c
    expired = (await db.execute(_locked(db, select(c.id).where(c.id == session_id, owner_is(c.user_id, user_id),
                                                               c.expires_at <= now)))).first()  # fmt: skip
    if expired is None:
        return
    branches = await _branches_of(db, [session_id])
    alive = (await db.execute(select(c.id).where(c.id.in_(branches), or_(c.expires_at.is_(None), c.expires_at > now))
                              .order_by(c.id).limit(1))).first() if branches else None  # fmt: skip
    if alive is not None:
        raise SessionExpiredError(f"session {session_id!r} expired, but its branch {alive.id!r} still reads its "
                                  "history: it cannot be restarted under its id until its branches are deleted or "
                                  "expire (nothing was deleted)")  # fmt: skip
    await delete_with_branches(db, [session_id])


def _locked(db: AsyncConnection, query: Any) -> Any:
    """On PostgreSQL, the rows FOR UPDATE: a branch being made takes its base FOR SHARE (operations/branching.py,
    run/points.py), so it commits before this reads the branches, or finds its base gone after."""
    return query.with_for_update() if db.dialect.name == "postgresql" else query


async def _branches_of(db: AsyncConnection, session_ids: list[str]) -> list[str]:
    """Every branch that reads its history through ``session_ids`` (transitively), each locked as it is found,
    the sessions themselves first."""
    c, found, frontier = sessions_t.c, [], list(session_ids)
    seen = set(frontier)
    await db.execute(_locked(db, select(c.id).where(c.id.in_(frontier))))
    while frontier:
        below = (await db.execute(_locked(db, select(c.id).where(branches_of(frontier))))).scalars().all()
        frontier = [sid for sid in below if sid not in seen]  # (a cycle, which no import lets in, ends here too)
        seen.update(frontier)
        found += frontier
    return found


async def delete_with_branches(db: AsyncConnection, session_ids: list[str]) -> int:
    """Delete sessions and every branch that reads its history through them (migration 0017: a branch's base has
    no foreign key, so the cascade is here). Returns how many of ``session_ids`` were deleted."""
    c = sessions_t.c
    if found := await _branches_of(db, session_ids):
        await db.execute(delete(sessions_t).where(c.id.in_(found)))
    return int((await db.execute(delete(sessions_t).where(c.id.in_(session_ids)))).rowcount)
