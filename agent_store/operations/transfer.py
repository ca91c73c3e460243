"""Export sessions to JSON Lines and import them back, row for row.

The file is one JSON object per line: a header, then for each session its ``session`` row followed by its
``state``, ``run``, ``message`` and ``tool_call`` rows, then (for a whole-user export) the user's
``user_state`` rows and workflow ``checkpoint`` rows, and last a ``trailer`` with the counts. Every column is
kept: ids, seq, timestamps (ISO 8601, UTC), JSON values as JSON.

- Export reads in short transactions and yields only between them: a consumer that pauses holds no
  connection. Each session is read as of one moment (its row, state and run log together; its messages
  paged below the ``next_seq`` of that moment); a session truncated or cleared mid-export raises.
- Import is all-or-nothing per file: one transaction, committed only after the trailer matched. A
  truncated file writes nothing. Each row is checked as it is read, by the rules the API writes by
  (import_rows.py): a row no run could have stored is refused, naming its line, and nothing is written.
  Existing sessions are skipped, never duplicated; imported sessions and state rows get fresh incarnations
  and stamps (a runner of the old database cannot commit into them).
  A workflow's checkpoints are restored (in the file's order) only where that user's workflow has none: one
  that went on here is skipped whole, so an older backup never becomes its latest.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import Table, insert, or_, select, tuple_
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

import agent_store.operations.import_rows as import_rows
from agent_store.db import codec
from agent_store.db.database import Database
from agent_store.db.hosted_tables import checkpoints_of
from agent_store.db.scopes import owner_is
from agent_store.db.statements import lock_user, new_stamp, not_found
from agent_store.db.tables import (
    SCHEMA_REVISION,
    checkpoint_workflows_t,
    checkpoints_t,
    messages_t,
    runs_t,
    sessions_t,
    state_t,
    tool_calls_t,
    usage_t,
    user_state_t,
)
from agent_store.errors import ConflictError, InvalidValueError
from agent_store.models import TransferReport
from agent_store.operations import import_trees, seal_clear, transfer_config, transfer_hosted
from agent_store.operations.import_rows import TABLES, row_values

FORMAT = "agent_store.jsonl"
# Insertion order: messages before the tool calls that reference them.
_SESSION_TABLES: dict[str, Table] = {  # in insert order: a usage row needs its run
    "state": state_t, "run": runs_t, "usage": usage_t, "message": messages_t, "tool_call": tool_calls_t,
    **{kind: TABLES[kind] for kind in import_trees.KINDS},  # a session's points (0016, 0017)
}  # fmt: skip
PAGE = 1000  # messages per short read transaction


def _to_json(table: Table, row: Any) -> dict[str, Any]:
    out = {}
    for column in table.c:
        value = row._mapping[column.name]  # by name: a response line is a select of its own (import_trees.py)
        out[column.name] = value.isoformat() if isinstance(value, datetime) else value
    return out


def _line(kind: str, row: dict[str, Any]) -> str:
    return json.dumps({"kind": kind, "row": row}, ensure_ascii=False, allow_nan=False, sort_keys=True)


async def export(db: Database, *, user_id: str | None, session_id: str | None = None) -> AsyncIterator[str]:
    """Yield the JSON Lines of one session, or of every session of ``user_id`` and that user's shared state."""
    codec.check_id(user_id, "user_id")
    codec.check_id(session_id, "session_id")
    S = sessions_t.c
    async with db.transaction(write=False, replica=True, doing="listing sessions to export") as conn:
        query = select(S.id).where(owner_is(S.user_id, user_id)).order_by(S.created_at, S.id)
        if session_id is not None:
            query = query.where(S.id == session_id)
        ids = list((await conn.execute(query)).scalars())
    if session_id is not None and not ids:
        raise not_found(session_id, user_id)
    yield json.dumps({"kind": "header", "format": FORMAT, "schema": SCHEMA_REVISION, "sessions": len(ids)})
    written, sessions = 1, 0
    for sid in ids:
        async for line in _export_session(db, sid):
            written += 1
            sessions += line.startswith('{"kind": "session"')
            yield line
    if session_id is None and user_id is not None:
        async with db.transaction(write=False, replica=True, doing="exporting user state") as conn:
            U = user_state_t.c
            rows = (await conn.execute(select(user_state_t).where(U.user_id == user_id).order_by(U.key))).all()
        for row in rows:
            written += 1
            yield _line("user_state", _to_json(user_state_t, row))
    if session_id is None:
        async for line in _export_checkpoints(db, user_id or ""):
            written += 1
            yield line
        async for line in transfer_hosted.export(db, user_id, lambda kind, t, row: _line(kind, _to_json(t, row))):
            written += 1
            yield line
    yield json.dumps({"kind": "trailer", "sessions": sessions, "lines": written + 1})


