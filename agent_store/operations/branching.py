"""Branching a conversation: fork a session into a new one, or truncate it back to an earlier message.

Both cut only where no function call is separated from its result, refuse a seq outside the session, and
give every copied state row a fresh stamp and the fork a fresh incarnation (a copy never looks unchanged).

Both cut in commit order (seq). Every message kept gets back the compaction columns it had at the cut (marks,
exclusion, reason, summary link, place): a commit after the cut that rewrote them left the earlier values in
``agent_message_marks`` (migration 0016). For rows rewritten before that table existed, what was excluded after
the cut is included again (``excluded_at``, migration 0013). A summary committed after the cut is not kept: no
message is left excluded in favour of a summary that is not there.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, cast, delete, exists, func, literal, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db import chains, codec, message_rows, rewrites, tenancy
from agent_store.db.cut_points import CHAIN_MAX, GONE, cut_points
from agent_store.db.database import Database
from agent_store.db.statements import lock_user, new_stamp, not_found
from agent_store.db.tables import (
    branch_marks_t,
    message_marks_t,
    messages_t,
    responses_t,
    sessions_t,
    state_t,
    tool_calls_t,
)
from agent_store.errors import InvalidValueError
from agent_store.models import TreeNode as TreeNode
from agent_store.operations.lifecycle import owned

S = sessions_t.c


def _check_seq(value: Any, what: str, last: int) -> None:
    if type(value) is not int or value < 0:
        raise InvalidValueError(f"{what} must be a non-negative int, not {value!r}")
    if value > last:
        raise InvalidValueError(f"{what} {value} is past the session's last message (seq {last})")


async def _paired_cut(conn: AsyncConnection, session_id: str, cut: int) -> int:
    """Lower ``cut`` until no function call at or before it has its result after it.

    A result answers the latest call of its id before it, if no result answered that call already (as a load
    pairs them, run/delta.py's close_tool_pairs): some OpenAI-compatible servers send ``call_0`` for every call,
    and a result at seq 50 does not answer a ``call_0`` at seq 1 that was answered at seq 2 (issue 37), nor does
    a stray result with no open call answer anything."""
    call, result, between = tool_calls_t.alias("c"), tool_calls_t.alias("r"), tool_calls_t.alias("b")
    same_id = (call.c.session_id == result.c.session_id) & (call.c.call_id == result.c.call_id)
    later_call = exists().where(  # a call or a result of that id between the two: not this call's answer
        between.c.session_id == result.c.session_id, between.c.call_id == result.c.call_id,
        between.c.seq > call.c.seq, between.c.seq < result.c.seq,
    )  # fmt: skip
    while True:
        split = (
            await conn.execute(
                select(func.min(call.c.seq))
                .select_from(result.join(call, same_id))
                .where(result.c.session_id == session_id, result.c.kind == "result", result.c.seq > cut)
                .where(call.c.kind == "call", call.c.seq <= cut, ~later_call)
            )
        ).scalar()
        if split is None:
            return cut
        cut = int(split) - 1


@tenancy.for_user
async def truncate(db: Database, session_id: str, user_id: str | None, after_seq: int) -> int:
    """Drop messages after ``after_seq`` (lowered to keep tool calls with their results); returns how many."""
    async with db.transaction(write=True, doing="truncating a session") as conn:
        row = (await conn.execute(select(S.next_seq, S.base_seq).where(*owned(session_id, user_id))
                                  .with_for_update())).first()  # fmt: skip
        if row is None:
            raise not_found(session_id, user_id)
        _check_seq(after_seq, "after_seq", row.next_seq - 1)
        cut = await _paired_cut(conn, session_id, after_seq)
        await _points_after(conn, session_id, cut, row.base_seq)
        M = messages_t.c
        removed = (await conn.execute(delete(messages_t).where(M.session_id == session_id, M.seq > cut))).rowcount
        await conn.execute(update(sessions_t).where(S.id == session_id).values(next_seq=cut + 1, version=S.version + 1))
        await rewrites.lower_included_from(conn, session_id, cut + 1)  # never above next_seq
        await _as_at_the_cut(conn, session_id, session_id, cut)
        await _include_again(conn, session_id, cut, db.settings.max_value_bytes)
    return int(removed)


@tenancy.for_user
async def fork(db: Database, session_id: str, user_id: str | None, at_seq: int | None, new_id: str) -> str:
    """Copy a session's messages up to ``at_seq`` (kept paired) and its state into a new session of the same user."""
    codec.check_id(new_id, "new_id", required=True)
    now = datetime.now(UTC)
    async with db.transaction(write=True, doing="forking a session") as conn:
        if user_id is not None:
            await lock_user(conn, user_id, exclusive=False)  # creates one of the user's sessions: see erase_user
        source = (await conn.execute(select(sessions_t).where(*owned(session_id, user_id)))).first()
        if source is None:
            raise not_found(session_id, user_id)
        if source.base_id is not None:  # its history is its bases' (0017): a copy of its own rows would lack it
            raise InvalidValueError(f"session {session_id!r} is a branch of a served conversation: continue from one "
                                    "of its response ids instead of forking it")  # fmt: skip
        last = source.next_seq - 1
        if at_seq is not None:
            _check_seq(at_seq, "at_seq", last)
        cut = await _paired_cut(conn, session_id, last if at_seq is None else at_seq)
        row = {c.name: getattr(source, c.name) for c in sessions_t.c}
        row.update(id=new_id, incarnation=new_stamp(), version=0, next_seq=cut + 1, created_at=now, updated_at=now,
                   last_run_at=None, closed_at=None, forked_from=session_id, forked_at_seq=cut)  # fmt: skip
        row["metadata"] = codec.dumps(row["metadata"] or {}, where="metadata")
        row["service_session_id"] = None  # a service-side thread cannot be branched from here
        row["included_from"] = min(row["included_from"] or 0, cut + 1)  # never above next_seq (0013)
        insert = (postgresql if conn.dialect.name == "postgresql" else sqlite).insert(sessions_t)
        if not (await conn.execute(insert.on_conflict_do_nothing(), row)).rowcount:
            raise InvalidValueError(f"new_id {new_id!r} is already in use; choose another id")
        await _copy(conn, messages_t, session_id, new_id, messages_t.c.seq <= cut)
        await _copy(conn, tool_calls_t, session_id, new_id, tool_calls_t.c.seq <= cut)
        await _copy(conn, state_t, session_id, new_id, None, version=new_stamp())
        # (their versions are the source's: 0 in the fork, whose own commits come after them all)
        await _copy(conn, message_marks_t, session_id, new_id, message_marks_t.c.horizon <= cut, version=0)
        await _as_at_the_cut(conn, session_id, new_id, cut)
        await _include_again(conn, new_id, cut, db.settings.max_value_bytes)
    return new_id


KEPT = ("marks", "excluded", "exclude_reason", "summarized_by", "excluded_at", "pos")


async def _points_after(conn: AsyncConnection, session_id: str, cut: int, base_seq: int | None) -> None:
    """A truncation keeps what served conversations read (0017): it never cuts into a branch's base, nor under
    a branch of this session; response ids naming points after the cut go with the messages they named."""
    if base_seq is not None and cut + 1 < base_seq:
        raise InvalidValueError(f"session {session_id!r} is a branch whose history before seq {base_seq} is another "
                                "session's: it cannot be truncated there")  # fmt: skip
    reads_past = select(S.id).where(chains.branches_of(session_id), S.base_seq > cut + 1)
    under = (await conn.execute(reads_past.limit(1))).first()
    if under is not None:
        raise InvalidValueError(f"session {session_id!r} has a branch ({under.id!r}) that continues from a message "
                                f"after seq {cut}: delete the branch first, or truncate at a later seq")  # fmt: skip
    b = branch_marks_t.c
    await cut_points(conn, session_id, cut + 1)
    await conn.execute(delete(branch_marks_t).where(b.session_id == session_id, b.horizon > cut))


async def _as_at_the_cut(conn: AsyncConnection, source_id: str, session_id: str, cut: int) -> None:
    """Give each message of ``session_id`` (at or before ``cut``) the compaction columns it had at the cut in
    ``source_id``: those kept by the first rewrite after the cut (0016). Then forget every later rewrite,
    including the ones these updates just recorded."""
    K = message_marks_t.c
    found = select(K.message_id, *[K[name] for name in KEPT]).where(K.session_id == source_id, K.horizon > cut)
    found = found.order_by(K.message_id, K.horizon, K.version)
    M = messages_t.c
    restored: dict[str, Any] = {}  # the first row after the cut, per message
    for row in (await conn.execute(found)).all():
        restored.setdefault(row.message_id, row)
    for row in restored.values():
        values = {name: getattr(row, name) for name in KEPT}
        if values["marks"] is not None:  # read back as a value; the column binds JSON text
            values["marks"] = codec.dumps(values["marks"], where="marks")
        await conn.execute(
            update(messages_t).where(M.session_id == session_id, M.message_id == row.message_id, M.seq <= cut)
            .values(values)
        )  # fmt: skip
    await conn.execute(delete(message_marks_t).where(K.session_id == session_id, K.horizon > cut))
    if restored:  # a message included again may lie below included_from: a load of the included reads them all
        await rewrites.lower_included_from(conn, session_id, 0, exactly=True)


async def _include_again(conn: AsyncConnection, session_id: str, cut: int, max_bytes: int) -> None:
    """Messages excluded by a commit after the cut, or whose summary is gone (cut off), are included again, their
    summary link dropped: as they were at the cut."""
    M, summary = messages_t.c, messages_t.alias("summary")
    same = [summary.c.session_id == session_id, summary.c.message_id == M.summarized_by]
    if conn.dialect.name == "postgresql":  # through the unique index on md5(message_id)::uuid (0011)
        same.append(cast(func.md5(summary.c.message_id), UUID) == cast(func.md5(M.summarized_by), UUID))
    gone = ~exists().where(*same)
    later = and_(M.excluded, M.excluded_at > cut)
    found = select(M.message_id, M.marks).where(M.session_id == session_id)
    found = found.where(or_(and_(M.summarized_by.is_not(None), gone), later))
    columns: dict[str, dict[str, Any]] = {}
    for message_id, marks in (await conn.execute(found)).all():
        marks = dict(marks or {})
        group = marks.get("_group")
        if isinstance(group, dict):
            marks["_group"] = {k: v for k, v in group.items() if k != "_summarized_by_summary_id"}
        marks["_excluded"] = False
        marks.pop("_exclude_reason", None)
        columns[message_id] = message_rows.mark_columns(marks, where=f"message {message_id!r}", max_bytes=max_bytes)
    await rewrites.rewrite_marks(conn, session_id, columns, horizon=cut + 1)
    if columns:  # included again, and not placed maybe: a load of the included reads the whole range
        await rewrites.lower_included_from(conn, session_id, 0, exactly=True)


async def _copy(conn: AsyncConnection, table: Any, source_id: str, new_id: str, condition: Any, **fixed: Any) -> None:
    from sqlalchemy import insert

    columns = [c for c in table.c if c.name != "session_id"]
    values = [literal(fixed[c.name]) if c.name in fixed else c for c in columns]
    query = select(literal(new_id), *values).where(table.c.session_id == source_id)
    if condition is not None:
        query = query.where(condition)
    await conn.execute(insert(table).from_select(["session_id", *[c.name for c in columns]], query))


@tenancy.for_user
async def branch(db: Database, session_id: str, user_id: str | None, at_seq: int | None, new_id: str) -> str:
    """A branch of a session at ``at_seq`` (kept paired): a new session of the same user whose history up to there
    is the source's, read through it (0017), never copied; the source's own state keys copied, fresh stamps."""
    codec.check_id(new_id, "new_id", required=True)
    now = datetime.now(UTC)
    async with db.transaction(write=True, doing="branching a session") as conn:
        if user_id is not None:
            await lock_user(conn, user_id, exclusive=False)  # creates one of the user's sessions: see erase_user
        query = select(sessions_t).where(*owned(session_id, user_id))
        if conn.dialect.name == "postgresql":  # FOR SHARE: a purge skips the source until the branch is in
            query = query.with_for_update(read=True)
        source = (await conn.execute(query)).first()
        if source is None:
            raise not_found(session_id, user_id)
        last = source.next_seq - 1
        if at_seq is not None:
            _check_seq(at_seq, "at_seq", last)
        cut = await _paired_cut(conn, session_id, last if at_seq is None else at_seq)
        if source.base_seq is not None and cut + 1 < source.base_seq:
            raise InvalidValueError(f"at_seq {cut} is in the history {session_id!r} reads from its own base: branch "
                                    "that session instead")  # fmt: skip
        version = await _version_at(conn, session_id, cut, source.version)
        row = chains.branch_row(source, new_id, cut + 1, version, new_stamp(), now, source.expires_at)
        insert = (postgresql if conn.dialect.name == "postgresql" else sqlite).insert(sessions_t)
        if not (await conn.execute(insert.on_conflict_do_nothing(), row)).rowcount:
            raise InvalidValueError(f"new_id {new_id!r} is already in use; choose another id")
        await _copy(conn, state_t, session_id, new_id, None, version=new_stamp())
        # kept from now on (its first keys are not changes: no history row of version 0)
        await conn.execute(update(sessions_t).where(S.id == new_id).values(keeps_history=True))
    return new_id


async def _version_at(conn: AsyncConnection, session_id: str, cut: int, now: int) -> int:
    """The session's version as at ``cut``, for a branch's view of its marks: just before its first rewrite by a
    commit after the cut (0016 keeps each rewrite's earlier values, with the rewriting commit's version and first
    seq), else ``now`` (nothing rewritten since). Not ``now`` in general: a branch made at an earlier message
    would see every later compaction of its base, which a copy of the same cut never does."""
    K = message_marks_t.c
    first = (await conn.execute(select(func.min(K.version)).where(K.session_id == session_id, K.horizon > cut)))
    found = first.scalar()
    if found is not None and int(found) == 0:  # rewrites a fork copied from its source, their versions not kept
        raise InvalidValueError(f"session {session_id!r} is a copy whose compaction before seq {cut + 1} was copied "
                                "with it: a branch there could not read its marks as they were; branch the session "
                                "it was copied from, or make a copy (share=False)")  # fmt: skip
    return now if found is None else int(found) - 1


@tenancy.for_user
async def tree(db: Database, session_id: str, user_id: str | None) -> list[TreeNode]:
    """The tree from ``session_id`` down (README's "response-tree" query, from one session instead of a user's)."""
    top = select(S.id, S.base_id, S.base_seq, S.user_id, S.incarnation, literal(0).label("depth"))
    down: Any = top.where(*owned(session_id, user_id)).cte("tree", recursive=True)
    child = sessions_t.alias("child")
    down = down.union_all(select(child.c.id, child.c.base_id, child.c.base_seq, child.c.user_id, child.c.incarnation,
                                 down.c.depth + 1).where(chains.base_of(child, down), down.c.depth < CHAIN_MAX))
    r, up = responses_t.c, responses_t.alias("up")  # up: the point a response continued from (0021)
    parent_key = func.coalesce(up.c.response_id, r.parent_id).label("parent_id")
    query = select(down, r.response_id, parent_key, r.seq_end).select_from(down).outerjoin(
        responses_t, and_(r.session_id == down.c.id, r.seq_end != GONE)).outerjoin(up, up.c.id == r.parent)  # fmt: skip
    async with db.transaction(write=False, replica=True, doing="reading a conversation tree") as conn:
        found = (await conn.execute(query.order_by(down.c.depth, down.c.id, r.seq_end, r.response_id))).all()
    if not found:
        raise not_found(session_id, user_id)
    return [TreeNode(depth=n.depth, session_id=n.id, base_id=n.base_id, base_seq=n.base_seq,
                     response_id=n.response_id, parent_id=n.parent_id, seq_end=n.seq_end) for n in found]  # fmt: skip
