"""One run of an agent on a stored session: the whole data flow of agent_store is in this file.

    run = await store.load("chat-42", user_id="u1")   # 1. a short read: session row, state rows, messages
    await agent.run("...", session=run.session)       # 2. the model thinks; no connection is held
    await run.commit()                                # 3. one write transaction with only the delta

``store.session(...)`` is these three steps as an ``async with`` block. The SQL itself is in statements.py.

Concurrency is settled by the database, not by locks in this process:
- the commit's first statement updates the session row (``version + 1``, ``next_seq + n``); that row lock
  orders concurrent commits, so ``seq`` is gap-free and in commit order;
- each state row records the stamp of the commit that wrote it; a key this run changed whose stored stamp is
  no longer the one it loaded was changed by someone else: :class:`ConflictError`, nothing written;
- the ``agent_runs`` primary key makes a retried commit of the same run a no-op.

State keys prefixed ``user:`` / ``app:`` live in rows shared by all of a user's / an app's sessions (same
rules, same transaction); ``temp:`` keys are never stored.
"""

from __future__ import annotations

import copy
import logging
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from agent_framework import AgentSession, InMemoryHistoryProvider, Message
from sqlalchemy.exc import IntegrityError

from . import codec, telemetry
from . import statements as sql
from .errors import (
    AgentStoreError,
    ConflictError,
    InvalidValueError,
    SessionClosedError,
    SessionExpiredError,
    SessionNotFoundError,
)
from .models import CommitResult

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from .store import Store

# Where a plain Agent's auto-added InMemoryHistoryProvider keeps its messages: state["in_memory"]["messages"].
HISTORY_KEY = InMemoryHistoryProvider.DEFAULT_SOURCE_ID
logger = logging.getLogger("agent_store")


class StoredSession(AgentSession):
    """The ``AgentSession`` a store hands out: an ordinary session that also knows the run that loaded it.

    The framework seams (history provider, session store, memory) find the run through it. The link is not
    serialized (``to_dict``) and not copied: a deep copy is a plain ``AgentSession``.
    """

    _run: Run | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> AgentSession:
        clone = AgentSession(
            session_id=self.session_id, service_session_id=copy.deepcopy(self.service_session_id, memo)
        )
        clone.state = copy.deepcopy(self.state, memo)
        return clone


def run_of(session: AgentSession) -> Run | None:
    """The store run that loaded ``session``, if it came from ``store.load`` / ``store.session``."""
    return session._run if isinstance(session, StoredSession) else None


@dataclass
class Snapshot:
    """What the run loaded; the commit writes the difference between this and the session."""

    exists: bool = False
    version: int = 0
    service_session_id: Any = None
    state_text: dict[str, str] = field(default_factory=dict)  # canonical JSON of each key as loaded
    state_version: dict[str, int] = field(default_factory=dict)  # stamp of the commit that wrote each key
    message_ids: set[str] = field(default_factory=set)
    # A run for a session it did not load may carry messages stored already (a retried save): look their ids up.
    # A windowed load needs no lookup: its new messages are new objects, and the unique index catches misuse.
    verify_new_ids: bool = False
    ttl_seconds: int | None = None  # the session's own idle time-to-live, if it has one


@dataclass
class Delta:
    upserts: dict[str, str]  # state key -> canonical JSON
    deletes: list[str]
    messages: list[codec.EncodedMessage]
    service_session_id_changed: bool

    @property
    def empty(self) -> bool:
        return not (self.upserts or self.deletes or self.messages or self.service_session_id_changed)


