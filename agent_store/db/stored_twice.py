"""A message id stored twice: refused inside the commit's transaction, named once it has rolled back.

The unique index on ``(session_id, message_id)`` (on PostgreSQL its MD5, migration 0011) is what refuses it, in
either commit path; which ids it was can only be read after the failed transaction, in a read of its own.
"""

from __future__ import annotations

from agent_store.db import statements as sql
from agent_store.db.database import Database
from agent_store.errors import AgentStoreError, InvalidValueError


class StoredTwice(InvalidValueError):
    """A message id of the run is stored already (or two of its ids share an MD5)."""

    def __init__(self, session_id: str, message_ids: list[str]) -> None:
        super().__init__(f"session {session_id!r}: a message of this run has an id that is already stored")
        self.message_ids = message_ids


async def named(db: Database, sid: str, refused: StoredTwice) -> InvalidValueError:
    """The refusal naming the ids the database holds already (nothing of the run was written)."""
    try:
        async with db.transaction(write=False, doing="naming a message id stored twice") as conn:
            stored = sorted(await sql.already_stored(conn, sid, refused.message_ids))
    except AgentStoreError:
        return refused  # unnamed, but as true
    ids = set(refused.message_ids)
    if not stored and db.dialect == "postgresql" and len({sql.id_hash(i) for i in ids}) < len(ids):
        # PostgreSQL's index keys the MD5 (0011): two ids of the run with one MD5 are one id to it
        return InvalidValueError(
            f"session {sid!r}: two message ids of this run share an MD5, so the second is taken as already stored"
        )
    if not stored:
        return refused
    more = f" (and {len(stored) - 1} more)" if len(stored) > 1 else ""
    return InvalidValueError(f"session {sid!r}: message id {stored[0]!r} of this run is already stored{more}")
