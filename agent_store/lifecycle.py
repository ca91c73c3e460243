"""Session lifecycle outside a run: list, inspect, update, close, clear, expire, erase, fork, truncate.

Every function takes the owner (``user_id``) and touches only that owner's sessions: a session id under
another user behaves exactly like an id that does not exist.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, delete, func, insert, literal, select, text, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection

from . import codec, telemetry
from .errors import InvalidValueError, SessionNotFoundError
from .models import ErasureReport, MessageRecord, SessionInfo, SessionPage
from .statements import owner_is
from .tables import JsonText, messages_t, runs_t, sessions_t, state_t, tool_calls_t, user_state_t

if TYPE_CHECKING:
    from .store import Store

S = sessions_t.c
_SCALARS = (str, int, float, bool)


def owned(session_id: str, user_id: str | None) -> tuple[ColumnElement[bool], ...]:
    codec.check_id(session_id, "session_id", required=True)
    codec.check_id(user_id, "user_id")
    return S.id == session_id, owner_is(S.user_id, user_id)


def info(row: Any) -> SessionInfo:
    return SessionInfo(
        id=row.id,
        user_id=row.user_id,
        agent_id=row.agent_id,
        title=row.title,
        metadata=row.metadata or {},
        message_count=row.next_seq,
        version=row.version,
        created_at=row.created_at,
        updated_at=row.updated_at,
        last_run_at=row.last_run_at,
        closed_at=row.closed_at,
        expires_at=row.expires_at,
    )


_INFO_COLUMNS = (
    S.id,
    S.user_id,
    S.agent_id,
    S.title,
    S["metadata"],
    S.next_seq,
    S.version,
    S.created_at,
    S.updated_at,
    S.last_run_at,
    S.closed_at,
    S.expires_at,
)


def _metadata_filter(db: AsyncConnection, metadata: dict[str, Any]) -> list[ColumnElement[bool]]:
    """Equality on top-level metadata keys (JSONB containment on PostgreSQL, json_extract on SQLite)."""
    for key, value in metadata.items():
        if type(value) not in _SCALARS or not isinstance(key, str) or '"' in key:
            raise InvalidValueError(f"metadata filter {key!r}: filter on string keys with str/int/float/bool values")
    if db.dialect.name == "postgresql":
        return [S["metadata"].op("@>")(literal(codec.dumps(metadata, where="metadata filter"), JsonText()))]
    return [func.json_extract(S["metadata"], f'$."{key}"') == value for key, value in metadata.items()]


def _encode_cursor(row: Any) -> str:
    raw = json.dumps([row.updated_at.isoformat(), row.id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        updated_at, session_id = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        return datetime.fromisoformat(updated_at), str(session_id)
    except (ValueError, TypeError) as exc:
        raise InvalidValueError("cursor is not one this store handed out") from exc


async def list_sessions(
    store: Store,
    *,
    user_id: str | None,
    all_users: bool,
    agent_id: str | None,
    metadata: dict[str, Any] | None,
    limit: int,
    cursor: str | None,
) -> SessionPage:
    if type(limit) is not int or not 1 <= limit <= 1000:
        raise InvalidValueError(f"limit must be an int from 1 to 1000, not {limit!r}")
    codec.check_id(user_id, "user_id")
    async with store._transaction(write=False, replica=True, doing="listing sessions") as db:
        query = select(*_INFO_COLUMNS)
        if not all_users:
            query = query.where(owner_is(S.user_id, user_id))
        if agent_id is not None:
            query = query.where(S.agent_id == agent_id)
        if metadata:
            query = query.where(*_metadata_filter(db, metadata))
        if cursor is not None:  # keyset pagination: resume strictly after the last row of the previous page
            query = query.where(tuple_(S.updated_at, S.id) < tuple_(*_decode_cursor(cursor)))
        query = query.order_by(S.updated_at.desc(), S.id.desc()).limit(limit + 1)
        rows = (await db.execute(query)).all()
    more = len(rows) > limit
    return SessionPage(
        items=[info(r) for r in rows[:limit]], next_cursor=_encode_cursor(rows[limit - 1]) if more else None
    )


async def get(store: Store, session_id: str, user_id: str | None) -> SessionInfo:
    async with store._transaction(write=False, replica=True, doing="reading a session") as db:
        row = (await db.execute(select(*_INFO_COLUMNS).where(*owned(session_id, user_id)))).first()
    if row is None:
        raise SessionNotFoundError(f"no session {session_id!r} for user {user_id!r}")
    return info(row)


async def messages(
    store: Store, session_id: str, user_id: str | None, after_seq: int, limit: int
) -> list[MessageRecord]:
    if type(limit) is not int or not 1 <= limit <= 10_000 or type(after_seq) is not int:
        raise InvalidValueError("after_seq must be an int and limit an int from 1 to 10000")
    M = messages_t.c
    async with store._transaction(write=False, replica=True, doing="reading messages") as db:
        if (await db.execute(select(S.id).where(*owned(session_id, user_id)))).first() is None:
            raise SessionNotFoundError(f"no session {session_id!r} for user {user_id!r}")
        query = select(messages_t).where(M.session_id == session_id, M.seq > after_seq).order_by(M.seq).limit(limit)
        rows = (await db.execute(query)).mappings().all()
    cipher = store.message_cipher
    return [MessageRecord(**{**row, "body": codec.plain_body(row["body"], cipher)}) for row in rows]


async def _change(store: Store, doing: str, session_id: str, user_id: str | None, **values: Any) -> None:
    async with store._transaction(write=True, doing=doing) as db:
        done = await db.execute(update(sessions_t).where(*owned(session_id, user_id)).values(**values))
    if not done.rowcount:
        raise SessionNotFoundError(f"no session {session_id!r} for user {user_id!r}")


async def update_info(store: Store, session_id: str, user_id: str | None, changes: dict[str, Any]) -> None:
    values: dict[str, Any] = {"updated_at": datetime.now(UTC)}
    if "title" in changes:
        if changes["title"] is not None and (not isinstance(changes["title"], str) or len(changes["title"]) > 512):
            raise InvalidValueError("title must be a string of at most 512 characters, or None")
        values["title"] = changes["title"]
    if "metadata" in changes:
        if not isinstance(changes["metadata"], dict):
            raise InvalidValueError("metadata must be a dict")
        values["metadata"] = codec.dumps(codec.encode_state(changes["metadata"], key="metadata"), where="metadata")
    if "ttl" in changes:
        ttl = changes["ttl"]
        values["ttl_seconds"] = None if ttl is None else max(1, int(ttl.total_seconds()))
        if ttl is not None:
            values["expires_at"] = values["updated_at"] + ttl
    await _change(store, "updating a session", session_id, user_id, **values)


async def close(store: Store, session_id: str, user_id: str | None) -> None:
    await _change(store, "closing a session", session_id, user_id, closed_at=datetime.now(UTC))


async def clear(store: Store, session_id: str, user_id: str | None) -> int:
    """Delete the session's messages (its state stays); returns how many were deleted."""
    async with store._transaction(write=True, doing="clearing a session") as db:
        if (
            await db.execute(
                update(sessions_t).where(*owned(session_id, user_id)).values(next_seq=0, version=S.version + 1)
            )
        ).rowcount == 0:
            raise SessionNotFoundError(f"no session {session_id!r} for user {user_id!r}")
        return int((await db.execute(delete(messages_t).where(messages_t.c.session_id == session_id))).rowcount)