async def _export_checkpoints(db: Database, owner: str) -> AsyncIterator[str]:
    """The owner's workflow checkpoints, their hosted workflow contexts' too (db/hosted_tables.py), by owner,
    workflow and sequence, a page per short read transaction."""
    C, after = checkpoints_t.c, ("", "", 0)
    while True:
        async with db.transaction(write=False, replica=True, doing="exporting workflow checkpoints") as conn:
            page = (
                await conn.execute(
                    select(checkpoints_t).where(checkpoints_of(C.user_id, owner),
                                                tuple_(C.user_id, C.workflow_name, C.seq) > after)
                    .order_by(C.user_id, C.workflow_name, C.seq).limit(PAGE)
                )
            ).all()  # fmt: skip
        for row in page:
            yield _line("checkpoint", _to_json(checkpoints_t, row))
        if len(page) < PAGE:
            return
        after = (page[-1].user_id, page[-1].workflow_name, page[-1].seq)


async def _export_session(db: Database, sid: str) -> AsyncIterator[str]:
    S, M, T = sessions_t.c, messages_t.c, tool_calls_t.c
    async with db.transaction(write=False, replica=True, doing="exporting a session") as conn:
        row = (await conn.execute(select(sessions_t).where(S.id == sid))).first()
        if row is None:  # deleted since the listing: not part of this export
            return
        session = _to_json(sessions_t, row)
        if row.base_id is not None:  # what it reads of its bases, for the import to compare (import_trees.py)
            session["base_history"] = await import_trees.inherited(conn, sid)
        lines = [_line("session", session)]
        for kind in ("state", "run", "usage", *import_trees.KINDS):
            table = _SESSION_TABLES[kind]
            for r in await conn.execute(import_trees.rows_of(kind, table, sid)):
                lines.append(_line(kind, _to_json(table, r)))
    for line in lines:
        yield line
    end, after = row.next_seq, (row.base_seq or 0) - 1  # a branch's messages start at its base_seq (0017)
    while after < end - 1:
        upto = min(after + 1 + PAGE, end)  # this page: seq in (after, upto)
        async with db.transaction(write=False, replica=True, doing="exporting messages") as conn:
            window = (M.session_id == sid, M.seq > after, M.seq < upto)
            page = (await conn.execute(select(messages_t).where(*window).order_by(M.seq))).all()
            tools = (T.session_id == sid, T.seq > after, T.seq < upto)
            tool_rows = (await conn.execute(select(tool_calls_t).where(*tools).order_by(T.seq, T.call_id))).all()
            rewritten = await _rewritten(conn, row, select(M.run_id).where(*window))
        expected = upto - after - 1
        # Messages below next_seq never change, unless the session is cleared or truncated and written again
        # (then a page is short, or holds a message of a commit later than the session row that was read), or a
        # compaction rewrote stored messages (its run logs messages_rewritten).
        if len(page) != expected or rewritten:
            raise ConflictError(sid, [], reason="the session was truncated, cleared or compacted while it was being "
                                                "exported")  # fmt: skip
        after = page[-1].seq
        for r in page:
            yield _line("message", _to_json(messages_t, r))
        for r in tool_rows:
            yield _line("tool_call", _to_json(tool_calls_t, r))


