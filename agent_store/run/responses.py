"""A response's part of a commit (migration 0017), in the checked transaction (checked_commit.py calls these).

Before the state writes: the key is locked and must be new (or this run's own, a retry, which the run log finds
first); the session keeps its state's history from now on; and if the session's own id named its head until now
(the first request of a served conversation is stored under its response id), that id is frozen where the head
was, so it keeps naming that point once this commit moves the head on. After the messages: the key's row.

A branch's compaction of its base's messages writes rows of its own (``agent_branch_marks``), from this commit's
horizon on: the base's rows are shared by every branch and never rewritten by one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db import message_rows
from agent_store.db import statements as sql
from agent_store.db.cut_points import RESPONSE_LOCK
from agent_store.db.database import SESSION_LOCK
from agent_store.db.history_tables import insert_row, key_hash, key_is
from agent_store.db.tables import branch_marks_t, responses_t, sessions_t
from agent_store.errors import ConflictError, InvalidValueError
from agent_store.run.one_call import OneCall

__all__ = ["before_writes", "branch_rewrites", "record"]
assert RESPONSE_LOCK != SESSION_LOCK


async def _key_row(db: AsyncConnection, key: str, user_id: str | None, parent: str | None = None) -> Any:
    """The row ``key`` names for ``user_id`` (keys are per user since 0018), under the key's lock; and the
    ``parent`` key's, shared, in the same statement: a delete of the parent (which takes it alone) waits for this
    commit and then sees its row, or this commit waits for the delete and then finds no parent row (its key is
    kept instead), never a row number of a row deleted meanwhile (0021)."""
    if db.dialect.name == "postgresql":  # one key, one point: concurrent writers of one key queue here
        locks = [func.pg_advisory_xact_lock(RESPONSE_LOCK, func.hashtext(key))]
        if parent is not None and parent != key:
            locks.append(func.pg_advisory_xact_lock_shared(RESPONSE_LOCK, func.hashtext(parent)))
        await db.execute(select(*locks))
    r = responses_t.c
    mine = r.user_id.is_(None) if user_id is None else r.user_id == user_id
    found = select(r.session_id, r.moves).where(key_is(r, key, key_hash(key)), mine)
    return (await db.execute(found)).first()


async def _key_taken(db: AsyncConnection, key: str, user_id: str | None) -> bool:
    return await _key_row(db, key, user_id) is not None


async def before_writes(db: AsyncConnection, call: OneCall, version: int, head_seq: int, now: datetime) -> None:
    """Lock and check the key, keep the session's history, freeze its own id at the head it had (see above).
    A moving key (0018) may already name this session's head: it moves with this commit."""
    key, sid = call.response.key, call.session_id
    found = await _key_row(db, key, call.user_id, call.response.parent)
    if found is not None and not (call.response.moves and found.moves and found.session_id == sid):
        if call.response.moves and found.moves:  # two requests started one conversation: this one came second
            raise ConflictError(sid, [], reason=f"another request started the conversation {key!r} first: load it "
                                                "again")  # fmt: skip
        raise InvalidValueError(f"response id {key!r} already names a point of a conversation; a point never "
                                "changes: store the next turn under a new id")  # fmt: skip
    if key != sid and (await db.execute(select(sessions_t.c.id).where(sessions_t.c.id == key))).first() is not None:
        raise InvalidValueError(f"response id {key!r} is a conversation's own id (it names its head): store the "
                                "turn under a new id")  # fmt: skip
    if (claims := call.response.claims) is not None:  # a conversation's first turn takes its id, or conflicts
        there = await _key_row(db, claims, call.user_id)
        other = (await db.execute(select(sessions_t.c.id).where(sessions_t.c.id == claims))).first()
        if (there is not None and not (there.moves and there.session_id == sid)) or (other and claims != sid):
            raise ConflictError(sid, [], reason=f"another request started the conversation {claims!r} first: "
                                                "load it again")  # fmt: skip
    await db.execute(update(sessions_t).where(sessions_t.c.id == sid, sessions_t.c.keeps_history.is_(False))
                     .values(keeps_history=True))  # fmt: skip
    if call.base_seq is None and call.snapshot.exists and key != sid and not await _key_taken(db, sid, call.user_id):
        await insert_row(db, {"session_id": sid, "response_id": sid, "user_id": call.user_id, "seq_end": head_seq,
                              "version": version - 1, "created_at": now}, None)  # fmt: skip


async def record(db: AsyncConnection, call: OneCall, version: int, seq_end: int, now: datetime) -> None:
    await _record(db, call, call.response.key, call.response.moves, call.response.parent, version, seq_end, now)
    if call.response.claims is not None:
        await _record(db, call, call.response.claims, True, call.response.key, version, seq_end, now)


async def _record(
    db: AsyncConnection, call: OneCall, key: str, moves: bool, parent: str | None, version: int, seq_end: int,
    now: datetime,
) -> None:  # fmt: skip
    r = responses_t.c
    if moves and (await db.execute(
        update(responses_t).where(r.session_id == call.session_id, r.response_id == key, r.moves.is_(True))
        .values(seq_end=seq_end, version=version)
    )).rowcount:  # fmt: skip
        return
    row = {"session_id": call.session_id, "response_id": key, "user_id": call.user_id, "seq_end": seq_end,
           "version": version, "created_at": now, "moves": moves}  # fmt: skip
    await insert_row(db, row, parent)


async def branch_rewrites(
    db: AsyncConnection, call: OneCall, marks: dict[str, dict[str, Any]], moved: dict[str, int], *, horizon: int,
    version: int,
) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:  # fmt: skip
    """Split a branch's compaction: its own messages' changes (returned, written as usual) and its base's (written
    here as the branch's rows, each message's columns whole: the new ones over those the run loaded)."""
    ids = sorted(set(marks) | set(moved))
    if not ids:
        return marks, moved
    own = await sql.already_stored(db, call.session_id, ids)
    base = [mid for mid in ids if mid not in own]
    if base:
        snap, rows = call.snapshot, []
        for mid in base:
            columns = marks.get(mid)
            if columns is None:  # moved only: its columns as loaded
                loaded = snap.marks.get(mid)
                columns = message_rows.mark_columns(loaded, where=f"message {mid!r}", max_bytes=2**62)
            rows.append({"session_id": call.session_id, "message_id": mid, "horizon": horizon, "version": version,
                         "marks": columns["marks"], "excluded": bool(columns["excluded"]),
                         "exclude_reason": columns["exclude_reason"], "summarized_by": columns["summarized_by"],
                         "pos": moved.get(mid, snap.places.get(mid))})  # fmt: skip
        await db.execute(branch_marks_t.insert(), rows)
    keep = set(own)
    return {k: v for k, v in marks.items() if k in keep}, {k: v for k, v in moved.items() if k in keep}