async def purge_expired(store: Store, batch_size: int, progress: Callable[[int], None] | None) -> int:
    """Delete expired sessions, ``batch_size`` per short transaction; returns how many were deleted."""
    if type(batch_size) is not int or batch_size < 1:
        raise InvalidValueError(f"batch_size must be a positive int, not {batch_size!r}")
    total = 0
    with telemetry.operation("purge") as span:
        while True:
            async with store._transaction(write=True, doing="purging expired sessions") as db:
                # SKIP LOCKED (PostgreSQL): a session a live run is committing to is left for the next purge.
                batch = (
                    select(S.id)
                    .where(S.expires_at <= datetime.now(UTC))
                    .order_by(S.expires_at)
                    .limit(batch_size)
                    .with_for_update(skip_locked=True)
                )
                deleted = (await db.execute(delete(sessions_t).where(S.id.in_(batch.scalar_subquery())))).rowcount
            total += deleted
            if progress is not None:
                progress(deleted)
            if deleted < batch_size:
                break
        span.set_attribute("sessions", total)
    telemetry.sessions_purged.add(total)
    return total


async def erase_user(store: Store, user_id: str) -> ErasureReport:
    codec.check_id(user_id, "user_id", required=True)
    mine = select(S.id).where(S.user_id == user_id).scalar_subquery()
    count = func.count()
    async with store._transaction(write=True, doing="erasing a user") as db:
        sessions = (await db.execute(select(count).where(S.user_id == user_id))).scalar_one()
        n_messages = (
            await db.execute(select(count).select_from(messages_t).where(messages_t.c.session_id.in_(mine)))
        ).scalar_one()
        n_state = (
            await db.execute(select(count).select_from(state_t).where(state_t.c.session_id.in_(mine)))
        ).scalar_one()
        n_user = (await db.execute(delete(user_state_t).where(user_state_t.c.user_id == user_id))).rowcount
        await db.execute(delete(sessions_t).where(S.user_id == user_id))  # messages, state, runs cascade
    return ErasureReport(
        user_id=user_id, sessions=sessions, messages=n_messages, state_rows=n_state, user_state_rows=n_user
    )