class Run:
    """A loaded session, and what is needed to commit what the agent changed in it."""

    def __init__(
        self, store: Store, session: AgentSession, snapshot: Snapshot, *, user_id: str | None, agent_id: str | None
    ) -> None:
        self.store, self.session, self.user_id, self.agent_id = store, session, user_id, agent_id
        self._snapshot = snapshot
        self._scopes = sql.scopes(session.session_id, user_id, store.app_id)
        self._run_id, self._stamp = uuid.uuid4().hex, sql.new_stamp()  # both kept for a retry of the same commit
        self._started_at = datetime.now(UTC)
        self._attempted = False  # a commit was sent whose outcome we may not know
        self.usage: dict[str, int] = {}  # token usage reported by the agent's responses (see add_usage)
        self._held: AsyncConnection | None = None  # serialized mode: the transaction that holds the lock
        if isinstance(session, StoredSession):
            session._run = self  # a cycle the garbage collector frees with the session

    @classmethod
    def unloaded(cls, store: Store, session: AgentSession, *, user_id: str | None, agent_id: str | None = None) -> Run:
        """A run for a session the store did not load: every message and key it holds is news to commit.

        Messages already stored (by id) are skipped, and keys that exist already are conflicts.
        """
        codec.check_id(session.session_id, "session_id", required=True)
        return cls(store, session, Snapshot(verify_new_ids=True), user_id=user_id, agent_id=agent_id)

    @property
    def exists(self) -> bool:
        """Whether the session was in the database when loaded (or has been committed since)."""
        return self._snapshot.exists

    @property
    def history(self) -> list[Message]:
        """The run's message list (what a plain Agent's in-memory provider reads and appends to)."""
        slot = self.session.state.setdefault(HISTORY_KEY, {})
        messages: list[Message] = slot.setdefault("messages", [])
        return messages

    def add_messages(self, messages: Iterable[Message]) -> None:
        """Append messages to the run's history (for history providers); the same object is never added twice."""
        history = self.history
        present = {id(m) for m in history}
        history.extend(m for m in messages if id(m) not in present)

    async def discard(self) -> None:
        """Give up the run without writing (releases a serialized run's lock); ``store.session`` does this on errors."""
        held, self._held = self._held, None
        if held is not None:
            await held.rollback()
            await held.close()

    def add_usage(self, usage: Mapping[str, Any] | None) -> None:
        """Add a response's token usage to the run log (the store's context providers call this)."""
        for key in ("input_token_count", "output_token_count"):
            if usage and isinstance(usage.get(key), int):
                self.usage[key] = self.usage.get(key, 0) + usage[key]

    async def commit(self) -> CommitResult:
        """Write the run's new messages and changed state keys in one transaction.

        Safe to call again after a :class:`StorageUnavailableError`: if the first attempt did commit, the
        retry finds its run row and writes nothing twice. After a successful commit the run can go on and
        commit again later; each commit writes only what changed since the previous one.

        Raises:
            InvalidValueError: a state value or message cannot be stored (checked before any SQL).
            ConflictError: another run changed one of the same state keys since this run loaded.
            SessionNotFoundError: the session was deleted, or created by another user, meanwhile.
            StorageUnavailableError: the database failed; the session in memory is intact, retry.
        """
        try:
            delta = self._delta()
        except BaseException:
            await self.discard()
            raise
        snap = self._snapshot
        if delta.empty and snap.exists:
            await self.discard()
            return CommitResult(session_id=self.session.session_id, run_id=self._run_id, version=snap.version)
        with telemetry.operation("commit", session_id=self.session.session_id) as span:
            try:
                held, self._held = self._held, None  # a serialized run's lock ends with this commit, either way
                async with self.store._transaction(write=True, doing="committing a run", held=held, finish=True) as db:
                    sid = self.session.session_id
                    if self._attempted and (landed := await sql.run_recorded(db, sid, self._run_id)):
                        return self._committed(delta, landed)
                    self._attempted = True
                    version = await self._write(db, delta)
            except ConflictError:
                telemetry.conflicts.add(1)
                await self._log_conflict()
                raise
            result = self._committed(delta, version)
            span.set_attributes({"messages": result.messages_written, "state_keys": result.state_keys_written})
            telemetry.messages_written.add(result.messages_written)
            telemetry.state_keys_written.add(result.state_keys_written)
            return result

    async def _log_conflict(self) -> None:
        """Record the refused run in the run log (its own transaction), so operators can see conflicts."""
        row = self._log_row(self._snapshot.version, [], 0, "conflict")
        self._run_id, self._attempted = uuid.uuid4().hex, False  # the refused attempt was rolled back
        if not self._snapshot.exists:
            return
        try:
            async with self.store._transaction(write=True, doing="logging a conflict") as db:
                await sql.record_run(db, row)
        except AgentStoreError:  # the conflict itself is what the caller must see
            logger.warning("could not log the conflict of run %s", row["run_id"], exc_info=True)

    def _log_row(self, version: int, records: list[codec.EncodedMessage], keys: int, outcome: str) -> dict[str, Any]:
        ids = {"session_id": self.session.session_id, "run_id": self._run_id, "started_at": self._started_at}
        return sql.run_log_row(ids, version, records, keys, self.usage, outcome)

    def _delta(self) -> Delta:
        """Encode and diff in memory; a value that cannot be stored fails here, before any SQL."""
        snap, limit = self._snapshot, self.store.max_value_bytes
        state = {k: v for k, v in self.session.state.items() if not k.startswith(sql.TEMP_PREFIX)}
        history = state.pop(HISTORY_KEY, None)
        new_messages: list[Message] = []
        if isinstance(history, dict):
            if rest := {k: v for k, v in history.items() if k != "messages"}:
                state[HISTORY_KEY] = rest
            seen: set[str | None] = set(snap.message_ids)
            for message in history.get("messages", []):
                message_id = getattr(message, "message_id", None)
                if message_id is None or message_id not in seen:
                    new_messages.append(message)
                    seen.add(message_id)
        elif history is not None:
            state[HISTORY_KEY] = history
        upserts: dict[str, str] = {}
        for key, value in state.items():
            codec.check_id(key, "a state key")
            sql.scope_of(key, self._scopes)  # a user: key without a user fails here, not in SQL
            encoded = codec.dumps(codec.encode_state(value, key=key), where=f"state[{key!r}]", max_bytes=limit)
            if snap.state_text.get(key) != encoded:
                upserts[key] = encoded
        names: dict[str, str] = {}
        return Delta(
            upserts=upserts,
            deletes=[key for key in snap.state_text if key not in state],
            messages=[
                codec.message_record(m, max_bytes=limit, tool_names=names, cipher=self.store.message_cipher)
                for m in new_messages
            ],
            service_session_id_changed=self.session.service_session_id != snap.service_session_id,
        )

    async def _write(self, db: AsyncConnection, delta: Delta) -> int:
        sid, now, snap = self.session.session_id, datetime.now(UTC), self._snapshot
        if not snap.exists:
            await sql.create_session(
                db,
                {
                    "id": sid,
                    "user_id": self.user_id,
                    "agent_id": self.agent_id,
                    "version": 0,
                    "next_seq": 0,
                    "created_at": now,
                    "updated_at": now,
                },
            )
        ttl = snap.ttl_seconds or self.store.idle_ttl_seconds
        extra: dict[str, Any] = {"now": now, "expires_at": now + timedelta(seconds=ttl) if ttl else None}
        if delta.service_session_id_changed:
            extra["service_session_id"] = codec.dumps(self.session.service_session_id, where="service_session_id")
        version, next_seq = await sql.bump_session(db, sid, self.user_id, len(delta.messages), extra)
        first_seq = next_seq - len(delta.messages)

        changed = [*delta.upserts, *delta.deletes]
        for scope in self._scopes:
            keys = [k for k in changed if sql.scope_of(k, self._scopes) is scope]
            if not keys:
                continue
            if scope.prefix:
                await sql.lock_shared_scope(db, scope)
            # Every commit to this session bumps its version under the row lock: if ours is the only bump since
            # the load, nobody else can have written the session's own keys, and the stamp check is skipped.
            if scope.prefix or not snap.exists or version != snap.version + 1:
                stored = await sql.stored_versions(db, scope, [scope.stored_key(k) for k in keys])
                if lost := sorted(k for k in keys if stored.get(k) != snap.state_version.get(k)):
                    raise ConflictError(sid, lost)
            upserts = {k: v for k, v in delta.upserts.items() if k in keys}
            stamp = self._stamp if scope.prefix else version
            await sql.write_state(db, scope, upserts, [k for k in delta.deletes if k in keys], stamp, now)

        records = delta.messages
        if records and snap.verify_new_ids:
            # Skip any message this run carries that is stored already (a retried save of a session it did not load).
            stored_ids = await sql.already_stored(db, sid, [r.message_id for r in records])
            if stored_ids:
                records = delta.messages = [r for r in records if r.message_id not in stored_ids]
                await sql.give_back_seq(db, sid, len(stored_ids))
        try:
            await sql.insert_messages(db, sid, records, first_seq, self._run_id, now)
        except IntegrityError as exc:  # (session_id, message_id) is unique: an old message added to the history
            raise InvalidValueError(f"session {sid!r}: a message of this run has an id that is already stored") from exc
        await sql.record_run(db, self._log_row(version, records, len(changed), "committed"))
        return version

    def _committed(self, delta: Delta, version: int) -> CommitResult:
        """Make the snapshot describe the database as this run left it, so a later commit writes only news."""
        snap = self._snapshot
        result = CommitResult(
            session_id=self.session.session_id,
            run_id=self._run_id,
            version=version,
            messages_written=len(delta.messages),
            state_keys_written=len(delta.upserts) + len(delta.deletes),
        )
        snap.exists, snap.version = True, version
        snap.service_session_id = self.session.service_session_id
        for key in delta.deletes:
            snap.state_text.pop(key, None)
            snap.state_version.pop(key, None)
        for key, text in delta.upserts.items():
            snap.state_text[key] = text
            shared = key.startswith((sql.USER_PREFIX, sql.APP_PREFIX))
            snap.state_version[key] = self._stamp if shared else version
        snap.message_ids.update(r.message_id for r in delta.messages)
        self._run_id, self._stamp, self._attempted = uuid.uuid4().hex, sql.new_stamp(), False
        self.usage = {}
        return result


