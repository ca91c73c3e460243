"""The SQL a run executes, one small function per statement; every statement is batched and parameterized.

:mod:`agent_store.run` calls these in order; keeping the SQL here keeps the run's data flow readable there.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Integer, Table, bindparam, case, delete, func, insert, literal, select, update
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
# Statements are built once, with bound parameters, so each run pays only for executing them.

_S, _M = sessions_t.c, messages_t.c
READ_SESSION = select(
    _S.user_id, _S.agent_id, _S.service_session_id, _S.version, _S.next_seq, _S.closed_at, _S.expires_at, _S.ttl_seconds
).where(_S.id == bindparam("sid"))


def _state_rows(prefix: str, table: Table, owner_column: str, param: str) -> Select[Any]:
    t = table.c
    return select(literal(prefix).label("prefix"), t.key, t.value, t.version).where(t[owner_column] == bindparam(param))


_SESSION_STATE = _state_rows("", state_t, "session_id", "sid")
_APP_STATE = _state_rows(APP_PREFIX, app_state_t, "app_id", "app")
# All state rows of every scope in one round trip: (prefix, key, value, version).
READ_STATE = _SESSION_STATE.union_all(_APP_STATE)
READ_STATE_WITH_USER = _SESSION_STATE.union_all(_APP_STATE, _state_rows(USER_PREFIX, user_state_t, "user_id", "uid"))


def read_state(session_id: str, user_id: str | None, app_id: str) -> tuple[Any, dict[str, Any]]:
    if user_id is None:
        return READ_STATE, {"sid": session_id, "app": app_id}
    return READ_STATE_WITH_USER, {"sid": session_id, "app": app_id, "uid": user_id}


def _windowed() -> Select[Any]:
    """The last messages from ``:start`` on, widened back to the call of any function result in the window."""
    result, call = tool_calls_t.alias("result"), tool_calls_t.alias("call")
    start: Any = bindparam("start", type_=Integer())
    earliest_call = (
        select(func.min(call.c.seq))
        .select_from(
            result.join(call, (call.c.session_id == result.c.session_id) & (call.c.call_id == result.c.call_id))
        )
        .where(result.c.session_id == bindparam("sid"), result.c.kind == "result", result.c.seq >= start)
        .where(call.c.kind == "call")
        .scalar_subquery()
    )
    return (
        select(_M.message_id, _M.body)
        .where(_M.session_id == bindparam("sid"), _M.seq >= case((earliest_call < start, earliest_call), else_=start))
        .order_by(_M.seq)
    )


READ_ALL_MESSAGES = select(_M.message_id, _M.body).where(_M.session_id == bindparam("sid")).order_by(_M.seq)
READ_WINDOW = _windowed()


def read_messages(session_id: str, next_seq: int, history_limit: int | None) -> tuple[Any, dict[str, Any]]:
    """The history, or its last ``history_limit`` messages widened so no tool result loses its call."""
    if history_limit is None:
        return READ_ALL_MESSAGES, {"sid": session_id}
    return READ_WINDOW, {"sid": session_id, "start": next_seq - history_limit}


# ---- commit ---------------------------------------------------------------------------------------------


async def create_session(db: AsyncConnection, row: dict[str, Any]) -> None:
    await db.execute(_insert(db, sessions_t).on_conflict_do_nothing(), row)


@functools.cache
def _bump(has_user: bool, service_session_id: bool) -> Any:
    values: dict[str, Any] = {
        "version": _S.version + 1,
        "next_seq": _S.next_seq + bindparam("n"),
        "updated_at": bindparam("now"),
        "last_run_at": bindparam("now"),
        "expires_at": bindparam("expires_at"),
    }
    if service_session_id:
        values["service_session_id"] = bindparam("service_session_id", type_=_S.service_session_id.type)
    owner = _S.user_id == bindparam("uid") if has_user else _S.user_id.is_(None)
    return (
        update(sessions_t)
        .where(_S.id == bindparam("sid"), owner, _S.closed_at.is_(None))
        .values(values)
        .returning(_S.version, _S.next_seq)
    )


async def bump_session(
    db: AsyncConnection, session_id: str, user_id: str | None, n_messages: int, values: dict[str, Any]
) -> tuple[int, int]:
    """Take the session row lock and advance it; returns (new version, next_seq after this run's messages).

    ``values`` has ``now`` and ``expires_at``, and ``service_session_id`` when it changed.
    """
    statement = _bump(user_id is not None, "service_session_id" in values)
    params = {"sid": session_id, "uid": user_id, "n": n_messages, **values}
    bumped = (await db.execute(statement, params)).first()
    if bumped is None:
        owned = (_S.id == session_id, owner_is(_S.user_id, user_id))
        if (await db.execute(select(_S.closed_at).where(*owned))).first() is not None:
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


@functools.cache
def _versions(table: Table, owner_column: str) -> Any:
    t = table.c
    return select(t.key, t.version).where(
        t[owner_column] == bindparam("owner"), t.key.in_(bindparam("keys", expanding=True))
    )


@functools.cache
def _delete_keys(table: Table, owner_column: str) -> Any:
    t = table.c
    return delete(table).where(t[owner_column] == bindparam("owner"), t.key.in_(bindparam("keys", expanding=True)))


@functools.cache
def _upsert(dialect: str, table: Table, owner_column: str) -> Any:
    stmt = (postgresql if dialect == "postgresql" else sqlite).insert(table)
    excluded = stmt.excluded
    return stmt.on_conflict_do_update(
        index_elements=[table.c[owner_column], table.c.key],
        set_={"value": excluded.value, "version": excluded.version, "updated_at": excluded.updated_at},
    )


async def stored_versions(db: AsyncConnection, scope: Scope, keys: Iterable[str]) -> dict[str, int]:
    rows = await db.execute(_versions(scope.table, scope.owner_column), {"owner": scope.owner, "keys": list(keys)})
    return {scope.prefix + key: version for key, version in rows.all()}


async def write_state(
    db: AsyncConnection, scope: Scope, upserts: dict[str, str], deletes: list[str], stamp: int, now: datetime
) -> None:
    if deletes:
        stored = [scope.stored_key(k) for k in deletes]
        await db.execute(_delete_keys(scope.table, scope.owner_column), {"owner": scope.owner, "keys": stored})
    if upserts:
        rows = [
            {
                scope.owner_column: scope.owner,
                "key": scope.stored_key(k),
                "value": v,
                "version": stamp,
                "updated_at": now,
            }
            for k, v in upserts.items()
        ]
        await db.execute(_upsert(db.dialect.name, scope.table, scope.owner_column), rows)


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
