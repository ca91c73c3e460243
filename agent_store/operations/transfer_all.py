"""A whole-store export (``agent-store export --all-users``): every user's export, one after the other, in one file.

The file is the usual format (transfer.py): one header, then each owner's lines as ``export(user_id=...)`` writes
them (sessions, ``user:`` keys, checkpoints, hosted responses), then the store's own rows (``app:`` keys, budgets,
prices: transfer_config.py), then one trailer, so ``import`` reads it back as it reads one user's. Owners are
found in every table that has them (a user may have checkpoints or hosted responses and no session), a page at a
time, and each owner's session ids are listed when its turn comes: memory
stays flat however many users the store has. No owner (``None``: sessions without a user, and the ``""``
partition of checkpoints and hosted rows) comes first.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from sqlalchemy import func, select, union

from agent_store.db.database import Database
from agent_store.db.hosted_tables import hosted_responses_t
from agent_store.db.tables import SCHEMA_REVISION, checkpoints_t, sessions_t, user_state_t
from agent_store.errors import InvalidValueError
from agent_store.operations import transfer, transfer_config

__all__ = ["export", "export_all"]
OWNERS_PAGE = 500


def export(db: Database, *, user_id: str | None, session_id: str | None, all_users: bool) -> AsyncIterator[str]:
    """``Store.export``: every user's lines (``all_users``), or one user's or one session's (transfer.py)."""
    if not isinstance(all_users, bool):
        raise InvalidValueError(f"all_users must be True or False, not {all_users!r}"[:200])
    if all_users and (user_id is not None or session_id is not None):
        raise InvalidValueError("all_users exports every user's sessions: give no user_id or session_id with it")
    return export_all(db) if all_users else transfer.export(db, user_id=user_id, session_id=session_id)


async def export_all(db: Database) -> AsyncIterator[str]:
    """Yield the JSON Lines of every owner's sessions and rows; the header counts the sessions at its start."""
    async with db.transaction(write=False, replica=True, doing="counting sessions to export") as conn:
        total = int((await conn.execute(select(func.count()).select_from(sessions_t))).scalar_one())
    yield json.dumps({"kind": "header", "format": transfer.FORMAT, "schema": SCHEMA_REVISION, "sessions": total,
                      "all_users": True})  # fmt: skip
    written, sessions = 1, 0
    async for owner in _owners(db):
        async for line in transfer.export(db, user_id=owner):
            if line.startswith(('{"kind": "header"', '{"kind": "trailer"')):
                continue
            written += 1
            sessions += line.startswith('{"kind": "session"')
            yield line
    async for line in transfer_config.export(db, lambda kind, t, row: transfer._line(kind, transfer._to_json(t, row))):
        written += 1  # the store's own rows: app: keys, budgets, prices (transfer_config.py)
        yield line
    yield json.dumps({"kind": "trailer", "sessions": sessions, "lines": written + 1})


async def _owners(db: Database) -> AsyncIterator[str | None]:
    """None, then every user id found in any owning table, in order, a page per short read."""
    yield None
    owned = union(
        select(sessions_t.c.user_id.label("owner")).where(sessions_t.c.user_id.is_not(None)),
        select(user_state_t.c.user_id), select(checkpoints_t.c.user_id), select(hosted_responses_t.c.user_id),
    ).subquery()  # fmt: skip
    after = ""  # "" is no owner's id here: checkpoints and hosted rows without a user went with None
    while True:
        async with db.transaction(write=False, replica=True, doing="listing users to export") as conn:
            page = list((await conn.execute(
                select(owned.c.owner).where(owned.c.owner > after).order_by(owned.c.owner).limit(OWNERS_PAGE)
            )).scalars())  # fmt: skip
        for owner in page:
            yield owner
        if len(page) < OWNERS_PAGE:
            return
        after = page[-1]
