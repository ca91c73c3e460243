"""Reading a point back (run/points.py's ``load_point``): the chain of bases with the messages of each one's part,
each message's compaction columns as they were at the point, and the session's own keys at its version. Each is
one statement, in the view's one read transaction. (``point``: a run/points.py ``Point``.)"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, case, literal, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db import codec
from agent_store.db.tables import (
    branch_marks_t,
    message_marks_t,
    messages_t,
    sessions_t,
    state_history_t,
    state_t,
)

__all__ = ["MARK_COLUMNS", "chain_and_messages", "columns_in_view", "own_state", "segments"]
MARK_COLUMNS = ("marks", "excluded", "exclude_reason", "summarized_by", "pos")
_S, _M = sessions_t.c, messages_t.c


async def chain_and_messages(conn: AsyncConnection, point: Any) -> tuple[list[Any], list[Any]]:
    """The chain of bases (as :func:`chain_of`) and the messages of each one's part of the view, in one statement:
    each session's part ends where its branch begins (a recursive walk carries the bounds down)."""
    first = select(_S.id, _S.base_id, _S.base_seq, _S.base_version, literal(0).label("depth"),
                   literal(point.seq_end).label("end_seq")).where(_S.id == point.session_id)  # fmt: skip
    view: Any = first.cte("view", recursive=True)
    base = sessions_t.alias("base")
    view = view.union_all(select(base.c.id, base.c.base_id, base.c.base_seq, base.c.base_version, view.c.depth + 1,
                                 view.c.base_seq).where(base.c.id == view.c.base_id, view.c.depth < 10_000))
    low = case((view.c.base_id.is_(None), 0), else_=view.c.base_seq)
    joined = view.outerjoin(messages_t, and_(_M.session_id == view.c.id, _M.seq >= low, _M.seq < view.c.end_seq))
    found = (await conn.execute(select(view, messages_t).select_from(joined).order_by(view.c.depth))).all()
    chain = list({row.depth: row for row in found}.values())
    return chain, [row for row in found if row.message_id is not None]


def segments(chain: list[Any], point: Any) -> list[tuple[str, int, int, int]]:
    """(session, first seq, end seq, version) of each session's part of the history, the viewed one first: a base's
    part ends where its branch begins, as it was at the version the branch continued from."""
    out, end, version = [], point.seq_end, point.version
    for row in chain:
        low = int(row.base_seq or 0) if row.base_id is not None else 0
        out.append((row.id, low, end, version))
        end, version = low, int(row.base_version or 0)
    return out


async def columns_in_view(conn: AsyncConnection, segments: list[Any]) -> tuple[dict[Any, Any], dict[Any, Any]]:
    """Each message's compaction columns as they were at its session's version in this view, in one statement:
    (the first row a rewrite after that version kept (0016), absent if none came after; a branch's own rows for its
    base's messages (0017), its latest at that version)."""
    k, b = message_marks_t.c, branch_marks_t.c
    kept = select(literal("k").label("kind"), k.session_id, k.message_id, k.version, k.horizon,
                  *[getattr(k, n) for n in MARK_COLUMNS]).where(
        or_(*[and_(k.session_id == sid, k.version > version) for sid, _, _, version in segments]))  # fmt: skip
    own = select(literal("b").label("kind"), b.session_id, b.message_id, b.version, b.horizon,
                 *[getattr(b, n) for n in MARK_COLUMNS]).where(
        or_(*[and_(b.session_id == sid, b.version <= version) for sid, _, _, version in segments]))  # fmt: skip
    both = kept.union_all(own).subquery()
    found = (await conn.execute(select(both).order_by(both.c.kind, both.c.session_id, both.c.message_id,
                                                      both.c.version, both.c.horizon))).all()  # fmt: skip
    at_cut: dict[Any, dict[str, Any]] = {}
    overrides: dict[Any, dict[str, Any]] = {}
    for row in found:
        columns = {name: getattr(row, name) for name in MARK_COLUMNS}
        if row.kind == "k":
            at_cut.setdefault((row.session_id, row.message_id), columns)  # the first after the version
        else:
            overrides[(row.session_id, row.message_id)] = columns  # the latest at the version
    return at_cut, overrides


async def own_state(conn: AsyncConnection, point: Any) -> dict[str, tuple[Any, str, int]]:
    """The session's own keys at ``point.version`` (canonical JSON text, stamp): the current rows, each taken
    back to the first value kept by a change after that version (``existed`` false: the key was not there)."""
    s, h = state_t.c, state_history_t.c
    now = select(literal("s").label("kind"), s.key, s.value, s.version.label("n"), literal(True).label("existed"))
    kept = select(literal("t").label("kind"), h.key, h.value, h.until_version, h.existed)  # one statement, both
    both = now.where(s.session_id == point.session_id).union_all(
        kept.where(h.session_id == point.session_id, h.until_version > point.version)).subquery()  # fmt: skip
    found = (await conn.execute(select(both).order_by(both.c.kind, both.c.key, both.c.n))).all()
    current = {row.key: (row.value, int(row.n)) for row in found if row.kind == "s"}
    later = [row for row in found if row.kind == "t"]
    values: dict[str, Any] = {key: value for key, (value, _) in current.items()}
    seen: set[str] = set()
    for row in later:
        if row.key in seen:
            continue
        seen.add(row.key)
        if row.existed:
            values[row.key] = row.value
        else:
            values.pop(row.key, None)
    return {key: (value, codec.dumps(value, where=f"state[{key!r}]", max_bytes=2**62), current.get(key, (None, 0))[1])
            for key, value in values.items()}  # fmt: skip