async def load(
    store: Store,
    session_id: str,
    *,
    user_id: str | None,
    agent_id: str | None,
    history_limit: int | None,
    if_expired: str = "error",
    serialized: bool = False,
) -> Run:
    """Read one session in a short read-only transaction and rebuild its ``AgentSession``.

    An expired session raises :class:`SessionExpiredError`, or with ``if_expired="restart"`` is deleted and
    replaced by a fresh one; a closed session raises :class:`SessionClosedError`. A ``serialized`` run holds its
    session's lock (PostgreSQL advisory lock; SQLite write lock) and a connection from load to commit, so
    concurrent serialized runs on a session queue instead of conflicting.
    """
    codec.check_id(session_id, "session_id", required=True)
    codec.check_id(user_id, "user_id")
    codec.check_id(agent_id, "agent_id")
    if history_limit is not None and (type(history_limit) is not int or history_limit < 0):
        raise InvalidValueError(f"history_limit must be a non-negative int or None, not {history_limit!r}")
    if if_expired not in ("error", "restart"):
        raise InvalidValueError(f'if_expired must be "error" or "restart", not {if_expired!r}')
    with telemetry.operation("load", session_id=session_id):
        held = await store._hold(session_id) if serialized else None
        try:
            try:
                return await _read(store, session_id, user_id, agent_id, history_limit, held)
            except SessionExpiredError:
                if if_expired == "error":
                    raise
            async with store._transaction(write=True, doing="restarting an expired session", held=held) as db:
                await sql.delete_if_expired(db, session_id, user_id, datetime.now(UTC))
            return await _read(store, session_id, user_id, agent_id, history_limit, held)
        except BaseException:
            if held is not None:
                await held.rollback()
                await held.close()
            raise


