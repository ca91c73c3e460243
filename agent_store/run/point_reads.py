"""Reading a point back (run/points.py's ``load_point``): the chain of bases with the messages of each one's part,
each message's compaction columns as they were at the point, and the session's own keys at its version. Each is
one statement built once and run on its own (the driver path: no transaction around them). Each reads history
that only grows: rows kept for earlier versions never change, so three snapshots read the same point as one.
(``point``: a run/points.py ``Point``.)"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Integer, and_, bindparam, case, literal, select

from agent_store.db import codec
from agent_store.db.database import Database
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


def _view() -> Any:
    """The chain of bases from the viewed session (``sid``), each with the end of its part (``seq_end`` for the
    viewed one, then where its branch begins) and the version it is read at (``version``, then the branch's base
    version): a recursive walk."""
    first = select(_S.id, _S.base_id, _S.base_seq, _S.base_version, literal(0).label("depth"),
                   bindparam("seq_end", type_=Integer).label("end_seq"),
                   bindparam("version", type_=Integer).label("ver")).where(_S.id == bindparam("sid"))  # fmt: skip
    view: Any = first.cte("view", recursive=True)
    base = sessions_t.alias("base")
    return view.union_all(select(base.c.id, base.c.base_id, base.c.base_seq, base.c.base_version, view.c.depth + 1,
                                 view.c.base_seq, view.c.base_version)
                          .where(base.c.id == view.c.base_id, view.c.depth < 10_000))  # fmt: skip


def _statements() -> tuple[Any, Any, Any]:
    view = _view()
    low = case((view.c.base_id.is_(None), 0), else_=view.c.base_seq)
    joined = view.outerjoin(messages_t, and_(_M.session_id == view.c.id, _M.seq >= low, _M.seq < view.c.end_seq))
    messages = select(view, messages_t).select_from(joined).order_by(view.c.depth)
    k, b = message_marks_t.c, branch_marks_t.c
    kept = select(literal("k").label("kind"), k.session_id, k.message_id, k.version, k.horizon,
                  *[getattr(k, n) for n in MARK_COLUMNS]).select_from(
        message_marks_t.join(view, and_(k.session_id == view.c.id, k.version > view.c.ver)))  # fmt: skip
    own = select(literal("b").label("kind"), b.session_id, b.message_id, b.version, b.horizon,
                 *[getattr(b, n) for n in MARK_COLUMNS]).select_from(
        branch_marks_t.join(view, and_(b.session_id == view.c.id, b.version <= view.c.ver)))  # fmt: skip
    marks = kept.union_all(own).subquery()
    marks_query = select(marks).order_by(marks.c.kind, marks.c.session_id, marks.c.message_id, marks.c.version,
                                         marks.c.horizon)  # fmt: skip
    st, h = state_t.c, state_history_t.c
    now = select(literal("s").label("kind"), st.key, st.value, st.version.label("n"), literal(True).label("existed"))
    later = select(literal("t").label("kind"), h.key, h.value, h.until_version, h.existed)
    state = now.where(st.session_id == bindparam("sid")).union_all(
        later.where(h.session_id == bindparam("sid"), h.until_version > bindparam("version", type_=Integer))
    ).subquery()  # fmt: skip
    return messages, marks_query, select(state).order_by(state.c.kind, state.c.key, state.c.n)


_MESSAGES, _MARKS, _STATE = _statements()


async def chain_and_messages(db: Database, point: Any) -> tuple[list[Any], list[Any]]:
    """The chain of bases (as points.chain_of) and the messages of each one's part of the view."""
    found = await db.one_statement(_MESSAGES, _params(point), doing="loading a response")
    chain = list({row.depth: row for row in found}.values())
    return chain, [row for row in found if row.message_id is not None]


def _params(point: Any) -> dict[str, Any]:
    return {"sid": point.session_id, "seq_end": point.seq_end, "version": point.version}


def segments(chain: list[Any], point: Any) -> list[tuple[str, int, int, int]]:
    """(session, first seq, end seq, version) of each session's part of the history, the viewed one first: a base's
    part ends where its branch begins, as it was at the version the branch continued from."""
    out, end, version = [], point.seq_end, point.version
    for row in chain:
        low = int(row.base_seq or 0) if row.base_id is not None else 0
        out.append((row.id, low, end, version))
        end, version = low, int(row.base_version or 0)
    return out


async def columns_in_view(db: Database, point: Any) -> tuple[dict[Any, Any], dict[Any, Any]]:
    """Each message's compaction columns as they were at its session's version in this view: (the first row a
    rewrite after that version kept (0016), absent if none came after; a branch's own rows for its base's
    messages (0017), its latest at that version)."""
    at_cut: dict[Any, dict[str, Any]] = {}
    overrides: dict[Any, dict[str, Any]] = {}
    for row in await db.one_statement(_MARKS, _params(point), doing="loading a response"):
        columns = {name: getattr(row, name) for name in MARK_COLUMNS}
        if row.kind == "k":
            at_cut.setdefault((row.session_id, row.message_id), columns)  # the first after the version
        else:
            overrides[(row.session_id, row.message_id)] = columns  # the latest at the version
    return at_cut, overrides


async def own_state(db: Database, point: Any) -> dict[str, tuple[Any, str, int]]:
    """The session's own keys at ``point.version`` (canonical JSON text, stamp): the current rows, each taken
    back to the first value kept by a change after that version (``existed`` false: the key was not there)."""
    found = await db.one_statement(_STATE, {"sid": point.session_id, "version": point.version},
                                   doing="loading a response")  # fmt: skip
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
