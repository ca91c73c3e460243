"""One run of an agent on a stored session: the whole data flow of agent_store is in this file.

    run = await store.load("chat-42", user_id="u1")   # 1. one read: session row, state rows, messages
    await agent.run("...", session=run.session)       # 2. the model thinks; no connection is held
    await run.commit()                                # 3. one write transaction with only the delta

``store.session(...)`` is these three steps as an ``async with`` block. Step 1 is load.py, step 3 is here: its
common case in one call per backend (commit_postgresql.py: one round trip; commit_sqlite.py: one hop), fed a
OneCall (one_call.py); the SQL is in db/statements.py, the pure diff in delta.py, connections in db/database.py.

Concurrency is settled by the database, not by locks in this process:
- the commit's ordering statement updates the session row (``version + 1``, ``next_seq + n``) only if it is
  still the incarnation this run loaded, this user's and agent's, and open; that row lock orders concurrent
  commits, so ``seq`` is gap-free and in commit order;
- each state row carries the random stamp of the commit that wrote it; a key this run changed whose stored
  stamp is no longer the one it loaded was changed by someone else: :class:`ConflictError`, nothing written;
- a commit's delta is frozen at its first attempt, and the run id (or the caller's idempotency key) is looked
  up under the row lock, so a retry after a lost reply writes exactly the first attempt's delta, or nothing.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from agent_framework import AgentSession, InMemoryHistoryProvider, Message
from sqlalchemy.ext.asyncio import AsyncConnection

import agent_store.run.after_commit as after_commit
import agent_store.run.checked_commit as checked_commit
import agent_store.run.commit_postgresql as commit_postgresql
import agent_store.run.commit_sqlite as commit_sqlite
import agent_store.telemetry as telemetry
from agent_store.db import codec, ids, runlog, sealing, statements, tenancy
from agent_store.db.database import Database
from agent_store.db.ledger import ModelCall
from agent_store.db.load_statement import POSITION_STEP
from agent_store.db.scopes import scopes
from agent_store.db.stored_twice import StoredTwice, named
from agent_store.errors import (
    AgentStoreError,
    ConflictError,
    DatabaseError,
    InvalidValueError,
    SessionClosedError,
    SessionNotFoundError,
    StorageUnavailableError,
)
from agent_store.models import CommitResult
from agent_store.run.delta import Delta, IdentifiedHistory, assign_id, diff
from agent_store.run.one_call import OneCall
from agent_store.run.read_times import UNKNOWN
from agent_store.run.snapshot import Snapshot
from agent_store.run.stored_session import StoredSession

__all__ = ["ERASURE_MARGIN", "HISTORY_KEY", "KEY_MAX", "Run", "StoredSession", "run_of"]

# Where a plain Agent's auto-added InMemoryHistoryProvider keeps its messages: state["in_memory"]["messages"].
HISTORY_KEY = InMemoryHistoryProvider.DEFAULT_SOURCE_ID
# Clock skew allowed between the app servers that load runs and the one that erases a user.
ERASURE_MARGIN = timedelta(seconds=1)
KEY_MAX = 240  # a caller's idempotency key; later commits of the same run append "#2", "#3", ...
logger = logging.getLogger("agent_store")


class Run:
    """A loaded session, and what is needed to commit what the agent changed in it.

    The session is its one slot; every other attribute is in ``__dict__``, which the session keeps too
    (StoredSession.link): the run the session's seams find (run_of) shares them, with no cycle between the two.
    """

    __slots__ = ("__dict__", "__weakref__", "session")

    def __init__(
        self, db: Database, session: AgentSession, snapshot: Snapshot, *, user_id: str | None,
        agent_id: str | None, run_id: str | None = None,
    ) -> None:  # fmt: skip
        self.db, self.session, self.user_id, self.agent_id = db, session, user_id, agent_id
        self.snapshot = snapshot  # what it loaded (snapshot.py): its commit diffs and checks against this
        # run/points.py (0017): the row the commit writes (the session's, or a branch's), a branch's base (then the
        # checked path), the point it was loaded at (a response id's), the response to record with its commit.
        self.storage_id: str = session.session_id
        self.base_id: str | None = None
        self.point: Any = None
        self.response: Any = None
        self.key_scopes = scopes(session.session_id, user_id, db.settings.app_id)
        self.idempotency_key, self.commits = run_id, 0  # a commit under a key already committed writes nothing
        self.pending: Delta | None = None  # sent, outcome unknown: the next commit() retries exactly this
        self._maybe_landed, self._started_at = False, datetime.now(UTC)  # (the pending delta's COMMIT was sent)
        # When what it holds was read from the store: erasures from then on refuse its commit (None: not known, a
        # session the store did not hand out: any erasure of the user still on record refuses it).
        self.read_at: datetime | None = self._started_at
        self.calls: list[ModelCall] = []  # model calls not committed yet (the usage ledger: recorders append)
        self.budgeted = snapshot.budgeted  # a token budget applied when it loaded (unrecorded calls then matter)
        self.held: AsyncConnection | None = None  # serialized mode: the transaction that holds the lock
        self.cipher: Any = None  # the user's keys, fetched by the load (or the commit) (db/sealing.py)
        self.skip_replays = False  # a history provider's save: what replays the stored tail is not stored again
        if isinstance(session, StoredSession):
            session.link(self)  # no cycle: see StoredSession

    @classmethod
    def unloaded(
        cls, db: Database, session: AgentSession, *, user_id: str | None, read_at: datetime | None,
        agent_id: str | None = None,
    ) -> Run:  # fmt: skip
        """A run for a session the store did not load: every message and key it holds is news to commit.

        Messages already stored (by id) are skipped, and keys that exist already are conflicts. ``read_at``:
        when its contents were read from the store (a provider's load before the model call); None if not known,
        and then an erasure of the user still on record (``erasures.FENCE_KEPT``) refuses it.
        """
        codec.check_id(session.session_id, "session_id", required=True)
        run = cls(db, session, Snapshot(verify_new_ids=True), user_id=user_id, agent_id=agent_id)
        run.read_at = read_at
        return run

    def fence_since(self) -> datetime:
        """Erasures of the user at or after this moment refuse the commit: they came after this run read."""
        return UNKNOWN if self.read_at is None else self.read_at - ERASURE_MARGIN

    @property
    def exists(self) -> bool:
        """Whether the session was in the database when loaded (or has been committed since)."""
        return self.snapshot.exists

    @property
    def loaded_ids(self) -> set[str]:
        """The store ids of the messages it loaded (the rest of its history is new)."""
        return self.snapshot.message_ids

    @property
    def history(self) -> list[Message]:
        """The run's message list (what a plain Agent's in-memory provider reads and appends to)."""
        slot = self.session.state.setdefault(HISTORY_KEY, IdentifiedHistory())
        messages: list[Message] = slot.setdefault("messages", [])
        return messages

    def add_messages(self, messages: Iterable[Message]) -> None:
        """Append messages to the run's history (for history providers); the same object is never added twice."""
        history = self.history
        present = {id(m) for m in history}
        for message in messages:
            if id(message) not in present:
                assign_id(message)
                history.append(message)
                present.add(id(message))

    async def discard(self) -> None:
        """Give up the run without writing (releases a serialized run's lock). Never raises: nothing to undo."""
        held, self.held = self.held, None
        if held is not None:
            await self.db.release(held, commit=False)

    def add_usage(self, usage: Mapping[str, Any] | None) -> None:
        """Record a response's total usage, for a client whose calls no recorder saw (purpose "response")."""
        if usage is not None and not isinstance(usage, Mapping):
            raise InvalidValueError(f"usage must be a mapping (a UsageDetails), not {type(usage).__name__}")
        if usage and any(isinstance(v, int) and not isinstance(v, bool) for v in usage.values()):
            self.calls.append(ModelCall(called_at=datetime.now(UTC), usage=dict(usage), purpose="response"))

    def _next_run_id(self) -> str:
        if self.idempotency_key is None:
            return ids.run_id()
        return self.idempotency_key if self.commits == 0 else f"{self.idempotency_key}#{self.commits + 1}"

    @tenancy.for_its("user_id")
    async def commit(self) -> CommitResult:
        """Write the run's new messages and changed state keys in one transaction.

        Safe to call again after a :class:`StorageUnavailableError`: the retry writes exactly what the first
        attempt tried to (changes made since go into the next commit), or nothing if that attempt did commit.
        After a successful commit the run can go on and commit again; each commit writes only what is new.

        Raises:
            InvalidValueError: a state value or message cannot be stored (checked before any SQL).
            ConflictError: another run changed one of the same state keys, or the session was deleted and
                created again, since this run loaded.
            SessionNotFoundError / SessionClosedError: the session was deleted / closed meanwhile.
            StorageUnavailableError: the database failed; the session in memory is intact, retry.
        """
        retry = self.pending is not None
        self._maybe_landed = retry and self._maybe_landed
        try:
            if not retry:  # the user's keys; a first key is made only past the erasure fence
                fence = statements.session_fence(self.db, self.storage_id, self.user_id, self.fence_since())
                self.cipher = await sealing.ready(self.db, self.user_id, self.cipher, fence=fence)
            delta = self.pending or self.next_delta()
        except BaseException as exc:
            await self.discard()
            if isinstance(exc, InvalidValueError):
                await self.log_unwritten("failed")  # refused before any SQL: its model calls were spent
            raise
        snap = self.snapshot
        if delta.empty and snap.exists and not retry and self.response is None:
            await self.discard()
            return CommitResult(session_id=self.storage_id, run_id=delta.run_id, version=snap.version)
        if delta.service_session_id_changed and not delta.messages and not retry:
            logger.warning(
                "session %r: the service-side conversation moved on and no message was stored here; give the agent "
                "agent_store.agent_framework.StoreHistoryProvider to keep a local transcript", self.storage_id
            )  # fmt: skip
        self.pending = delta
        one_call = commit_postgresql if self.db.dialect == "postgresql" else commit_sqlite
        # The common case: a first attempt, outside a serialized run, no key to look up, a session it loaded.
        fast = one_call.AVAILABLE and not retry and self.held is None and self.idempotency_key is None
        fast = fast and self.base_id is None and self.response is None  # a branch, a response: checked (0017)
        fast = fast and not snap.verify_new_ids and (not delta.compacts or one_call.takes(self.call_for(delta)))
        held, self.held = self.held, None  # a serialized run's lock ends with this commit, either way
        with telemetry.operation("commit", session_id=self.storage_id) as span:
            written, attempts = None, 1 if held is not None else 2  # a dead pooled connection: once more
            if fast:  # the common case: one round trip (SQLite: one hop), or nothing written and the checked path
                try:
                    written, lost = await one_call.attempt(self.call_for(delta))
                except InvalidValueError:
                    self.pending = None  # refused while building the call: nothing was sent
                    await self.log_unwritten("failed")
                    raise
                except (StorageUnavailableError, DatabaseError) as exc:
                    self._unless_refused(exc, landed_before=False)
                    raise
                attempts, retry = (0 if written else 1 if lost else 2), retry or lost
                if not written and not lost:  # refused, or never sent: certainly not landed
                    self._maybe_landed = False
                if lost:
                    self._trying_once_more()
            incarnation = (snap.incarnation or 0) if snap.exists else delta.incarnation  # a one-call creation's
            for attempt in range(attempts):
                last_try, landed_before = attempt == attempts - 1, self._maybe_landed
                try:
                    async with self.db.transaction(
                        write=True, doing="committing a run", held=held, finish=True, committing=self._sent
                    ) as db:
                        history = self.history if self.skip_replays else None
                        incarnation, written, self._maybe_landed = await checked_commit.write(
                            db, self.call_for(delta), check_landed=retry or self.idempotency_key is not None,
                            maybe_landed=self._maybe_landed, history=history,
                        )  # fmt: skip
                    break
                except checked_commit.Landed as landed:
                    return self._committed(delta, landed.incarnation, landed.row)
                except checked_commit.HeadMoved:
                    self.pending = None  # nothing written: the caller branches and commits again (run/points.py)
                    raise
                except (ConflictError, SessionNotFoundError, SessionClosedError, InvalidValueError) as exc:
                    if isinstance(exc, SessionNotFoundError) and landed_before and not snap.exists:
                        # This attempt wrote nothing, but the first one, whose session is not there, may still
                        # land (only the server's answer proves it did not): the next commit() retries exactly
                        # that delta and finds it, never a new one that would conflict with it.
                        raise
                    self.pending = None  # refused before COMMIT: certainly not written
                    if isinstance(exc, ConflictError):
                        telemetry.conflicts.add(1)
                    if not isinstance(exc, SessionNotFoundError):  # (a deleted session has no run log)
                        await self.log_unwritten("conflict" if isinstance(exc, ConflictError) else "failed")
                    if isinstance(exc, StoredTwice):
                        raise await named(self.db, self.storage_id, exc) from exc.__cause__
                    raise
                except (StorageUnavailableError, DatabaseError) as exc:
                    self._unless_refused(exc, landed_before=landed_before)
                    if last_try or not isinstance(exc, StorageUnavailableError) or not exc.connection_lost:
                        raise
                    self._trying_once_more()
                    retry = True
            result = self._committed(delta, incarnation, written)
            span.set_attributes({"messages": result.messages_written, "state_keys": result.state_keys_written})
            telemetry.messages_written.add(result.messages_written)
            telemetry.state_keys_written.add(result.state_keys_written)
            return result

    def call_for(self, delta: Delta) -> OneCall:
        return OneCall(
            db=self.db, session_id=self.storage_id, user_id=self.user_id, agent_id=self.agent_id,
            scopes=self.key_scopes, snapshot=self.snapshot, delta=delta, log_ids=self._log_ids(delta.run_id),
            since=self.fence_since(), sent=self._sent, response=self.response,
            base_seq=self.snapshot.end // POSITION_STEP if self.base_id is not None else None, cipher=self.cipher,
        )  # fmt: skip

    def _trying_once_more(self) -> None:  # a dead pooled connection: once more on a fresh one, as a retry (by run id)
        logger.info("session %r: the commit met a dropped connection; trying once more", self.storage_id)

    def _sent(self) -> None:
        self._maybe_landed = True

    def _unless_refused(self, exc: AgentStoreError, *, landed_before: bool) -> None:
        """The database answered this attempt with a refusal (a lock timeout, a deadlock, SQLite's lock, any
        error of its own): the attempt certainly did not land, whatever was sent, so a retry of a first commit
        creates the session instead of looking for one this attempt never made. Only a lost connection (or a
        cancellation) leaves the outcome unknown."""
        if isinstance(exc, DatabaseError) or (isinstance(exc, StorageUnavailableError) and exc.refused):
            self._maybe_landed = landed_before

    @tenancy.for_its("user_id")  # a failed run's ledger rows and charges are its user's too
    async def log_unwritten(self, outcome: str) -> None:
        """Log a run that wrote nothing ("conflict", "failed") and its model calls, in a transaction of its own:
        operators see conflicts, and spent tokens are charged (also where no log row may go: record_unwritten)."""
        snap, log_ids = self.snapshot, self._log_ids(ids.run_id())
        incarnation = snap.incarnation if snap.exists else None
        await runlog.log_unwritten(self.db, outcome, self.calls, log_ids, snap.version, incarnation,
                                   user_id=self.user_id, agent_id=self.agent_id,
                                   since=self.fence_since())  # fmt: skip

    def _log_ids(self, run_id: str) -> dict[str, Any]:
        return {"session_id": self.storage_id, "run_id": run_id, "started_at": self._started_at}

    def next_delta(self) -> Delta:
        settings = self.db.settings
        return diff(
            self.snapshot, self.session.state, self.history, self.key_scopes,
            max_bytes=settings.max_value_bytes, cipher=self.cipher, run_id=self._next_run_id(),
            history_key=HISTORY_KEY, service_session_id=self.session.service_session_id, calls=self.calls,
        )  # fmt: skip

    def _committed(self, delta: Delta, incarnation: int, written: Any) -> CommitResult:
        return after_commit.committed(self, delta, incarnation, written)


def run_of(session: AgentSession) -> Run | None:
    """The store run that loaded ``session``, if it came from ``store.load`` / ``store.session``."""
    if not isinstance(session, StoredSession) or session._run_attributes is None:
        return None
    run: Run | None = session._run_ref() if session._run_ref is not None else None
    if run is None:  # nothing holds the Run that loaded it (StoreSessionStore.get hands out the session alone)
        run = Run.__new__(Run)
        run.session, run.__dict__ = session, session._run_attributes
        session._run_ref = weakref.ref(run)
    return run