async def _read(
    store: Store,
    session_id: str,
    user_id: str | None,
    agent_id: str | None,
    history_limit: int | None,
    held: AsyncConnection | None,
) -> Run:
    snap = Snapshot()
    session = StoredSession(session_id=session_id)
    messages: list[Message] = []
    async with store._transaction(write=False, doing="loading a session", held=held) as db:
        row = (await db.execute(sql.READ_SESSION, {"sid": session_id})).first()
        if row is not None:
            if row.user_id != user_id or row.agent_id not in (None, agent_id):
                # Same answer whether the id is unused or someone else's: ids do not leak across tenants.
                raise SessionNotFoundError(f"no session {session_id!r} for user {user_id!r}")
            if row.closed_at is not None:
                raise SessionClosedError(f"session {session_id!r} was closed at {row.closed_at.isoformat()}")
            if row.expires_at is not None and row.expires_at <= datetime.now(UTC):
                raise SessionExpiredError(f"session {session_id!r} expired at {row.expires_at.isoformat()}")
        for prefix, key, value, version in (await db.execute(*sql.read_state(session_id, user_id, store.app_id))).all():
            full_key = prefix + key
            snap.state_text[full_key] = codec.dumps(value, where=f"state[{full_key!r}]", max_bytes=2**62)
            snap.state_version[full_key] = version
            session.state[full_key] = codec.decode_state(value, key=full_key)
        if row is not None:
            snap.exists, snap.version, snap.ttl_seconds = True, row.version, row.ttl_seconds
            snap.service_session_id = session.service_session_id = row.service_session_id
            query = sql.read_messages(session_id, row.next_seq, history_limit)
            for message_id, body in (await db.execute(*query)).all():
                snap.message_ids.add(message_id)
                messages.append(codec.message_from_row(body, store.message_cipher))
    history = session.state.get(HISTORY_KEY)
    session.state[HISTORY_KEY] = {**(history if isinstance(history, dict) else {}), "messages": messages}
    run = Run(store, session, snap, user_id=user_id, agent_id=agent_id)
    run._held = held
    return run
