"""The erasure fence: what ``erase_user`` leaves behind so that no run that read before it writes after it.

The last transaction of an erasure records the user (as a SHA-256: enough to recognise the id, not to read it)
and when. A write for that user dated before then is refused. Entries are kept ``ERASURE_LOG_KEPT`` (they are
also the log a restore re-applies); a fence only ever needs ``FENCE_KEPT``, longer than any run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db.tables import erasures_t

__all__ = ["ERASURE_LOG_KEPT", "FENCE_KEPT", "Fence", "erased_since", "fence", "user_key"]

FENCE_KEPT = timedelta(days=7)  # longer than any run: a read older than this is past every fence
# How long the purge keeps an erasure on record: longer than backups are kept, so that a restore can be followed by
# the erasures made since (operations/backup.py). A hashed id and a time: nothing of the user is readable.
ERASURE_LOG_KEPT = timedelta(days=400)
Fence = Callable[[], Awaitable[None]]  # raises if the write it guards is refused


def user_key(user_id: str) -> str:
    """What an erasure keeps of a user id: a SHA-256, enough to recognise the id, not to read it."""
    return hashlib.sha256(user_id.encode()).hexdigest()


async def erased_since(db: AsyncConnection, user_id: str, since: datetime) -> bool:
    """Whether the user was erased after ``since`` (a run's load): such a run may not write for the user."""
    e = erasures_t.c
    found = await db.execute(select(e.user_key).where(e.user_key == user_key(user_id), e.erased_at >= since))
    return found.first() is not None


def fence(db: Any, user_id: str | None, since: datetime, refused: Callable[[], Exception]) -> Fence:
    """The check of a write dated ``since``, to make before the user's first key (db/sealing.py ``ready``): raises
    ``refused()`` if the user was erased since (one short read; the write's own transaction checks again)."""

    async def check() -> None:
        if user_id:
            async with db.transaction(write=False, doing="checking the erasure fence") as conn:
                if await erased_since(conn, user_id, since):
                    raise refused()

    return check