async def _paired_cut(db: AsyncConnection, session_id: str, cut: int) -> int:
    """Lower ``cut`` until no function call at or before it has its result after it."""
    call, result = tool_calls_t.alias("c"), tool_calls_t.alias("r")
    while True:
        split = (
            await db.execute(
                select(func.min(call.c.seq))
                .select_from(
                    call.join(result, (result.c.session_id == call.c.session_id) & (result.c.call_id == call.c.call_id))
                )
                .where(call.c.session_id == session_id, call.c.kind == "call", call.c.seq <= cut)
                .where(result.c.kind == "result", result.c.seq > cut)
            )
        ).scalar()
        if split is None:
            return cut
        cut = int(split) - 1


async def truncate(store: Store, session_id: str, user_id: str | None, after_seq: int) -> int:
    """Drop messages after ``after_seq`` (lowered to keep tool calls with their results); returns how many."""
    async with store._transaction(write=True, doing="truncating a session") as db:
        row = (await db.execute(select(S.next_seq).where(*owned(session_id, user_id)).with_for_update())).first()
        if row is None:
            raise SessionNotFoundError(f"no session {session_id!r} for user {user_id!r}")
        cut = min(await _paired_cut(db, session_id, after_seq), row.next_seq - 1)
        M = messages_t.c
        removed = (await db.execute(delete(messages_t).where(M.session_id == session_id, M.seq > cut))).rowcount
        await db.execute(update(sessions_t).where(S.id == session_id).values(next_seq=cut + 1, version=S.version + 1))
    return int(removed)


async def fork(store: Store, session_id: str, user_id: str | None, at_seq: int | None, new_id: str) -> str:
    """Copy a session's messages up to ``at_seq`` (kept paired) and its state into a new session of the same user."""
    codec.check_id(new_id, "new_id", required=True)
    now = datetime.now(UTC)
    async with store._transaction(write=True, doing="forking a session") as db:
        source = (await db.execute(select(sessions_t).where(*owned(session_id, user_id)))).first()
        if source is None:
            raise SessionNotFoundError(f"no session {session_id!r} for user {user_id!r}")
        cut = await _paired_cut(
            db, session_id, source.next_seq - 1 if at_seq is None else min(at_seq, source.next_seq - 1)
        )
        row = {c.name: getattr(source, c.name) for c in sessions_t.c}
        row.update(
            id=new_id, version=0, next_seq=cut + 1, created_at=now, updated_at=now, last_run_at=None, closed_at=None
        )
        row["metadata"] = codec.dumps(row["metadata"] or {}, where="metadata")
        row["service_session_id"] = None  # a service-side thread cannot be branched from here
        await db.execute(insert(sessions_t), row)
        await _copy(db, messages_t, session_id, new_id, messages_t.c.seq <= cut)
        await _copy(db, tool_calls_t, session_id, new_id, tool_calls_t.c.seq <= cut)
        await _copy(db, state_t, session_id, new_id, None)
    return new_id


async def _copy(db: AsyncConnection, table: Any, source_id: str, new_id: str, condition: Any) -> None:
    columns = [c for c in table.c if c.name != "session_id"]
    query = select(literal(new_id), *columns).where(table.c.session_id == source_id)
    if condition is not None:
        query = query.where(condition)
    await db.execute(insert(table).from_select(["session_id", *[c.name for c in columns]], query))


async def stats(store: Store, top: int = 5) -> dict[str, Any]:
    """Row counts, the busiest sessions, and on-disk sizes where the backend reports them."""
    async with store._transaction(write=False, replica=True, doing="reading statistics") as db:
        counts = {
            t.name: (await db.execute(select(func.count()).select_from(t))).scalar_one()
            for t in (sessions_t, messages_t, state_t, user_state_t, runs_t)
        }
        busiest = (await db.execute(select(S.id, S.user_id, S.next_seq).order_by(S.next_seq.desc()).limit(top))).all()
        sizes: dict[str, int] = {}
        if db.dialect.name == "postgresql":
            for name in counts:
                sizes[name] = (await db.execute(select(func.pg_total_relation_size(name)))).scalar_one()
        else:
            file_size = text("SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()")
            sizes["database"] = (await db.execute(file_size)).scalar_one()
    return {
        "rows": counts,
        "busiest": [{"id": r.id, "user_id": r.user_id, "messages": r.next_seq} for r in busiest],
        "bytes": sizes,
    }