async def _rewritten(conn: AsyncConnection, session: Any, run_ids: Any) -> bool:
    """Whether the session was re-created since ``session`` (its row) was read, or a message of ``run_ids`` was
    committed after it: by incarnation and version (commit order), never by comparing app servers' clocks."""
    S, R = sessions_t.c, runs_t.c
    now = (await conn.execute(select(S.incarnation).where(S.id == session.id))).scalar_one_or_none()
    # A message of the page committed later, or any later commit that rewrote stored messages (a compaction's
    # marks and places: pages already exported would no longer match).
    later = select(R.run_id).where(R.session_id == session.id, R.version > session.version)
    later = later.where(or_(R.run_id.in_(run_ids), R.messages_rewritten > 0))
    return bool(now != session.incarnation or (await conn.execute(later.limit(1))).first() is not None)


async def import_lines(
    db: Database, lines: Iterable[str], progress: Callable[[int], None] | None = None
) -> TransferReport:
    """Insert the sessions in ``lines`` (as written by :func:`export`), all or nothing; existing ones are skipped."""
    imported = skipped = checkpoints = 0
    pending: list[tuple[str, dict[str, Any]]] = []
    restoring: set[tuple[Any, Any]] = set()  # (user, workflow) whose checkpoints this import writes
    hosted = transfer_hosted.Imported()
    imported_rows: tuple[set[str], set[str]] = (set(), set())  # (session ids, owners): what a keyed store seals
    async with db.transaction(write=True, doing="importing sessions") as conn:

        async def flush() -> None:
            nonlocal imported, skipped
            if pending:
                if await _insert_session(conn, pending):
                    imported += 1
                else:
                    skipped += 1
                if progress is not None:
                    progress(1)
                pending.clear()

        header = trailer = None
        number = 0
        if isinstance(lines, (str, bytes)) or not hasattr(lines, "__iter__"):
            raise InvalidValueError("import_lines takes an iterable of JSON Lines (str)")
        for number, line in enumerate(lines, start=1):
            if not isinstance(line, str):
                raise InvalidValueError(f"import: line {number} is a {type(line).__name__}, not a str")
            if not line.strip():
                continue
            if trailer is not None:
                raise InvalidValueError(f"import: line {number}: data after the trailer; nothing was imported")
            try:
                record = json.loads(line)
                kind, row = record["kind"], record.get("row")
            except (ValueError, KeyError, TypeError, RecursionError) as exc:
                raise InvalidValueError(f"import: line {number} is not an agent_store export record") from exc
            if header is None:
                if kind != "header" or record.get("format") != FORMAT:
                    raise InvalidValueError(f"import: line {number}: not an {FORMAT} file (no header)")
                header = record
                continue
            if kind == "trailer":
                await flush()
                await hosted.check(conn)
                if db.settings.keys is not None:  # a store with keys holds nothing in clear (seal_clear.py)
                    await seal_clear.seal_clear(db, conn=conn, only=imported_rows)
                trailer = record
                if record.get("lines") != number or record.get("sessions") != imported + skipped:
                    raise InvalidValueError("import: the trailer's counts do not match the file; nothing was imported")
                continue
            if kind in transfer_config.KINDS and isinstance(row, dict):  # a whole store's own rows (--all-users)
                await flush()
                try:
                    await transfer_config.add(conn, kind, row, db.settings)
                except InvalidValueError as exc:
                    raise InvalidValueError(f"import: line {number}: {exc}; nothing was imported") from exc
                continue
            if not isinstance(kind, str) or kind not in TABLES or not isinstance(row, dict):
                raise InvalidValueError(f"import: line {number}: unknown record kind {kind!r}"[:300])
            try:
                values = row_values(kind, row, db.settings)
            except InvalidValueError as exc:
                raise InvalidValueError(f"import: line {number}: {exc}; nothing was imported") from exc
            if kind in ("session", "user_state", "checkpoint", *transfer_hosted.KINDS):
                await flush()
                imported_rows[kind != "session"].add(values["id"] if kind == "session" else values.get("user_id") or "")
            if kind in transfer_hosted.KINDS:
                await hosted.add(conn, kind, values)
                continue
            if kind == "checkpoint":
                checkpoints += await _insert_checkpoint(conn, values, restoring)
                continue
            if kind == "user_state":
                await conn.execute(_insert_ignoring_existing(conn, user_state_t), {**values, "version": new_stamp()})
                continue
            if kind != "session" and not pending:
                raise InvalidValueError(f"import: line {number}: a {kind} row before any session row")
            pending.append((kind, values))
        if trailer is None:
            raise InvalidValueError(
                f"import: the file ends at line {number} without its trailer (truncated?); nothing was imported"
            )
    return TransferReport(imported=imported, skipped=skipped, checkpoints=checkpoints,
                          hosted_responses=len(hosted.responses))  # fmt: skip


