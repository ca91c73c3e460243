"""Reading a point back (run/points.py's ``load_point``) in one statement, as a session's load is (load_statement.py).

Its rows share the load's columns and a few more (``_EXTRA``), by kind:

- the session's row, its ``app:`` and ``user:`` keys and the budgets, as a load reads them (ownership, expiry,
  closure and budgets are checked on them as on a load; run/load.py ``checked_session``);
- ``CHAIN``: the chain of bases from the viewed session (a recursive walk): key the session, author its base,
  n1 the seq its branch begins at, n2 the base's version then, n3 the depth;
- ``VIEWED``: the messages of each session's part of the view (a base's part ends where its branch begins);
- ``KEPT`` / ``OWN_MARK``: compaction columns in view: the rows a rewrite after the session's version kept (0016;
  the first after that version is the one in force then), and a branch's own rows for its base's messages at
  its version (0017; its latest);
- ``NOW`` / ``BEFORE``: the session's own keys now, and each value a change after the point's version replaced
  (0017; ``flag`` false: the key was not there).

One statement sees one snapshot: no transaction around it, one round trip on PostgreSQL.
(``point``: a run/points.py ``Point``.)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import BigInteger, Boolean, Integer, String, and_, bindparam, case, select, union_all

from agent_store.db import chains, codec
from agent_store.db.chains import CHAIN_MAX
from agent_store.db.database import Database
from agent_store.db.load_statement import _branch, body, budget_part, session_parts
from agent_store.db.tables import (
    branch_marks_t,
    message_marks_t,
    messages_t,
    sessions_t,
    state_history_t,
    state_t,
)
from agent_store.errors import InvalidValueError

__all__ = ["MARK_COLUMNS", "View", "mark_columns", "read_view", "segments"]
MARK_COLUMNS = ("marks", "excluded", "exclude_reason", "summarized_by", "pos")
CHAIN, VIEWED, KEPT, OWN_MARK, NOW, BEFORE = 4, 5, 6, 7, 8, 9
_EXTRA = {"sid": String(), "flag": Boolean(), "reason": String(), "by": String(), "pos": BigInteger()}
_S, _M = sessions_t.c, messages_t.c


def _view() -> Any:
    """The chain of bases from the viewed session (``sid``), each with the end of its part (``seq_end`` for the
    viewed one, then where its branch begins) and the version it is read at (``version``, then the branch's base
    version): a recursive walk (db/chains.py)."""
    return chains.walk("view", _S.id == bindparam("sid"),
                       end_seq=(bindparam("seq_end", type_=Integer), lambda up: up.base_seq),
                       ver=(bindparam("version", type_=Integer), lambda up: up.base_version))  # fmt: skip


def _row(kind: int, **given: Any) -> list[Any]:
    return _branch(kind, _EXTRA, **given)


def _marks(columns: Any) -> dict[str, Any]:
    return {"sid": columns.session_id, "key": columns.message_id, "n1": columns.version, "n2": columns.horizon,
            "marks": columns.marks, "flag": columns.excluded, "reason": columns.exclude_reason,
            "by": columns.summarized_by, "pos": columns.pos}  # fmt: skip


@functools.cache
def _statement(with_user: bool) -> Any:
    view = _view()
    parts = session_parts(with_user, own_state=False, extra=_EXTRA)
    parts.append(select(*_row(CHAIN, key=view.c.id, author=view.c.base_id, n1=view.c.base_seq,
                              n2=view.c.base_version, n3=view.c.depth)))  # fmt: skip
    low = case((view.c.base_id.is_(None), 0), else_=view.c.base_seq)
    mine = and_(_M.session_id == view.c.id, _M.seq >= low, _M.seq < view.c.end_seq)
    parts.append(select(*_row(VIEWED, sid=_M.session_id, key=_M.message_id, other=_M.role, doc=body(), n1=_M.seq,
                              author=_M.author_name, text=_M.text, marks=_M.marks, links=_M.summary_of,
                              flag=_M.excluded, reason=_M.exclude_reason, by=_M.summarized_by, pos=_M.pos))
                 .select_from(view.join(messages_t, mine)))  # fmt: skip
    k, b = message_marks_t.c, branch_marks_t.c
    parts.append(select(*_row(KEPT, **_marks(k)))
                 .select_from(message_marks_t.join(view, and_(k.session_id == view.c.id, k.version > view.c.ver))))
    parts.append(select(*_row(OWN_MARK, **_marks(b)))
                 .select_from(branch_marks_t.join(view, and_(b.session_id == view.c.id, b.version <= view.c.ver))))
    st, h = state_t.c, state_history_t.c
    parts.append(select(*_row(NOW, key=st.key, doc=st.value, n1=st.version)).where(st.session_id == bindparam("sid")))
    parts.append(select(*_row(BEFORE, key=h.key, doc=h.value, n1=h.until_version, flag=h.existed))
                 .where(h.session_id == bindparam("sid"), h.until_version > bindparam("version", type_=Integer)))
    union = union_all(*parts, budget_part(with_user, extra=_EXTRA))
    c = union.selected_columns
    return union.order_by(c.kind, c.sid, c.key, c.n1, c.n2)


@dataclass
class View:
    """A point's rows, sorted out: the load's (``loaded``), the chain (viewed session first), the messages, each
    message's compaction columns in force at the point (``at_cut``, ``overrides`` by (session, message)), and
    the session's own keys at the point's version (value, canonical JSON text, stamp)."""

    loaded: list[Any] = field(default_factory=list)
    chain: list[Any] = field(default_factory=list)
    messages: list[Any] = field(default_factory=list)
    at_cut: dict[Any, dict[str, Any]] = field(default_factory=dict)
    overrides: dict[Any, dict[str, Any]] = field(default_factory=dict)
    own: dict[str, tuple[Any, str, int]] = field(default_factory=dict)


async def read_view(db: Database, point: Any, user_id: str | None) -> View:
    params = {"sid": point.session_id, "seq_end": point.seq_end, "version": point.version, "app": db.settings.app_id}
    if user_id is not None:
        params["uid"] = user_id
    view = View()
    current: dict[str, tuple[Any, int]] = {}
    later = []
    for row in await db.one_statement(_statement(user_id is not None), params, doing="loading a response"):
        if row.kind == CHAIN:
            view.chain.append(row)
        elif row.kind == VIEWED:
            view.messages.append(row)
        elif row.kind == KEPT:  # the first after the version
            view.at_cut.setdefault((row.sid, row.key), mark_columns(row))
        elif row.kind == OWN_MARK:  # the latest at the version
            view.overrides[(row.sid, row.key)] = mark_columns(row)
        elif row.kind == NOW:
            current[row.key] = (row.doc, int(row.n1))
        elif row.kind == BEFORE:
            later.append(row)
        else:
            view.loaded.append(row)
    view.chain.sort(key=lambda row: int(row.n3))
    if view.chain and view.chain[-1].author is not None:  # the walk stopped with a base left: never a short history
        raise InvalidValueError(f"session {point.session_id!r} reads its history through more than {CHAIN_MAX} "
                                "bases, or through a base that is gone: it cannot be read (continue from a response "
                                "nearer its start)")  # fmt: skip
    values: dict[str, Any] = {key: value for key, (value, _) in current.items()}
    seen: set[str] = set()
    for row in later:  # by key, then the change's version: the first is the value at the point's version
        if row.key in seen:
            continue
        seen.add(row.key)
        if row.flag:
            values[row.key] = row.doc
        else:
            values.pop(row.key, None)
    view.own = {key: (value, codec.dumps(value, where=f"state[{key!r}]", max_bytes=2**62),
                      current.get(key, (None, 0))[1]) for key, value in values.items()}  # fmt: skip
    return view


def mark_columns(row: Any) -> dict[str, Any]:
    """A VIEWED, KEPT or OWN_MARK row's compaction columns, by their column names."""
    return {"marks": row.marks, "excluded": row.flag, "exclude_reason": row.reason, "summarized_by": row.by,
            "pos": row.pos}  # fmt: skip


def segments(chain: list[Any], point: Any) -> list[tuple[str, int, int, int]]:
    """(session, first seq, end seq, version) of each session's part of the history, the viewed one first: a base's
    part ends where its branch begins, as it was at the version the branch continued from."""
    out, end, version = [], point.seq_end, point.version
    for row in chain:
        low = int(row.n1 or 0) if row.author is not None else 0
        out.append((row.key, low, end, version))
        end, version = low, int(row.n2 or 0)
    return out
