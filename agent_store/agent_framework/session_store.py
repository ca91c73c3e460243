"""The framework's ``SessionStore`` on the store's tables (re-exported by ``agent_store.agent_framework``)."""

from __future__ import annotations

import warnings
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from agent_framework import AgentSession, SessionStore
from agent_framework._feature_stage import ExperimentalWarning

from agent_store.errors import InvalidValueError, SessionNotFoundError
from agent_store.run.commit import Run, run_of
from agent_store.run.read_times import ReadTimes

if TYPE_CHECKING:
    from agent_store.store import Store

__all__ = ["StoreSessionStore"]


# The framework marks SessionStore experimental and warns when it is subclassed, i.e. on importing this module:
# a library import must pass `python -W error`. StoreSessionStore's docstring says what it builds on.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", ExperimentalWarning)

    class _SessionStoreBase(SessionStore):
        pass


class StoreSessionStore(_SessionStoreBase):
    """The framework's ``SessionStore`` (get / set / delete of whole sessions; experimental in Agent Framework
    1.23) on the store's tables.

    ``get`` loads a session (its state rows and messages); ``set`` commits what changed since that ``get``,
    with the usual rules: new messages appended, changed keys written, a key changed meanwhile by someone
    else raises ``ConflictError``. ``set`` of a session this store did not hand out writes its messages
    (skipping ids already stored) and its keys (a key that already exists is a conflict, not an overwrite).
    """

    def __init__(self, store: Store, *, user_id: str | None = None, history_limit: int | None = None) -> None:
        super().__init__()
        self.store, self.user_id, self.history_limit = store, user_id, history_limit
        self._absent = ReadTimes()  # gets that found nothing: the sessions the callers build date from them

    async def get(self, session_id: str) -> AgentSession | None:
        SessionStore.validate_session_id(session_id)
        read_at = datetime.now(UTC)
        try:
            run = await self.store.load(session_id, user_id=self.user_id, history_limit=self.history_limit)
        except SessionNotFoundError:  # another user's id: the same answer as an unused one
            run = None
        if run is not None and run.exists:
            return run.session
        self._absent.read(session_id, read_at)
        return None

    async def set(self, session_id: str, session: AgentSession) -> None:
        SessionStore.validate_session_id(session_id)
        if session.session_id != session_id:
            raise InvalidValueError(
                f"StoreSessionStore keeps a session under its own id: {session.session_id!r} != {session_id!r}"
            )
        run = run_of(session)
        if run is None or run.db is not self.store.db:
            # Its contents date from the get() that found nothing; not known otherwise (then an erasure of the
            # user still on record refuses it: it may hold what was read before).
            # The earliest get of the id on record: never later than this caller's own (read_times.py).
            run = Run.unloaded(self.store.db, session, user_id=self.user_id, read_at=self._absent.earliest(session_id))
        await run.commit()

    async def delete(self, session_id: str) -> None:
        SessionStore.validate_session_id(session_id)
        await self.store.delete(session_id, user_id=self.user_id)
