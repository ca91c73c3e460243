"""The framework's ``SessionStore`` on the store's tables (re-exported by ``agent_store.agent_framework``)."""

from __future__ import annotations

import warnings
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from agent_framework import AgentSession, SessionStore
from agent_framework._feature_stage import ExperimentalWarning

import agent_store.run.points as points
from agent_store.db import codec, ids, tenancy
from agent_store.db.cut_points import GONE, forget_head
from agent_store.db.load_statement import POSITION_STEP
from agent_store.errors import ConflictError, InvalidValueError, SessionExpiredError, SessionNotFoundError
from agent_store.run.checked_commit import HeadMoved, ResponseToRecord
from agent_store.run.commit import Run, run_of
from agent_store.run.read_times import ReadTimes
from agent_store.run.recording import active_calls, say_if_unrecorded, start_recording

if TYPE_CHECKING:
    from agent_store.store import Store

__all__ = ["StoreSessionStore"]
_SET_BEFORE = "_agent_store_run"  # on a session this store did not hand out: the run its first set() made


class _SetBefore:
    """That run, for this session object only: a copy of the session (the hosting packages deep-copy sessions)
    or a pickled one starts again from nothing, as a session this store never saw."""

    def __init__(self, run: Run | None) -> None:
        self.run = run

    def __deepcopy__(self, memo: dict[int, object]) -> _SetBefore:
        return _SetBefore(None)

    def __reduce__(self) -> tuple[type[_SetBefore], tuple[None]]:
        return _SetBefore, (None,)


# The framework marks SessionStore experimental and warns when it is subclassed, i.e. on importing this module:
# a library import must pass `python -W error`. StoreSessionStore's docstring says what it builds on.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", ExperimentalWarning)

    class _SessionStoreBase(SessionStore):
        pass


