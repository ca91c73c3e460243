"""The SQL a run executes, one small function per statement; every statement is batched and parameterized.

:mod:`agent_store.run` calls these in order; keeping the SQL here keeps the run's data flow readable there.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Table, bindparam, case, delete, func, insert, literal, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Select

from .codec import EncodedMessage
from .errors import InvalidValueError, SessionClosedError, SessionNotFoundError
from .tables import app_state_t, messages_t, runs_t, sessions_t, state_t, tool_calls_t, user_state_t

USER_PREFIX, APP_PREFIX, TEMP_PREFIX = "user:", "app:", "temp:"


@dataclass(frozen=True)
class Scope:
    """Where a state key lives: the session's own rows, or rows shared by a user's or an app's sessions."""

    prefix: str
    table: Table
    owner_column: str
    owner: str

    def stored_key(self, key: str) -> str:
        return key[len(self.prefix) :]


def owner_is(column: Any, value: str | None) -> Any:
    """``column = value``, or ``IS NULL`` for no owner (``IS NOT DISTINCT FROM`` cannot use an index)."""
    return column.is_(None) if value is None else column == value


def scopes(session_id: str, user_id: str | None, app_id: str) -> list[Scope]:
    found = [Scope("", state_t, "session_id", session_id), Scope(APP_PREFIX, app_state_t, "app_id", app_id)]
    if user_id is not None:
        found.append(Scope(USER_PREFIX, user_state_t, "user_id", user_id))
    return found


def scope_of(key: str, available: Sequence[Scope]) -> Scope:
    prefix = USER_PREFIX if key.startswith(USER_PREFIX) else APP_PREFIX if key.startswith(APP_PREFIX) else ""
    for scope in available:
        if scope.prefix == prefix:
            return scope
    raise InvalidValueError(f"state[{key!r}]: user-scoped keys need a session opened with a user_id")


def _insert(db: AsyncConnection, table: Table) -> Any:
    return (postgresql if db.dialect.name == "postgresql" else sqlite).insert(table)


# ---- load -----------------------------------------------------------------------------------------------


def read_session(session_id: str) -> Select[Any]:
    c = sessions_t.c
    columns = (
        c.user_id,
        c.agent_id,
        c.service_session_id,
        c.version,
        c.next_seq,
        c.closed_at,
        c.expires_at,
        c.ttl_seconds,
    )
    return select(*columns).where(c.id == session_id)


def read_state(available: Sequence[Scope]) -> Any:
    """All state rows of every scope in one round trip: (prefix, key, value, version)."""
    parts = [
        select(literal(s.prefix).label("prefix"), s.table.c.key, s.table.c.value, s.table.c.version).where(
            s.table.c[s.owner_column] == s.owner
        )
        for s in available
    ]
    return parts[0].union_all(*parts[1:])


def read_messages(session_id: str, next_seq: int, history_limit: int | None) -> Select[Any]:
    """The history, or its last ``history_limit`` messages widened so no tool result loses its call."""
    query = select(messages_t.c.message_id, messages_t.c.body).where(messages_t.c.session_id == session_id)
    if history_limit is not None:
        start = next_seq - history_limit
        result, call = tool_calls_t.alias("result"), tool_calls_t.alias("call")
        earliest_call = (
            select(func.min(call.c.seq))
            .select_from(
                result.join(call, (call.c.session_id == result.c.session_id) & (call.c.call_id == result.c.call_id))
            )
            .where(result.c.session_id == session_id, result.c.kind == "result", result.c.seq >= start)
            .where(call.c.kind == "call")
            .scalar_subquery()
        )
        query = query.where(messages_t.c.seq >= case((earliest_call < start, earliest_call), else_=start))
    return query.order_by(messages_t.c.seq)


# ---- commit ---------------------------------------------------------------------------------------------


async def create_session(db: AsyncConnection, row: dict[str, Any]) -> None:
    await db.execute(_insert(db, sessions_t).on_conflict_do_nothing(), row)


async def bump_session(
    db: AsyncConnection, session_id: str, user_id: str | None, n_messages: int, values: dict[str, Any]
) -> tuple[int, int]:
    """Take the session row lock and advance it; returns (new version, next_seq after this run's messages)."""
    c = sessions_t.c
    owned = (c.id == session_id, owner_is(c.user_id, user_id))
    bumped = (
        await db.execute(
            update(sessions_t)
            .where(*owned, c.closed_at.is_(None))
            .values(version=c.version + 1, next_seq=c.next_seq + n_messages, **values)
            .returning(c.version, c.next_seq)
        )
    ).first()
    if bumped is None:
        if (await db.execute(select(c.closed_at).where(*owned))).first() is not None:
            raise SessionClosedError(f"session {session_id!r} was closed while this run was in progress")
        raise SessionNotFoundError(f"session {session_id!r} no longer exists for user {user_id!r}")
    return int(bumped[0]), int(bumped[1])


async def delete_if_expired(db: AsyncConnection, session_id: str, user_id: str | None, now: datetime) -> None:
    c = sessions_t.c
    await db.execute(delete(sessions_t).where(c.id == session_id, owner_is(c.user_id, user_id), c.expires_at <= now))


