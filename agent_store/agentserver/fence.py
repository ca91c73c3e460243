"""The erasure fence for hosted responses (issue 41): a response that continues what its request read of a user's
stored history is never written after that user was erased (it would bring the erased conversation back).

A request reads a history (``get_history_item_ids`` of its ``previous_response_id`` and ``conversation_id``,
a response's items), runs the agent, then ``create_response`` stores the result with that history. Between the
two, ``erase_user`` may run. As for the framework's other seams that read and write apart (run/read_times.py),
the write is dated from the earliest read of what it continues (its previous response, its conversation) on
record in this process, or from ``UNKNOWN`` (any erasure of the user still on record) when it continues
something no read of which is on record. A response that continues nothing (a new conversation, no history)
read nothing stored and is not fenced: a user may come back after an erasure and start again.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db import erasures
from agent_store.db.database import Database
from agent_store.db.erasures import erased_since
from agent_store.db.statements import lock_user
from agent_store.errors import SessionNotFoundError
from agent_store.run.commit import ERASURE_MARGIN
from agent_store.run.read_times import UNKNOWN, ReadTimes

__all__ = ["HostedReads"]


class HostedReads:
    """When this provider read each of a user's responses and conversations (the earliest reads on record)."""

    def __init__(self) -> None:
        self._reads = ReadTimes()

    def read(self, user: str, *, response: str | None = None, conversation: str | None = None) -> None:
        """Record a read, before it is made (a read dated early only fences more)."""
        now = datetime.now(UTC)
        for key in _keys(user, response, conversation):
            self._reads.read(key, now)

    def since(self, user: str, previous: str | None, conversation: str | None, history: list[str]) -> datetime | None:
        """What a new response is dated from, or None if it continues nothing stored."""
        keys = _keys(user, previous, conversation)
        if not keys and not history:
            return None
        dates = [at for key in keys if (at := self._reads.earliest(key)) is not None]
        return min(dates) - ERASURE_MARGIN if dates else UNKNOWN

    def before_sealing(self, db: Database, user: str, since: datetime | None) -> erasures.Fence | None:
        """The same refusal, made before a first key of the user's is made (db/sealing.py ``ready``): a refused
        write must not leave a key for an erased user. (``check`` stays the guarantee.)"""
        return None if since is None or not user else erasures.fence(db, user, since, lambda: _refused(user))

    @staticmethod
    async def check(conn: AsyncConnection, user: str, since: datetime | None) -> None:
        """Refuse the write (``SessionNotFoundError``, a ``LookupError``) if ``user`` was erased since ``since``;
        the user's lock orders it against ``erase_user`` (wholly before it, or after and refused)."""
        if since is None or not user:  # the unscoped partition "" is no user's: no erasure names it
            return
        await lock_user(conn, user, exclusive=False)
        if await erased_since(conn, user, since):
            raise _refused(user)


def _refused(user: str) -> SessionNotFoundError:
    return SessionNotFoundError(f"the request's user {user!r} was erased since it read the history this response "
                                "continues: the response was not stored")  # fmt: skip


def _keys(user: str, response: str | None, conversation: str | None) -> list[tuple[str, str, str]]:
    return [(user, kind, key) for kind, key in (("r", response), ("c", conversation))
            if isinstance(key, str) and key]
