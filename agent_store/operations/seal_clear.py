"""Seal what a store with per-user keys holds in clear (issue 41): ``agent-store keys seal``, ``Store.seal_clear()``.

A store opened with ``keys=`` reads only sealed content: a row of a user's in clear is refused
(``ContentSealedError``), since it may have been put there by someone without the keys. Rows stored before keys
were turned on are in clear, so turning keys on for a store with content is: open it with the keys, run this pass,
then serve (until it ends, a run that reads a row in clear is refused, and nothing is lost). An import into a store
with keys seals what it imports the same way, in its own transaction (transfer.py).

Each row is sealed exactly as the library would have written it (db/sealing.py): a message re-encoded from its
row, with its blind index in ``text``; a state value under its key; a payload under its row. The pass walks each
table in key order, ``batch_size`` rows in clear per short transaction, and only ever picks rows still in clear:
interrupted, run it again; a second run seals nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sqlalchemy import ColumnElement, Table, Text, and_, cast, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db import codec, message_decode, message_rows, sealing
from agent_store.db.database import Database
from agent_store.db.hosted_tables import checkpoint_binding, checkpoint_user
from agent_store.db.journal_tables import stream_events_t
from agent_store.db.scopes import USER_PREFIX
from agent_store.db.tables import (
    checkpoints_t,
    hosted_items_t,
    hosted_responses_t,
    messages_t,
    sessions_t,
    state_history_t,
    state_t,
    ui_snapshots_t,
    user_state_t,
)
from agent_store.errors import ConfigurationError

__all__ = ["seal_clear"]

S = sessions_t.c
# Per table: (its payload column, the sealed marker's key, its key columns, its owner (a column, or the session's
# user), the row a seal binds to (db/sealing.py)).
_PAYLOADS: dict[str, tuple[Table, str, str, tuple[str, ...], str | None, Callable[[Any], str]]] = {
    "state": (state_t, "value", sealing.SEALED, ("session_id", "key"), None, lambda r: sealing.state_row(r.key)),
    "state_history": (state_history_t, "value", sealing.SEALED, ("session_id", "key", "until_version"), None,
                      lambda r: sealing.state_row(r.key)),
    "user_state": (user_state_t, "value", sealing.SEALED, ("user_id", "key"), "user_id",
                   lambda r: sealing.state_row(USER_PREFIX + r.key)),
    "checkpoints": (checkpoints_t, "payload", sealing.SEALED, ("user_id", "checkpoint_id"), "user_id",
                    lambda r: checkpoint_binding(r.owner, r.workflow_name, r.checkpoint_id)),
    "stream_events": (stream_events_t, "event", sealing.SEALED, ("user_id", "stream_id", "seq"), "user_id",
                      lambda r: f"e\0{r.stream_id}\0{r.seq}"),
    "hosted_items": (hosted_items_t, "body", sealing.SEALED, ("user_id", "item_id"), "user_id",
                     lambda r: "i\0" + r.item_id),
    "hosted_responses": (hosted_responses_t, "envelope", sealing.SEALED, ("user_id", "response_id"), "user_id",
                         lambda r: "r\0" + r.response_id),
    "ui_snapshots": (ui_snapshots_t, "snapshot", sealing.SEALED, ("scope", "thread_id"), "scope",
                     lambda r: "u\0" + r.thread_id),
}  # fmt: skip
_STATE = ("state", "state_history", "user_state")  # sealed as the commit seals them: canonical JSON


async def seal_clear(
    db: Database, *, batch_size: int = 500, conn: AsyncConnection | None = None, only: Scope | None = None
) -> dict[str, int]:
    """Seal every row in clear with its owner's keys; returns the rows sealed per table. ``conn``: in that
    transaction (an import's), else ``batch_size`` rows per transaction; ``only``: the rows of these sessions
    and owners (an import's), else every row."""
    if db.settings.keys is None:
        raise ConfigurationError("sealing needs the store's keys: open it with keys= (the CLI: $AGENT_STORE_KEYS)")
    codec.check_int(batch_size, "batch_size", low=1, high=100_001)
    scopes: list[Scope | None] = [None] if only is None else [  # at most 500 ids a statement
        *((set(chunk), set()) for chunk in _chunks(sorted(only[0]))),
        *((set(), set(chunk)) for chunk in _chunks(sorted(only[1])))]  # fmt: skip
    sealed = dict.fromkeys(["messages", *_PAYLOADS], 0)
    for scope in scopes:
        sealed["messages"] += await _walk(db, conn, batch_size, _messages, scope)
        for name in _PAYLOADS:
            sealed[name] += await _walk(db, conn, batch_size, _payloads(name), scope)
    return sealed


Scope = tuple[set[str], set[str]]  # (session ids, owners): the rows sealed


def _chunks(ids: list[str]) -> list[list[str]]:
    return [ids[i : i + 500] for i in range(0, len(ids), 500)]


async def _walk(db: Database, conn: AsyncConnection | None, batch_size: int, batch: Any, scope: Any) -> int:
    total, after = 0, None
    while True:
        done: int
        if conn is not None:
            done, after = await batch(db, conn, after, batch_size, scope)
        else:
            async with db.transaction(write=True, doing="sealing content in clear") as own:
                done, after = await batch(db, own, after, batch_size, scope)
        total += done
        if after is None:
            return total


async def _ciphers(db: Database, owners: set[str]) -> dict[str, Any]:
    return {owner: await sealing.ready(db, owner, None) for owner in sorted(owners)}


def _page(table: Table, keys: tuple[str, ...], after: tuple[Any, ...] | None, clear: ColumnElement[bool]) -> Any:
    columns = [table.c[k] for k in keys]
    where = [clear] if after is None else [clear, tuple_(*columns) > tuple_(*after)]
    return where, columns


async def _messages(db: Database, conn: AsyncConnection, after: Any, limit: int, scope: Any) -> tuple[int, Any]:
    M, pg = messages_t.c, db.dialect == "postgresql"
    where, order = _page(messages_t, ("session_id", "seq"), after, ~sealing.is_sealed(M.body, message_rows.ENCRYPTED,
                                                                                  pg))  # fmt: skip
    if scope is not None:
        where.append(M.session_id.in_(scope[0]))
    query = select(M.session_id, M.seq, M.message_id, M.role, M.author_name, M.text, cast(M.body, Text).label("raw"),
                   S.user_id).join(sessions_t, S.id == M.session_id).where(*where).order_by(*order).limit(limit)
    query = query.with_for_update(of=messages_t)  # (PostgreSQL: a row changed meanwhile is read again, or left)
    rows = (await conn.execute(query)).all()
    ciphers = await _ciphers(db, {r.user_id or "" for r in rows})
    for r in rows:
        message = message_decode.message_from_row(json.loads(r.raw), None, identity=r.message_id, role=r.role,
                                                  author_name=r.author_name, text=r.text)  # fmt: skip
        encoded = message_rows.message_record(message, max_bytes=2**62, tool_names={}, cipher=ciphers[r.user_id or ""])
        await conn.execute(update(messages_t).where(M.session_id == r.session_id, M.seq == r.seq).values(
            body=encoded.columns["body"], text=encoded.columns["text"]))  # fmt: skip
    return len(rows), (rows[-1].session_id, rows[-1].seq) if len(rows) == limit else None


def _payloads(name: str) -> Any:
    table, column, marker, keys, owner, row_of = _PAYLOADS[name]

    async def batch(db: Database, conn: AsyncConnection, after: Any, limit: int, scope: Any) -> tuple[int, Any]:
        c, pg = table.c, db.dialect == "postgresql"
        where, order = _page(table, keys, after, ~sealing.is_sealed(c[column], marker, pg))
        if scope is not None:
            where.append(c.session_id.in_(scope[0]) if owner is None else c[owner].in_(scope[1]))
        where.append(c[column].is_not(None))  # (a key a commit created has no value before it: SQL NULL)
        who = c[owner] if owner is not None else S.user_id
        query = select(*order, cast(c[column], Text).label("raw"), who.label("owner"),
                       *([c.workflow_name] if name == "checkpoints" else []))  # fmt: skip
        if owner is None:
            query = query.join(sessions_t, S.id == c.session_id)
        rows = (await conn.execute(query.where(*where).order_by(*order).limit(limit).with_for_update(of=table))).all()
        sealer = checkpoint_user if name == "checkpoints" else str  # (a hosted context's: its user's keys)
        ciphers = await _ciphers(db, {sealer(r.owner or "") for r in rows})
        for r in rows:
            text = r.raw if name not in _STATE else codec.dumps(json.loads(r.raw), where=name, max_bytes=2**62)
            stored = sealing.seal_json(ciphers[sealer(r.owner or "")], row_of(r), text)
            await conn.execute(update(table).where(and_(*(c[k] == getattr(r, k) for k in keys))).values(
                {column: stored}))  # fmt: skip
        return len(rows), tuple(getattr(rows[-1], k) for k in keys) if len(rows) == limit else None

    return batch
