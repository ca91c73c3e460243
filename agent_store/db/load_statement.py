"""A run's load as one statement: the session row, its state (own, ``user:``, ``app:``) and its messages.

One statement sees one snapshot, so the load needs no transaction around it: one round trip on PostgreSQL,
one ``execute`` on SQLite. The rows of the three kinds share one set of columns:

=========  ==========  ========  ==================  ===========  =======  ========  =========  ==========
kind       key         other     doc                 n1           n2       n3        t1         t2
=========  ==========  ========  ==================  ===========  =======  ========  =========  ==========
SESSION    user_id     agent_id  service_session_id  incarnation  version  next_seq  closed_at  expires_at
STATE      key         prefix    value               stamp
MESSAGE    message_id  role      body                seq                   position
BUDGET     scope       period                        token_limit  used               period_start
=========  ==========  ========  ==================  ===========  =======  ========  =========  ==========

and a message's ``author`` (author_name) and ``text``, which its stored body leaves out (message_rows.full_body),
a session's ``author`` its ``base_id`` (a branch, migration 0017: run/points.py reads its history),
and its compaction ``marks``; a budget's ``author`` is its subject. Messages come in the framework's list order
(``position``: coalesce(pos, seq<<32), migration 0013), which is commit order unless a compaction inserted a
summary in the middle. With ``included_only``, excluded messages are left out (what ``skip_excluded`` would hand
the model). The budgets the run will be charged to (migration 0014) come last: a spent one refuses the run.

A window (``history_limit``) starts ``limit`` before the session's ``next_seq``, widened back to the user
message that began that turn, and to the call of any function result in it (the tool-calls index), so a window
never starts with an orphan result; run/load.py re-reads when the call widening lands inside an earlier turn.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    BigInteger,
    Integer,
    String,
    Text,
    bindparam,
    case,
    cast,
    false,
    func,
    literal_column,
    null,
    select,
    true,
    union_all,
)

from agent_store.db.codec import dumps
from agent_store.db.message_rows import TEXT_FROM_COLUMN
from agent_store.db.scopes import APP_PREFIX, USER_PREFIX
from agent_store.db.tables import (
    JsonText,
    UTCDateTime,
    app_state_t,
    budgets_t,
    messages_t,
    sessions_t,
    state_t,
    tool_calls_t,
    user_state_t,
)

SESSION, STATE, MESSAGE, BUDGET = 0, 1, 2, 3
_COLUMNS = {
    "key": String(), "other": String(), "doc": JsonText(), "n1": BigInteger(), "n2": BigInteger(),
    "n3": BigInteger(), "t1": UTCDateTime(), "t2": UTCDateTime(), "author": String(), "text": Text(),
    "marks": JsonText(), "links": JsonText(),
}  # fmt: skip
POSITION_STEP = 2**32  # a message at seq n is at position n << 32 unless moved: 2^32 places between two of them
_S, _M = sessions_t.c, messages_t.c
_PLAIN_TEXT_SQL = f"'{dumps({TEXT_FROM_COLUMN: 1}, where='a plain text body')}'"  # as message_rows stores it


def _branch(kind: int, extra: dict[str, Any] | None = None, **given: Any) -> list[Any]:
    """One SELECT's column list: the given expressions, typed NULL for the rest (``extra``: more columns, after
    these, for a statement that adds rows of other kinds: run/point_reads.py)."""
    columns = [literal_column(str(kind), Integer).label("kind")]
    for name, type_ in (_COLUMNS | extra if extra else _COLUMNS).items():
        value = given.get(name)
        columns.append((cast(null(), type_) if value is None else value).label(name))
    return columns


def _text(value: str) -> Any:
    return literal_column(f"'{value}'", String)  # a constant of ours ("", "user:", "app:"), never user input


def position(columns: Any = _M) -> Any:
    """A message's place in the framework's list: its ``pos`` if a compaction placed it, else ``seq << 32``."""
    return func.coalesce(columns.pos, columns.seq * literal_column(str(POSITION_STEP), BigInteger))  # a bigint


def body() -> Any:
    """A message's body, NULL for a plain text one (``{"$text": 1}``, most of them): message_decode.py builds
    those from their columns, so the driver need not decode the same small document once per message."""
    plain = cast(literal_column(_PLAIN_TEXT_SQL), JsonText())  # jsonb equality on PostgreSQL, text on SQLite
    return case((_M.body == plain, null()), else_=_M.body)


def session_parts(with_user: bool, own_state: bool = True, extra: dict[str, Any] | None = None) -> list[Any]:
    """The session's row (``:sid``) and its state: its own keys unless not ``own_state``, ``app:``, ``user:``."""
    session = select(*_branch(
        SESSION, extra, key=_S.user_id, other=_S.agent_id, doc=_S.service_session_id, n1=_S.incarnation,
        n2=_S.version, n3=_S.next_seq, t1=_S.closed_at, t2=_S.expires_at, author=_S.base_id,
    )).where(_S.id == bindparam("sid"))  # fmt: skip
    parts = [session]
    for prefix, table, owner, param in (
        *([("", state_t, "session_id", "sid")] if own_state else []),
        (APP_PREFIX, app_state_t, "app_id", "app"),
        *([(USER_PREFIX, user_state_t, "user_id", "uid")] if with_user else []),
    ):
        t = table.c
        parts.append(select(*_branch(STATE, extra, key=t.key, other=_text(prefix), doc=t.value, n1=t.version))
                     .where(t[owner] == bindparam(param)))  # fmt: skip
    return parts


