"""The one rule every walk of a chain of bases follows (migrations 0017, 0027).

A branch reads its messages before ``base_seq`` from its base, and that base's from its own, up the chain. A step
goes from a branch to a session only when that session *is* its base: the id it names, the same user, and the
incarnation that was there when the branch was made (a ``NULL`` incarnation: a branch made by code before 0027
during a rollout, checked by id and user). A base whose id was freed and taken again, by the same user or another,
is not it: the walk stops with a base left, and a reader refuses a history that stops early (a typed error),
never reading another session's messages as the branch's. Every walk is built here, so none can skip the rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import ColumnElement, and_, exists, func, literal, select
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db.tables import sessions_t

__all__ = ["CHAIN_MAX", "WALKED", "base_of", "branch_row", "branches_of", "chain_of", "walk"]
CHAIN_MAX = 10_000  # bases a branch's history may be read through (every walk stops there; a read past it is refused)
WALKED = ("id", "user_id", "base_id", "base_seq", "base_version", "base_incarnation")  # every walk's columns
_S = sessions_t.c
Carried = tuple[Any, Callable[[Any], Any]]  # a walk column: its value on the first row, and on the next from a row


def base_of(child: Any, base: Any) -> ColumnElement[bool]:
    """SQL: the session ``base`` (a table or alias) is ``child``'s base (columns of a walk or of the sessions)."""
    return and_(base.c.id == child.c.base_id, base.c.user_id.is_not_distinct_from(child.c.user_id),
                base.c.incarnation == func.coalesce(child.c.base_incarnation, base.c.incarnation))  # fmt: skip


def branch_row(base: Any, new_id: str, seq: int, version: int, incarnation: int, now: Any, expires_at: Any) -> dict[
    str, Any
]:  # fmt: skip
    """The one row a branch is (``store.fork(share=True)`` and a response continued from a point both make it
    so): a session of ``base``'s user, agent and title whose history before ``seq`` is ``base``'s at ``version``
    (the base's version *at the cut*, never now: a later compaction of the base is not the branch's), named by id
    and incarnation (:func:`base_of`)."""
    return {"id": new_id, "user_id": base.user_id, "agent_id": base.agent_id, "incarnation": incarnation,
            "version": 0, "next_seq": seq, "created_at": now, "updated_at": now, "base_id": base.id, "base_seq": seq,
            "base_version": version, "base_incarnation": base.incarnation, "keeps_history": False,
            "title": base.title, "ttl_seconds": base.ttl_seconds, "expires_at": expires_at}  # fmt: skip


def branches_of(session_ids: str | list[str]) -> ColumnElement[bool]:
    """SQL on ``agent_sessions``: the row is a branch of the session ``session_ids`` names (or of one of a list),
    by :func:`base_of` (the plain ``base_id`` test first, for its index)."""
    base = sessions_t.alias("its_base")
    named: ColumnElement[bool]
    its: ColumnElement[bool]
    if isinstance(session_ids, list):
        named, its = _S.base_id.in_(session_ids), base.c.id.in_(session_ids)
    else:
        named, its = _S.base_id == session_ids, base.c.id == session_ids
    return and_(named, exists().where(its, base_of(sessions_t, base)))


def walk(name: str, seed: ColumnElement[bool], **carried: Carried) -> Any:
    """A recursive walk from the session ``seed`` selects up its chain of bases (:func:`base_of`, at most
    CHAIN_MAX steps): WALKED and ``depth`` (0 for the seed), then each ``carried`` column (its next value a
    function of the columns of the row before)."""
    first = select(*(_S[c] for c in WALKED), literal(0).label("depth"),
                   *(value.label(key) for key, (value, _) in carried.items())).where(seed)  # fmt: skip
    up: Any = first.cte(name, recursive=True)
    base = sessions_t.alias("base")
    steps = (step(up.c) for _, step in carried.values())
    step = select(*(base.c[c] for c in WALKED), up.c.depth + 1, *steps)
    return up.union_all(step.where(base_of(up, base), up.c.depth < CHAIN_MAX))


async def chain_of(conn: AsyncConnection, session_id: str) -> list[Any]:
    """The session's row, then its base's, and so on to the first session of the conversation, or to where the
    walk stopped (the last row's ``base_id`` is then not ``None``): one statement."""
    up = walk("chain", _S.id == session_id)
    return list((await conn.execute(select(up).order_by(up.c.depth))).all())
