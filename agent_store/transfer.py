"""Export sessions to JSON Lines and import them back, row for row.

The file is one JSON object per line: a header, then for each session its ``session`` row followed by its
``message``, ``tool_call``, ``state`` and ``run`` rows, then (for a whole-user export) the user's
``user_state`` rows. Every column is kept: ids, seq, timestamps (ISO 8601, UTC), JSON values as JSON.
Importing recreates exactly those rows; a session that already exists is skipped, never duplicated.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Table, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from . import codec
from .errors import InvalidValueError, SessionNotFoundError
from .models import TransferReport
from .statements import owner_is
from .tables import (
    SCHEMA_REVISION,
    JsonText,
    UTCDateTime,
    messages_t,
    runs_t,
    sessions_t,
    state_t,
    tool_calls_t,
    user_state_t,
)

if TYPE_CHECKING:
    from .store import Store

FORMAT = "agent_store.jsonl"
_SESSION_TABLES: dict[str, Table] = {"message": messages_t, "tool_call": tool_calls_t, "state": state_t, "run": runs_t}
_TABLES: dict[str, Table] = {"session": sessions_t, **_SESSION_TABLES, "user_state": user_state_t}


def _to_json(table: Table, row: Any) -> dict[str, Any]:
    out = {}
    for column in table.c:
        value = row._mapping[column]
        out[column.name] = value.isoformat() if isinstance(value, datetime) else value
    return out


def _from_json(table: Table, data: dict[str, Any]) -> dict[str, Any]:
    """Column values for an insert; JSON columns are re-serialized with the store's own rules."""
    try:
        values = {column.name: data[column.name] for column in table.c if column.name in data}
        for column in table.c:
            value = values.get(column.name)
            if value is None:
                continue
            if isinstance(column.type, UTCDateTime):
                values[column.name] = datetime.fromisoformat(value).astimezone(UTC)
            elif isinstance(column.type, JsonText):
                values[column.name] = codec.dumps(value, where=f"{table.name}.{column.name}")
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidValueError(f"import: a {table.name} row is malformed: {exc}") from exc
    return values


def _line(kind: str, row: dict[str, Any]) -> str:
    return json.dumps({"kind": kind, "row": row}, ensure_ascii=False, allow_nan=False, sort_keys=True)


async def export(store: Store, *, user_id: str | None, session_id: str | None = None) -> AsyncIterator[str]:
    """Yield the JSON Lines of one session, or of every session of ``user_id`` and that user's shared state."""
    codec.check_id(user_id, "user_id")
    S = sessions_t.c
    async with store._transaction(write=False, replica=True, doing="listing sessions to export") as db:
        query = select(S.id).where(owner_is(S.user_id, user_id)).order_by(S.created_at, S.id)
        if session_id is not None:
            query = query.where(S.id == session_id)
        ids = list((await db.execute(query)).scalars())
    if session_id is not None and not ids:
        raise SessionNotFoundError(f"no session {session_id!r} for user {user_id!r}")
    yield json.dumps({"kind": "header", "format": FORMAT, "schema": SCHEMA_REVISION, "sessions": len(ids)})
    for sid in ids:  # one short, consistent read per session
        async with store._transaction(write=False, replica=True, doing="exporting a session") as db:
            yield _line(
                "session", _to_json(sessions_t, (await db.execute(select(sessions_t).where(S.id == sid))).one())
            )
            for kind, table in _SESSION_TABLES.items():
                order = [c for c in table.primary_key.columns]
                for row in await db.execute(select(table).where(table.c.session_id == sid).order_by(*order)):
                    yield _line(kind, _to_json(table, row))
    if session_id is None and user_id is not None:
        async with store._transaction(write=False, replica=True, doing="exporting user state") as db:
            U = user_state_t.c
            for row in await db.execute(select(user_state_t).where(U.user_id == user_id).order_by(U.key)):
                yield _line("user_state", _to_json(user_state_t, row))


async def import_lines(
    store: Store, lines: Iterable[str], progress: Callable[[int], None] | None = None
) -> TransferReport:
    """Insert the sessions in ``lines`` (as written by :func:`export`); existing sessions are skipped."""
    imported = skipped = 0
    pending: list[tuple[str, dict[str, Any]]] = []

    async def flush() -> None:
        nonlocal imported, skipped
        if not pending:
            return
        async with store._transaction(write=True, doing="importing a session") as db:
            if await _insert_session(db, pending):
                imported += 1
            else:
                skipped += 1
        if progress is not None:
            progress(1)
        pending.clear()

    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            kind, row = record["kind"], record.get("row")
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidValueError(f"import: line {number} is not an agent_store export record") from exc
        if kind == "header":
            if record.get("format") != FORMAT:
                raise InvalidValueError(f"import: line {number}: not an {FORMAT} file")
            continue
        if kind not in _TABLES or not isinstance(row, dict):
            raise InvalidValueError(f"import: line {number}: unknown record kind {kind!r}")
        if kind == "session":
            await flush()
        elif kind == "user_state":
            await flush()
            async with store._transaction(write=True, doing="importing user state") as db:
                await db.execute(_insert_ignoring_existing(db, user_state_t), _from_json(user_state_t, row))
            continue
        elif not pending:
            raise InvalidValueError(f"import: line {number}: a {kind} row before any session row")
        pending.append((kind, row))
    await flush()
    return TransferReport(imported=imported, skipped=skipped)


def _insert_ignoring_existing(db: AsyncConnection, table: Table) -> Any:
    from sqlalchemy.dialects import postgresql, sqlite

    return (postgresql if db.dialect.name == "postgresql" else sqlite).insert(table).on_conflict_do_nothing()


async def _insert_session(db: AsyncConnection, records: list[tuple[str, dict[str, Any]]]) -> bool:
    (_, session_row), rest = records[0], records[1:]
    session = _from_json(sessions_t, session_row)
    codec.check_id(session.get("id"), "session id", required=True)
    if (await db.execute(select(sessions_t.c.id).where(sessions_t.c.id == session["id"]))).first() is not None:
        return False
    await db.execute(insert(sessions_t), session)
    for kind, table in _SESSION_TABLES.items():  # messages before the tool calls that reference them
        rows = [{**_from_json(table, row), "session_id": session["id"]} for k, row in rest if k == kind]
        if rows:
            await db.execute(insert(table), rows)
    return True
