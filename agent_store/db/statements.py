"""The SQL a run executes, one small function per statement; every statement is batched and parameterized.

:mod:`agent_store.run` calls these in order; keeping the SQL here keeps the run's data flow readable there.
"""

from __future__ import annotations

import functools
import hashlib
import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Table, bindparam, case, cast, delete, func, insert, literal, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db import erasures
from agent_store.db.database import APP_LOCK, USER_LOCK
from agent_store.db.message_rows import EncodedMessage
from agent_store.db.scopes import Scope
from agent_store.db.tables import UTCDateTime, messages_t, sessions_t, tool_calls_t
from agent_store.errors import ConflictError, SessionClosedError, SessionNotFoundError


def _insert(db: AsyncConnection, table: Table) -> Any:
    return (postgresql if db.dialect.name == "postgresql" else sqlite).insert(table)


def session_fence(db: Any, session_id: str, user_id: str | None, since: datetime) -> erasures.Fence:
    """The erasure fence of a run of ``session_id``, before a first key is made (db/sealing.py): refused as its
    commit would refuse it (not found)."""
    return erasures.fence(db, user_id, since, lambda: not_found(session_id, user_id))


def not_found(session_id: str, user_id: str | None, *, starting: bool = False) -> SessionNotFoundError:
    """The one refusal for an id that is unknown, deleted, or another user's / agent's: ids do not leak.
    ``starting``: a run's load, which would have created the session (its hint is about picking ids)."""
    whose = "without a user" if user_id is None else f"for user {user_id!r}"
    if user_id is None:
        hint = "a user's session is found only with its user id: user_id=, --user"
    elif starting:  # one namespace for every user's ids: starting "chat-1" fails for a second user who picks it too
        hint = "session ids are shared by all users: to start a session, give it an id of its own, e.g. a UUID"
    else:
        hint = "list_sessions(user_id=...), or `agent-store sessions --user ID`, lists a user's sessions"
    return SessionNotFoundError(f"no session {session_id!r} {whose} ({hint})")


# ---- load -----------------------------------------------------------------------------------------------
# Statements are built once, with bound parameters, so each run pays only for executing them.

_S, _M = sessions_t.c, messages_t.c
READ_SESSION = select(
    _S.user_id, _S.agent_id, _S.incarnation, _S.service_session_id, _S.version, _S.next_seq, _S.closed_at,
    _S.expires_at,
).where(_S.id == bindparam("sid"))  # fmt: skip


# ---- commit ---------------------------------------------------------------------------------------------


def new_stamp() -> int:
    """A write stamp: random 62 bits, so no later write (fork, import, re-creation) ever repeats one (no ABA)."""
    return uuid.uuid4().int >> 66


async def lock_session(db: AsyncConnection, session_id: str) -> int | None:
    """Take the session row's lock (SQLite's write lock holds it already): its incarnation, None if no row."""
    found = await db.execute(select(_S.incarnation).where(_S.id == session_id).with_for_update())
    return found.scalar_one_or_none()


async def create_session(db: AsyncConnection, row: dict[str, Any]) -> bool:
    """Whether the row went in (False: the id was there: another run created it, or it was never gone)."""
    return bool((await db.execute(_insert(db, sessions_t).on_conflict_do_nothing(), row)).rowcount)


async def wait_for_creation(db: AsyncConnection, session_id: str, incarnation: int) -> None:
    """Wait until no other transaction is creating ``session_id`` (PostgreSQL): an insert of the same key waits
    for an uncommitted one to end. The probe's row is never kept (rolled back to its savepoint)."""
    if db.dialect.name != "postgresql":
        return  # SQLite's write lock: no other transaction is in flight
    now = datetime.now(UTC)
    probe = {"id": session_id, "user_id": None, "agent_id": None, "incarnation": incarnation, "version": 0,
             "next_seq": 0, "created_at": now, "updated_at": now}  # fmt: skip
    savepoint = await db.begin_nested()
    try:
        await create_session(db, probe)
    finally:
        await savepoint.rollback()