def budget_part(with_user: bool, extra: dict[str, Any] | None = None) -> Any:
    """The budgets the run will be charged to (the user's, the app's; migration 0014): a spent one refuses it."""
    b = budgets_t.c
    owners = (b.scope == "app") & (b.subject == bindparam("app"))
    if with_user:
        owners = owners | ((b.scope == "user") & (b.subject == bindparam("uid")))
    return select(*_branch(BUDGET, extra, key=b.scope, other=b.period, n1=b.token_limit, n2=b.used,
                           t1=b.period_start, author=b.subject)).where(owners)  # fmt: skip


@functools.cache
def _statement(with_user: bool, window: str, included_only: bool) -> Any:
    """``window``: "all" (every message), "limit" (the last ``:limit`` before next_seq), "start" (from ``:start``)."""
    owned = _S.user_id == bindparam("uid") if with_user else _S.user_id.is_(None)
    branches = session_parts(with_user)
    # Messages only of a session this user owns (another user's transcript is never read, not even to refuse).
    first: Any = literal_column("0")
    if window == "limit":
        first = _S.next_seq - bindparam("limit", type_=Integer())
    elif window == "start":
        first = bindparam("start", type_=Integer())
    if window != "all":
        # Widened back to the user message that began the turn it falls in (none before: the very start): a
        # request must not begin with an assistant's message (Bedrock, and Anthropic until lately, refuse it).
        # The primary key's range read backwards from the window's start, to the first user message.
        turn = (
            select(func.max(_M.seq))
            .where(_M.session_id == bindparam("sid"), _M.role == "user", _M.seq <= first)
            .scalar_subquery()
        )
        first = case((first >= _S.next_seq, first), else_=func.coalesce(turn, 0))  # an empty window stays empty
    window_start = select(first.label("lo")).where(_S.id == bindparam("sid"), owned).cte("window_start")
    start: Any = select(window_start.c.lo).scalar_subquery()
    if window != "all":
        # Each result in the window needs the nearest call with its id before it (providers reuse ids). Computed
        # once, in CTEs: the statement stays cheap to plan (each connection plans it a few times).
        # The results in the window, ordered by seq in a subquery of their own for the reason given for the
        # messages below: the tool-calls primary key (session_id, seq, call_id) then serves the seq range.
        result, call = tool_calls_t.alias("result"), tool_calls_t.alias("call")
        results = (
            select(result.c.session_id, result.c.call_id, result.c.seq)
            .where(result.c.session_id == bindparam("sid"), result.c.kind == "result", result.c.seq >= start)
            .order_by(result.c.seq)
            .subquery("results")
        )
        its_call = (
            select(func.max(call.c.seq))
            .where(call.c.session_id == results.c.session_id, call.c.call_id == results.c.call_id)
            .where(call.c.kind == "call", call.c.seq <= results.c.seq)
            .scalar_subquery()
        )
        calls = select(func.min(its_call).label("lo")).select_from(results).cte("calls")
        lowest = case((calls.c.lo < window_start.c.lo, calls.c.lo), else_=window_start.c.lo)
        start = select(lowest).select_from(window_start.join(calls, true())).scalar_subquery()
    # Ordered by seq inside its own subquery, so the primary key (session_id, seq) is the only index that serves
    # it without a sort. Otherwise, planned before the table has statistics (each connection keeps a generic plan
    # made from its first runs), the message-id index ties with it on cost and can win: a window of 20 then
    # reads the session's every message (the bench's 5,000-message window ran at 2 ms instead of 0.7).
    columns = _branch(
        MESSAGE, key=_M.message_id, other=_M.role, doc=body(), n1=_M.seq, n3=position(), author=_M.author_name,
        text=_M.text, marks=_M.marks, links=None if included_only else _M.summary_of,
    )  # fmt: skip
    if not included_only:
        messages = select(*columns).where(_M.session_id == bindparam("sid"), _M.seq >= start).order_by(_M.seq)
        branches.append(select(*messages.subquery("messages").c))
    else:
        # Only what the model sees, reading no excluded original: from included_from up, the included rows of
        # the range; below it, the included rows a compaction placed (summaries), through the partial index.
        included_from = select(func.coalesce(_S.included_from, 0)).where(_S.id == bindparam("sid")).scalar_subquery()
        lower = case((included_from > start, included_from), else_=start)  # one bound: the range is an index's
        upper = select(*columns).where(_M.session_id == bindparam("sid"), _M.seq >= lower, _M.excluded == false())
        upper = upper.order_by(_M.seq)
        placed = select(*columns).where(_M.session_id == bindparam("sid"), _M.seq >= start, _M.excluded == false())
        placed = placed.where(_M.seq < included_from, _M.pos.is_not(None)).order_by(_M.seq)
        branches += [select(*upper.subquery("upper").c), select(*placed.subquery("placed").c)]
    union = union_all(*branches, budget_part(with_user))
    return union.order_by(union.selected_columns.kind, union.selected_columns.n3, union.selected_columns.n1)


def load_statement(
    session_id: str,
    user_id: str | None,
    app_id: str,
    history_limit: int | None,
    start: int | None = None,
    included_only: bool = False,
) -> tuple[Any, dict[str, Any]]:
    """The statement and its parameters; ``start`` re-reads from a seq the window had to be widened to."""
    window = "start" if start is not None else "all" if history_limit is None else "limit"
    params: dict[str, Any] = {"sid": session_id, "app": app_id}
    if user_id is not None:
        params["uid"] = user_id
    if window == "limit":
        params["limit"] = history_limit
    elif window == "start":
        params["start"] = start
    return _statement(user_id is not None, window, included_only), params
