"""The statements of a compaction's commit: rewrite stored messages' marks and places, find a place's neighbour.

A compaction changes messages stored already (run/compaction.py): these statements update exactly those rows,
by the session and the store's message id (on PostgreSQL through the unique index's md5 key, migration 0011).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, case, cast, func, literal, select, update
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db.load_statement import position
from agent_store.db.statements import id_hash
from agent_store.db.tables import JsonText, messages_t, sessions_t

__all__ = ["lower_included_from", "move", "place_below", "rewrite_marks"]
_M = messages_t.c


def _this_message(dialect: str) -> list[Any]:
    where = [_M.session_id == bindparam("sid"), _M.message_id == bindparam("mid")]
    if dialect == "postgresql":  # the unique index keys md5(message_id)::uuid: a probe, not a scan of the session
        where.append(cast(func.md5(_M.message_id), UUID) == bindparam("mid_hash", type_=UUID))
    return where


def _params(db: AsyncConnection, session_id: str, message_id: str) -> dict[str, Any]:
    params: dict[str, Any] = {"sid": session_id, "mid": message_id}
    if db.dialect.name == "postgresql":
        params["mid_hash"] = id_hash(message_id)
    return params


async def rewrite_marks(db: AsyncConnection, session_id: str, columns: dict[str, dict[str, Any]], horizon: int) -> None:
    """Set each message's mark columns (``message_rows.mark_columns``), by store id. ``horizon``: the first seq of
    this commit, which ``excluded_at`` keeps for a message this commit excludes."""
    if not columns:
        return
    names = ("marks", "excluded", "exclude_reason", "summarized_by", "summary_of")
    statement = update(messages_t).where(*_this_message(db.dialect.name))
    statement = statement.values({name: bindparam(f"new_{name}") for name in names})
    # A summary's links are written once: a rewrite without them (a load that did not read them) keeps them.
    statement = statement.values(summary_of=func.coalesce(bindparam("new_summary_of", type_=JsonText()), _M.summary_of))
    excluded_at = case((bindparam("new_excluded"), func.coalesce(_M.excluded_at, bindparam("horizon"))), else_=None)
    statement = statement.values(excluded_at=excluded_at)
    rows = [
        {**_params(db, session_id, mid), **{f"new_{name}": values[name] for name in names}, "horizon": horizon}
        for mid, values in columns.items()
    ]
    await db.execute(statement, rows)


async def move(db: AsyncConnection, session_id: str, places: dict[str, int]) -> None:
    """Give stored messages new places in the list (their seq, commit order, never changes)."""
    if not places:
        return
    statement = update(messages_t).where(*_this_message(db.dialect.name)).values(pos=bindparam("new_pos"))
    await db.execute(statement, [{**_params(db, session_id, mid), "new_pos": pos} for mid, pos in places.items()])


async def place_below(db: AsyncConnection, session_id: str, place: int) -> int | None:
    """The place of the stored message right before ``place`` in the list (None: nothing is before it)."""
    found = select(func.max(position())).where(_M.session_id == session_id, position() < place)
    return (await db.execute(found)).scalar()


async def lower_included_from(db: AsyncConnection, session_id: str, value: int, *, exactly: bool = False) -> None:
    """Set ``agent_sessions.included_from`` (0013) to ``value`` when ``exactly``, else lower it to ``value``."""
    S = sessions_t.c
    new = literal(value) if exactly else case((S.included_from > value, value), else_=S.included_from)
    await db.execute(update(sessions_t).where(S.id == session_id).values(included_from=new))