def _expires(dialect: str) -> Any:
    """``expires_at`` computed from the row's own TTL at commit time (a TTL set mid-run is not undone)."""
    own: Any
    if dialect == "postgresql":
        own = cast(bindparam("now", type_=UTCDateTime()), UTCDateTime()) + func.make_interval(
            0, 0, 0, 0, 0, 0, _S.ttl_seconds
        )
    else:  # the text form SQLAlchemy stores SQLite datetimes in: 'YYYY-MM-DD HH:MM:SS.ffffff' (UTC)
        own = func.datetime(bindparam("now_epoch") + _S.ttl_seconds, "unixepoch").concat(bindparam("now_frac"))
    return case((_S.ttl_seconds.is_(None), bindparam("default_expires", type_=UTCDateTime())), else_=own)


@functools.cache
def _bump(dialect: str, has_user: bool, check_incarnation: bool, service_session_id: bool) -> Any:
    values: dict[str, Any] = {
        "version": _S.version + 1,
        "next_seq": _S.next_seq + bindparam("n"),
        "updated_at": bindparam("now"),
        "last_run_at": bindparam("now"),
        "expires_at": _expires(dialect),
    }
    if service_session_id:  # None is stored as SQL NULL (no conversation), never as a JSON null
        values["service_session_id"] = bindparam("service_session_id", type_=_S.service_session_id.type)
    where = [
        _S.id == bindparam("sid"),
        _S.user_id == bindparam("uid") if has_user else _S.user_id.is_(None),
        _S.agent_id.is_(None) | (_S.agent_id == bindparam("agent")),  # the agent binding, in the ordering statement
        _S.closed_at.is_(None),
    ]
    if check_incarnation:
        where.append(_S.incarnation == bindparam("loaded_incarnation"))
    if service_session_id:  # moving the service-side conversation on: only from where this run found it
        loaded = bindparam("loaded_service_session_id", type_=_S.service_session_id.type)
        json_null = literal("null", _S.service_session_id.type)  # what earlier versions stored for None
        where.append(func.coalesce(_S.service_session_id, json_null) == func.coalesce(loaded, json_null))
    return update(sessions_t).where(*where).values(values).returning(_S.incarnation, _S.version, _S.next_seq)


async def bump_session(
    db: AsyncConnection, *, session_id: str, user_id: str | None, agent_id: str | None, incarnation: int | None,
    n_messages: int, now: datetime, default_expires: datetime | None, move_service_session_id: bool = False,
    service_session_id: str | None = None, loaded_service_session_id: str | None = None,
    retrying_creation: bool = False,
) -> tuple[int, int, int]:  # fmt: skip
    """Take the session row lock and advance it: (incarnation, new version, next_seq after this run's messages).

    The row must still be this user's and agent's, open, and (``incarnation`` given) the same life of the id.
    ``retrying_creation``: this is the retry of a commit that created the session and whose outcome is unknown.
    """
    ssid = move_service_session_id
    statement = _bump(db.dialect.name, user_id is not None, incarnation is not None, ssid)
    params: dict[str, Any] = {
        "sid": session_id, "uid": user_id, "agent": agent_id, "loaded_incarnation": incarnation, "n": n_messages,
        "now": now, "now_epoch": int(now.timestamp()), "now_frac": f".{now.microsecond:06d}",
        "default_expires": default_expires,
    }  # fmt: skip
    if ssid:
        params["service_session_id"] = service_session_id
        params["loaded_service_session_id"] = loaded_service_session_id
    bumped = (await db.execute(statement, params)).first()
    if bumped is not None:
        return int(bumped[0]), int(bumped[1]), int(bumped[2])
    row = (await db.execute(READ_SESSION, {"sid": session_id})).first()
    if row is None and retrying_creation:  # never landed (lost with a server), or landed and was deleted since
        raise creation_not_found(session_id, user_id)
    if row is None or row.user_id != user_id or row.agent_id not in (None, agent_id):
        raise not_found(session_id, user_id)
    if incarnation is not None and row.incarnation != incarnation:  # another conversation, closed or not
        raise ConflictError(session_id, [], reason="the session was deleted and created again since this run loaded it")
    if row.closed_at is None:  # then only the service-side conversation can have moved
        raise ConflictError(
            session_id, ["service_session_id"],
            reason="another run moved the service-side conversation (service_session_id) on since this run loaded it",
        )  # fmt: skip
    raise SessionClosedError(f"session {session_id!r} was closed while this run was in progress")