async def give_back_seq(db: AsyncConnection, session_id: str, unused: int) -> None:
    """Return seq numbers reserved for messages that turned out to be stored already (still under the lock)."""
    await db.execute(
        update(sessions_t).where(sessions_t.c.id == session_id).values(next_seq=sessions_t.c.next_seq - unused)
    )


async def lock_shared_scope(db: AsyncConnection, scope: Scope) -> None:
    """Serialize writers of one user's / app's shared keys (SQLite's write lock already does)."""
    if db.dialect.name == "postgresql":  # lock classes: 1 serialized sessions, 2 users, 3 apps
        lock_class = 2 if scope.prefix == USER_PREFIX else 3
        await db.execute(select(func.pg_advisory_xact_lock(lock_class, func.hashtext(scope.owner))))


async def stored_versions(db: AsyncConnection, scope: Scope, keys: Iterable[str]) -> dict[str, int]:
    t = scope.table
    rows = await db.execute(
        select(t.c.key, t.c.version).where(t.c[scope.owner_column] == scope.owner, t.c.key.in_(list(keys)))
    )
    return {scope.prefix + key: version for key, version in rows.all()}


async def write_state(
    db: AsyncConnection, scope: Scope, upserts: dict[str, str], deletes: list[str], stamp: int, now: datetime
) -> None:
    t = scope.table
    t_owner = t.c[scope.owner_column]
    if deletes:
        await db.execute(delete(t).where(t_owner == scope.owner, t.c.key.in_([scope.stored_key(k) for k in deletes])))
    if upserts:
        stmt = _insert(db, t)
        set_ = {"value": stmt.excluded.value, "version": stmt.excluded.version, "updated_at": stmt.excluded.updated_at}
        await db.execute(
            stmt.on_conflict_do_update(index_elements=[t_owner, t.c.key], set_=set_),
            [
                {
                    scope.owner_column: scope.owner,
                    "key": scope.stored_key(k),
                    "value": v,
                    "version": stamp,
                    "updated_at": now,
                }
                for k, v in upserts.items()
            ],
        )


def new_stamp() -> int:
    """A write stamp for shared-scope rows: random, so a deleted-then-recreated key never looks unchanged."""
    return secrets.randbits(62)


async def already_stored(db: AsyncConnection, session_id: str, message_ids: list[str]) -> set[str]:
    c = messages_t.c
    rows = await db.execute(select(c.message_id).where(c.session_id == session_id, c.message_id.in_(message_ids)))
    return set(rows.scalars().all())


async def insert_messages(
    db: AsyncConnection, session_id: str, records: Sequence[EncodedMessage], first_seq: int, run_id: str, now: datetime
) -> None:
    if not records:
        return
    await db.execute(
        insert(messages_t),
        [
            {**r.columns, "session_id": session_id, "seq": first_seq + i, "run_id": run_id, "created_at": now}
            for i, r in enumerate(records)
        ],
    )
    tools = [
        {"session_id": session_id, "seq": first_seq + i, "call_id": call_id, "kind": kind, "tool_name": name}
        for i, r in enumerate(records)
        for call_id, kind, name in r.tools
    ]
    if tools:
        # A result whose call was committed earlier (per-service-call saves) takes the name from that call's row.
        call = tool_calls_t.alias("call")
        earlier_name = (
            select(call.c.tool_name)
            .where(call.c.session_id == bindparam("session_id"), call.c.call_id == bindparam("call_id"))
            .where(call.c.kind == "call")
            .limit(1)
            .scalar_subquery()
        )
        params: dict[str, Any] = {name: bindparam(name) for name in ("session_id", "seq", "call_id", "kind")}
        await db.execute(
            insert(tool_calls_t).values(**params, tool_name=func.coalesce(bindparam("tool_name"), earlier_name)), tools
        )


async def record_run(db: AsyncConnection, row: dict[str, Any]) -> None:
    await db.execute(insert(runs_t), row)


async def run_recorded(db: AsyncConnection, session_id: str, run_id: str) -> int | None:
    """The session version a run produced, if that run is already committed."""
    c = runs_t.c
    found = await db.execute(
        select(c.version).where(c.session_id == session_id, c.run_id == run_id, c.outcome == "committed")
    )
    version = found.scalar()
    return int(version) if version is not None else None


def run_log_row(
    ids: dict[str, Any], version: int, records: Sequence[EncodedMessage], keys: int, usage: dict[str, int], outcome: str
) -> dict[str, Any]:
    """The agent_runs row for one commit (or refused commit): who ran, what went in and out, tokens."""
    roles = [r.columns["role"] for r in records]
    authors = [
        r.columns["author_name"] for r in records if r.columns["role"] == "assistant" and r.columns["author_name"]
    ]
    return {
        **ids,
        "version": version,
        "messages_written": len(records),
        "state_keys_written": keys,
        "committed_at": datetime.now(UTC),
        "agent_name": authors[-1] if authors else None,
        "messages_in": sum(role in ("user", "tool") for role in roles),
        "messages_out": roles.count("assistant"),
        "input_tokens": usage.get("input_token_count"),
        "output_tokens": usage.get("output_token_count"),
        "outcome": outcome,
    }