async def _insert_checkpoint(conn: AsyncConnection, row: dict[str, Any], restoring: set[tuple[Any, Any]]) -> bool:
    """Restore a checkpoint of a workflow that has none here (or that this import is restoring); a workflow that
    went on here is skipped whole: an older backup never becomes its latest."""
    C, W = checkpoints_t.c, checkpoint_workflows_t.c
    workflow = (row.get("user_id"), row.get("workflow_name"))
    if workflow not in restoring:
        if row.get("user_id"):
            await lock_user(conn, row["user_id"], exclusive=False)  # as a save does: never beside an erasure
        present = select(C.seq).where(C.user_id == workflow[0], C.workflow_name == workflow[1]).limit(1)
        if (await conn.execute(present)).first() is not None:
            return False
        restoring.add(workflow)
    key = (C.user_id == row.get("user_id"), C.checkpoint_id == row.get("checkpoint_id"))
    if (await conn.execute(select(C.seq).where(*key))).first() is not None:
        return False
    upsert = (postgresql if conn.dialect.name == "postgresql" else sqlite).insert(checkpoint_workflows_t)
    counter = upsert.values(user_id=row.get("user_id"), workflow_name=row.get("workflow_name"), next_seq=1)
    bumped = counter.on_conflict_do_update(
        index_elements=[W.user_id, W.workflow_name], set_={"next_seq": W.next_seq + 1}
    )
    row["seq"] = (await conn.execute(bumped.returning(W.next_seq))).scalar_one()
    await conn.execute(insert(checkpoints_t), row)
    return True


def _insert_ignoring_existing(conn: AsyncConnection, table: Table) -> Any:
    return (postgresql if conn.dialect.name == "postgresql" else sqlite).insert(table).on_conflict_do_nothing()


async def _insert_session(conn: AsyncConnection, records: list[tuple[str, dict[str, Any]]]) -> bool:
    """Insert one session and its rows (each already checked by import_rows.row_values)."""
    (_, session_row), rest = records[0], records[1:]
    base_history = session_row.pop(import_trees.BASE_HISTORY, None)  # not a column: compared, never stored
    session = {**session_row, "incarnation": new_stamp(), "keeps_history": False}  # until its rows are in
    if session.get("user_id") is not None:
        await lock_user(conn, session["user_id"], exclusive=False)  # creates one of the user's sessions
    if not (await conn.execute(_insert_ignoring_existing(conn, sessions_t), session)).rowcount:
        return False
    seqs = [row.get("seq") for k, row in rest if k == "message"]
    if seqs != list(range(session.get("base_seq") or 0, session.get("next_seq", -1))):
        raise InvalidValueError(f"import: session {session['id']!r}: its messages are not seq 0..next_seq-1 (a "
                                "branch's: base_seq..next_seq-1)")  # fmt: skip
    await import_trees.check_tree(conn, session, rest, base_history)
    import_rows.check_compaction(session, [row for k, row in rest if k == "message"])
    if not {row.get("seq") for k, row in rest if k == "tool_call"} <= set(seqs):
        raise InvalidValueError(f"import: session {session['id']!r}: a tool_call row names a message it lacks")
    import_rows.check_usage(session, [row for k, row in rest if k == "run"], [row for k, row in rest if k == "usage"])
    if any((row.get("version") or 0) > (session.get("version") or 0) for k, row in rest if k == "run"):
        # Its export would be refused for ever (a message of a commit later than its session: rewritten).
        raise InvalidValueError(f"import: session {session['id']!r}: a run is of a version its session never had")
    stamp = new_stamp()
    for kind, table in _SESSION_TABLES.items():
        rows = [{**row, "session_id": session["id"]} for k, row in rest if k == kind]
        if kind == "state":
            rows = [{**r, "version": stamp} for r in rows]
        if rows:
            await import_trees.insert_rows(conn, kind, table, rows)
    await import_trees.finish(conn, session_row)
    return True