def creation_not_found(session_id: str, user_id: str | None) -> SessionNotFoundError:
    return SessionNotFoundError(
        f"no session {session_id!r} for user {user_id!r}: this retry's first attempt created it and its outcome "
        "is unknown; the session was deleted since, or the attempt was lost with the server (a crash or a "
        "failover). To run it again, load it again: store.load(..., run_id=...) lands it exactly once"
    )


async def give_back_seq(db: AsyncConnection, session_id: str, unused: int) -> None:
    """Return seq numbers reserved for messages that turned out to be stored already (still under the lock)."""
    await db.execute(
        update(sessions_t).where(sessions_t.c.id == session_id).values(next_seq=sessions_t.c.next_seq - unused)
    )


async def lock_user(db: AsyncConnection, user_id: str, *, exclusive: bool) -> None:
    """Order this transaction against ``erase_user`` and other writers of the user's keys (PostgreSQL).

    Taken before any session row lock, always: the one lock order that cannot deadlock. Exclusive to write
    ``user:`` keys or erase the user; shared to create one of the user's sessions. SQLite's write lock
    already serializes all of this.
    """
    if db.dialect.name == "postgresql":
        lock = func.pg_advisory_xact_lock if exclusive else func.pg_advisory_xact_lock_shared
        await db.execute(select(lock(USER_LOCK, func.hashtext(user_id))))


async def lock_app_scope(db: AsyncConnection, app_id: str) -> None:
    """Serialize writers of one app's shared keys (PostgreSQL; SQLite's write lock already does)."""
    if db.dialect.name == "postgresql":
        await db.execute(select(func.pg_advisory_xact_lock(APP_LOCK, func.hashtext(app_id))))


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


async def stored_stamps(db: AsyncConnection, scope: Scope, keys: Iterable[str]) -> dict[str, int]:
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


async def already_stored(db: AsyncConnection, session_id: str, message_ids: list[str]) -> set[str]:
    c = messages_t.c
    found = select(c.message_id).where(c.session_id == session_id, c.message_id.in_(message_ids))
    if db.dialect.name == "postgresql":  # the unique index keys md5(message_id)::uuid (migration 0011)
        found = found.where(cast(func.md5(c.message_id), UUID).in_([id_hash(i) for i in message_ids]))
    rows = await db.execute(found)
    return set(rows.scalars().all())


def id_hash(message_id: str) -> uuid.UUID:
    """``md5(message_id)::uuid`` as PostgreSQL computes it (over the id's UTF-8 bytes)."""
    return uuid.UUID(hashlib.md5(message_id.encode(), usedforsecurity=False).hexdigest())


async def insert_messages(
    db: AsyncConnection, session_id: str, records: Sequence[EncodedMessage], first_seq: int, run_id: str, now: datetime
) -> None:
    if not records:
        return
    fixed = {"session_id": session_id, "run_id": run_id, "created_at": now}
    rows = [{**r.columns, **fixed, "seq": first_seq + i} for i, r in enumerate(records)]
    for row in rows:  # a message inserted excluded keeps this commit's first seq (0013)
        row["excluded_at"] = first_seq if row["excluded"] else None
    await db.execute(insert(messages_t), rows)
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