class StoreSessionStore(_SessionStoreBase):
    """The framework's ``SessionStore`` (get / set / delete by key; experimental in Agent Framework 1.23) on the
    store's tables, for the hosting packages' two ways of naming a conversation (agent-framework-hosting):

    - a session's own id names its **head**: ``set(id, session)`` commits what changed since ``get(id)``, with
      the usual rules (new messages appended, changed keys written, a key changed meanwhile by someone else is
      a ``ConflictError``); a session this store did not hand out writes its messages (skipping ids stored
      already) and its keys (a key that exists already is a conflict, not an overwrite). A conversation id.
    - any other key names a **point**, which never changes (a response id): ``set(response_id, session)``
      commits the turn and records the key at the point it makes, in one transaction. If the session moved on
      since the point the turn continued from (another request continued from it first), the turn goes to a
      branch that points at that history instead of copying it (run/points.py). ``get(response_id)`` reads the
      conversation as it was at that point. A key is set once; another user's key is not found.
    """

    def __init__(self, store: Store, *, user_id: str | None = None, history_limit: int | None = None) -> None:
        super().__init__()
        self.store, self.user_id, self.history_limit = store, user_id, history_limit
        self._absent = ReadTimes()  # gets that found nothing: the sessions the callers build date from them

    @tenancy.for_its("user_id")
    async def get(self, session_id: str) -> AgentSession | None:
        run = await self._found(session_id)
        # The request's model calls, made between this get() and its set() (the hosting routes: one task, get,
        # run, set), are recorded by the agent's UsageRecorder into its run: the ledger is not off outside
        # store.session(). A session that is new records into a list set() hands to the run it makes.
        start_recording(run.calls if run is not None else [])
        return None if run is None else run.session

    async def _found(self, session_id: str) -> Run | None:
        SessionStore.validate_session_id(session_id)
        codec.check_id(session_id, "session_id (a response or conversation id)", required=True)
        read_at = datetime.now(UTC)
        point = await points.resolve(self.store.db, session_id, self.user_id)
        if point is not None and point.seq_end == GONE:  # a frozen own id whose history was cut: no longer there
            self._absent.read(session_id, read_at)
            return None
        run = None
        if point is not None:  # a key's point, and only that: never a session that took the same id meanwhile
            run = await self._at(point)
        else:
            try:
                run = await self.store.load(session_id, user_id=self.user_id, history_limit=self.history_limit)
            except (SessionNotFoundError, SessionExpiredError):  # another user's id, or one past its time to live
                pass  # (the purge deletes it): the same answer as an unused one
        if run is not None and run.exists:
            return run
        self._absent.read(session_id, read_at)
        return None

    async def _at(self, point: points.Point) -> Run | None:
        """A run at ``point``: the session's ordinary load when it is still its head, else the point's view (the
        session's row and the point's history through its chain, in one statement)."""
        try:
            if point.is_head:
                run = await self.store.load(point.session_id, user_id=self.user_id, history_limit=self.history_limit)
                if run.snapshot.version == point.version:
                    run.point = point
                    return run
                await run.discard()  # another request moved it since it was resolved: the point's view
            # (A branch's head by its own id has no point: a set() under that id moves its head, as a session's.)
            return await points.load_point(self.store.db, point, user_id=self.user_id, agent_id=None,
                                           history_limit=self.history_limit)  # fmt: skip
        except (SessionNotFoundError, SessionExpiredError):
            return None

    @tenancy.for_its("user_id")
    async def set(self, session_id: str, session: AgentSession) -> None:
        SessionStore.validate_session_id(session_id)
        codec.check_id(session_id, "session_id (a response or conversation id)", required=True)
        earlier = getattr(session, _SET_BEFORE, None)
        run = run_of(session) or (earlier.run if isinstance(earlier, _SetBefore) else None)
        if run is None or run.db is not self.store.db:
            # Its contents date from the get() that found nothing; not known otherwise (then an erasure of the
            # user still on record refuses it: it may hold what was read before).
            # The earliest get of the id on record: never later than this caller's own (read_times.py).
            run = Run.unloaded(self.store.db, session, user_id=self.user_id,
                               read_at=self._absent.earliest(session.session_id))  # fmt: skip
            # Set again (under another key: ResponsesHostServer sets a request's session under its response id,
            # then its conversation id), it goes on from what this set() committed, not from nothing.
            setattr(session, _SET_BEFORE, _SetBefore(run))
        recorded = active_calls()
        if recorded is not None and recorded is not run.calls:  # a new session's calls (get), now its run's
            run.calls.extend(recorded)
            recorded.clear()
        say_if_unrecorded(run.calls, run.history, run.loaded_ids, budgeted=run.budgeted)  # never silently off
        if session_id == run.storage_id and run.point is None:  # its own id: the head moves
            pinned = self.is_response_id(session_id)  # a point from its first set on, not a conversation's head
            named = None if run.exists and not pinned else await points.resolve(self.store.db, session_id,
                                                                                 self.user_id)  # fmt: skip
            if named is not None and not run.history and self._absent.earliest(session_id) is not None:
                # get_or_create_session's empty session, under an id whose get() found nothing here (expired,
                # cut, deleted): nothing to store, and nothing revived
                return
            if named is not None and named.session_id != session_id:  # (its own id, frozen where it began: fine)
                raise InvalidValueError(f"{session_id!r} is a response id (it names a point, which never changes): "
                                        "start a conversation under a new id")  # fmt: skip
            if named is not None and named.seq_end == GONE and run.history and not pinned:  # deleted, its
                raise InvalidValueError(f"{session_id!r} was deleted while responses continued from it remain: "
                                        "a conversation cannot start again under it; use a new id")  # fmt: skip
            if pinned and named is not None and named.recorded and not named.is_head and run.history:
                # A request continued from this id while its own turn ran (a background response), or the id was
                # deleted meanwhile: the head is not what this turn's model saw, so the turn goes to a branch at its
                # point (at nothing, once deleted: it began from nothing), which the id names from now on.
                at = named if named.seq_end != GONE else replace(named, seq_end=0, version=0, recorded=False)
                async with self.store.db.transaction(write=True, doing="branching a conversation") as conn:
                    branched = await points.branch(conn, run, at)
                points.adopt(run, branched)
            committed = await run.commit()
            if pinned:
                await points.pin(self.store.db, session_id, run.storage_id, self.user_id, committed.version,
                                 written=bool(run.history))  # fmt: skip
            return
        parent = run.point.key if run.point is not None else run.storage_id
        following = run.point is not None and run.point.moves  # loaded by a moving key: a conversation's head
        moves = (following and parent == session_id) or self.names_head(session_id, session)
        run.response = ResponseToRecord(session_id, parent, moves=moves,
                                        claims=None if moves or following else self.claims(session_id, session))
        if run.idempotency_key is None:  # a retry of this set() (this run) finds its first attempt by this run id
            run.idempotency_key = ids.run_id()
        snap = run.snapshot
        try:
            await run.commit()
        except HeadMoved:
            if moves or following:  # a conversation's turns land in order, or not at all: never a branch
                run.response, run.idempotency_key = None, None
                raise ConflictError(run.storage_id, [], reason=f"another request advanced the conversation "
                                                               f"{parent if following else session_id!r} after this "
                                                               "one loaded it: load it again") from None  # fmt: skip
            at = run.point or points.Point(key=parent, session_id=run.storage_id, seq_end=snap.end // POSITION_STEP,
                                           version=snap.version, recorded=False, is_head=True)
            if await points.resolve(self.store.db, session_id, self.user_id) is not None:  # set meanwhile: no
                run.response, run.idempotency_key = None, None  # branch left behind for a turn its key refuses
                raise InvalidValueError(f"response id {session_id!r} already names a point of a conversation; a "
                                        "point never changes: store the next turn under a new id") from None
            async with self.store.db.transaction(write=True, doing="branching a conversation") as conn:
                branched = await points.branch(conn, run, at)
            points.adopt(run, branched)  # only once the branch is there: a failed attempt leaves the run as it was
            await run.commit()
        # The session goes on from the point just made (a later set() continues from it).
        end = snap.end // POSITION_STEP
        run.point = points.Point(key=session_id, session_id=run.storage_id, seq_end=end, version=snap.version,
                                 recorded=not moves, is_head=True, moves=moves)
        run.response, run.idempotency_key = None, None

    def is_response_id(self, key: str) -> bool:
        """Whether ``key``, set as a session's own id (the first request of a ``previous_response_id`` chain is
        stored under its response id), names the point that set made rather than the conversation's head: a
        response id never changes. Here: shaped as the framework's response ids (``resp_``, as
        agent-framework-hosting-responses' ``create_response_id`` makes them); a conversation id moves with its
        turns. Override for ids of another shape."""
        return key.startswith("resp_")

    def claims(self, key: str, session: AgentSession) -> str | None:
        """A key naming a conversation's head that ``set(key, session)`` takes in the same commit (its first
        turn): here never; agentserver/foundry.py's subclass says when."""
        return None

    def names_head(self, key: str, session: AgentSession) -> bool:
        """Whether ``set(key, session)`` names the session's head under a key of its own (a conversation id kept
        beside the session's id), which then moves with it, rather than a point that never changes. Here: never
        (a served conversation's id is its session's own id); agentserver/foundry.py's subclass says when."""
        return False

    @tenancy.for_its("user_id")
    async def delete(self, session_id: str) -> None:
        SessionStore.validate_session_id(session_id)
        codec.check_id(session_id, "session_id (a response or conversation id)", required=True)
        point = await points.resolve(self.store.db, session_id, self.user_id)
        if point is not None and point.recorded:  # a response (its session's own id too, once frozen as one):
            await points.forget(self.store.db, point)  # its point goes, the history stays
            if point.session_id == session_id or not self.is_response_id(session_id):
                return
            # A response id may name a point in a branch while a session under its id, which it began, holds the
            # rest (a background response continued from while it ran): that session must not answer for it now.
        # A session's own id: only that key goes, as in the framework's store (the points continued from it stay).
        async with self.store.db.transaction(write=True, doing="deleting a conversation's id") as conn:
            await forget_head(conn, session_id, self.user_id)
