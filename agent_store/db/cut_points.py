"""What a cut (truncate, clear) or a delete does to the keys naming points of a session (0017, 0018).

A response key past the cut goes with the messages it named. A session's own id frozen as a point (the first
request of a served conversation is stored under its response id, which is frozen where the head was once
another key is recorded on the session) stays, naming nothing (``GONE``): without its row, that id would fall
back to naming the session's head, a different history. A moving key (0018) stays on the head. A deleted key's
children (in the session and its branches) keep its key in ``parent_id`` (0021: their ``parent``, its row number,
would name nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, delete, exists, func, or_, select, true, update
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db.branch_deletes import delete_with_branches
from agent_store.db.chains import CHAIN_MAX, branches_of
from agent_store.db.history_tables import insert_row
from agent_store.db.scopes import owner_is
from agent_store.db.tables import responses_t, sessions_t

__all__ = ["CHAIN_MAX", "GONE", "RESPONSE_LOCK", "cut_points", "forget_head", "forget_point"]
RESPONSE_LOCK = 4  # advisory lock class of a response key (SESSION_LOCK, USER_LOCK, APP_LOCK are 1-3)
GONE = -1  # seq_end and version of a frozen own id whose history was cut or which was deleted
_R = responses_t.c


Rows = Callable[[Any], tuple[ColumnElement[bool], ...]]  # the rows of a session to delete, on a table's columns


async def _delete(conn: AsyncConnection, session_id: str, rows: Rows) -> None:
    gone = responses_t.alias("gone")
    branches = select(sessions_t.c.id).where(branches_of(session_id))
    key = select(gone.c.response_id).where(gone.c.session_id == session_id, gone.c.id == _R.parent)
    await conn.execute(update(responses_t).where(
        or_(_R.session_id == session_id, _R.session_id.in_(branches)),
        _R.parent.in_(select(gone.c.id).where(*rows(gone.c)))).values(parent_id=key.scalar_subquery(), parent=None))
    await conn.execute(delete(responses_t).where(*rows(_R)))


async def cut_points(conn: AsyncConnection, session_id: str, after: int | None) -> None:
    """The points past seq ``after`` (every one: None) lose their history; moving keys move to ``after`` (0)."""
    def mine(c: Any) -> tuple[ColumnElement[bool], ...]:
        return c.session_id == session_id, c.seq_end > after if after is not None else true()

    await conn.execute(update(responses_t).where(*mine(_R), _R.response_id == session_id, _R.moves.is_(False))
                       .values(seq_end=GONE, version=GONE))  # fmt: skip
    await _delete(conn, session_id, lambda c: (*mine(c), c.response_id != session_id, c.moves.is_(False)))
    await conn.execute(update(responses_t).where(*mine(_R), _R.moves.is_(True)).values(seq_end=after or 0))


async def forget_point(conn: AsyncConnection, session_id: str, key: str) -> None:
    """A response key is deleted (the history it named stays: other points and branches share it); a frozen own
    id stays, naming nothing."""
    named = (_R.session_id == session_id, _R.response_id == key)
    if conn.dialect.name == "postgresql":  # a commit continuing from the key holds it shared (run/responses.py)
        await conn.execute(select(func.pg_advisory_xact_lock(RESPONSE_LOCK, func.hashtext(key))))
    if key == session_id:
        await conn.execute(update(responses_t).where(*named).values(seq_end=GONE, version=GONE))
    else:
        await _delete(conn, session_id, lambda c: (c.session_id == session_id, c.response_id == key))


async def forget_head(conn: AsyncConnection, session_id: str, user_id: str | None) -> bool:
    """A key naming a session's head (its own id) deleted as the framework's in-memory ``SessionStore`` deletes
    one: only that key goes. While other keys name points of the session, or branches read through it, its id is
    frozen naming nothing (as a cut's) and every other key reads what it read; with no other name the session goes.
    False if the user has no such session."""
    found = select(sessions_t.c.id).where(sessions_t.c.id == session_id, owner_is(sessions_t.c.user_id, user_id))
    if conn.dialect.name == "postgresql":  # a commit continuing from the head holds its key shared: it lands first
        await conn.execute(select(func.pg_advisory_xact_lock(RESPONSE_LOCK, func.hashtext(session_id))))
        found = found.with_for_update()  # and a branch being made holds its base FOR SHARE (run/points.py)
    if (await conn.execute(found)).first() is None:
        return False
    others = exists().where(_R.session_id == session_id, _R.response_id != session_id, _R.seq_end != GONE)
    branches = exists().where(branches_of(session_id))
    if not (await conn.execute(select(or_(others, branches)))).scalar():
        await delete_with_branches(conn, [session_id])
        return True
    named = (_R.session_id == session_id, _R.response_id == session_id)
    if not (await conn.execute(update(responses_t).where(*named).values(seq_end=GONE, version=GONE))).rowcount:
        await insert_row(conn, {"session_id": session_id, "response_id": session_id, "user_id": user_id,
                                "seq_end": GONE, "version": GONE, "created_at": datetime.now(UTC)}, None)  # fmt: skip
    return True
