"""One run of an agent on a stored session: the whole data flow of agent_store is in this file.

    run = await store.load("chat-42", user_id="u1")   # 1. a short read: session row, state rows, messages
    await agent.run("...", session=run.session)       # 2. the model thinks; no connection is held
    await run.commit()                                # 3. one write transaction with only the delta

``store.session(...)`` is these three steps as an ``async with`` block.

Concurrency is settled by the database, not by locks in this process:
- the commit's first statement updates the session row (``version + 1``, ``next_seq + n``); that row lock
  orders concurrent commits, so ``seq`` is gap-free and in commit order;
- each state row records the session version that wrote it; a key this run changed whose stored version
  is no longer the one it loaded was changed by someone else: :class:`ConflictError`, nothing written;
- the ``agent_runs`` primary key makes a retried commit of the same run a no-op.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from agent_framework import AgentSession, InMemoryHistoryProvider, Message
from sqlalchemy import delete, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from . import codec
from .errors import ConflictError, InvalidValueError, SessionNotFoundError
from .models import CommitResult
from .tables import ID_MAX, messages_t, runs_t, sessions_t, state_t

if TYPE_CHECKING:
    from .store import Store

# Where a plain Agent's auto-added InMemoryHistoryProvider keeps its messages: state["in_memory"]["messages"].
HISTORY_KEY = InMemoryHistoryProvider.DEFAULT_SOURCE_ID


def check_id(value: str | None, what: str, *, required: bool = False) -> None:
    """Ids are opaque, bounded, bound as SQL parameters; refuse what no backend stores faithfully."""
    if value is None and not required:
        return
    if not isinstance(value, str) or not value:
        raise InvalidValueError(f"{what} must be a non-empty string, not {value!r}")
    if len(value) > ID_MAX or "\x00" in value:
        raise InvalidValueError(f"{what} must be at most {ID_MAX} characters with no NUL characters")


@dataclass
class Snapshot:
    """What the run loaded; the commit writes the difference between this and the session."""

    exists: bool = False
    version: int = 0
    service_session_id: Any = None
    state_text: dict[str, str] = field(default_factory=dict)  # canonical JSON of each key as loaded
    state_version: dict[str, int] = field(default_factory=dict)  # session version that wrote each key
    message_ids: set[str] = field(default_factory=set)


@dataclass
class Delta:
    upserts: dict[str, str]
    deletes: list[str]
    messages: list[dict[str, Any]]
    service_session_id_changed: bool

    @property
    def empty(self) -> bool:
        return not (self.upserts or self.deletes or self.messages or self.service_session_id_changed)


class Run:
    """A loaded session and what is needed to commit what the agent changed in it."""

    def __init__(
        self, store: Store, session: AgentSession, snapshot: Snapshot, *, user_id: str | None, agent_id: str | None
    ) -> None:
        self.store = store
        self.session = session
        self.user_id = user_id
        self.agent_id = agent_id
        self._snapshot = snapshot
        self._run_id = uuid.uuid4().hex
        self._started_at = datetime.now(UTC)
        self._attempted = False  # a commit was sent whose outcome we may not know

    async def commit(self) -> CommitResult:
        """Write the run's new messages and changed state keys in one transaction.

        Safe to call again after a :class:`StorageUnavailableError`: if the first attempt did commit,
        the retry finds its run row and writes nothing twice.

        Raises:
            InvalidValueError: a state value or message cannot be stored (checked before any SQL).
            ConflictError: another run changed one of the same state keys since this run loaded.
            SessionNotFoundError: the session was deleted, or created by another user, meanwhile.
            StorageUnavailableError: the database failed; the session in memory is intact, retry.
        """
        delta = self._delta()
        snap = self._snapshot
        if delta.empty and snap.exists:
            return CommitResult(session_id=self.session.session_id, run_id=self._run_id, version=snap.version)
        async with self.store._transaction(write=True, doing="committing a run") as db:
            if self._attempted and await self._already_committed(db):
                return self._committed(delta, snap.version + 1)
            self._attempted = True
            version = await self._write(db, delta)
        return self._committed(delta, version)

    def _delta(self) -> Delta:
        """Encode and diff in memory; a value that cannot be stored fails here, before any SQL."""
        snap, limit = self._snapshot, self.store.max_value_bytes
        state = dict(self.session.state)
        history = state.pop(HISTORY_KEY, None)
        new_messages: list[Message] = []
        if isinstance(history, dict):
            rest = {k: v for k, v in history.items() if k != "messages"}
            if rest:
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
            check_id(key, "a state key")
            encoded = codec.dumps(codec.encode_state(value, key=key), where=f"state[{key!r}]", max_bytes=limit)
            if snap.state_text.get(key) != encoded:
                upserts[key] = encoded
        rows = [codec.message_row(m, max_bytes=limit) for m in new_messages]
        return Delta(
            upserts=upserts,
            deletes=[key for key in snap.state_text if key not in state],
            messages=rows,
            service_session_id_changed=self.session.service_session_id != snap.service_session_id,
        )

    async def _write(self, db: AsyncConnection, delta: Delta) -> int:
        sid, now, snap = self.session.session_id, datetime.now(UTC), self._snapshot
        dialect = postgresql if db.dialect.name == "postgresql" else sqlite
        if not snap.exists:
            await db.execute(
                dialect.insert(sessions_t).on_conflict_do_nothing(),
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
        values: dict[str, Any] = {
            "version": sessions_t.c.version + 1,
            "next_seq": sessions_t.c.next_seq + len(delta.messages),
            "updated_at": now,
        }
        if delta.service_session_id_changed:
            values["service_session_id"] = codec.dumps(self.session.service_session_id, where="service_session_id")
        bumped = (
            await db.execute(
                update(sessions_t)
                .where(sessions_t.c.id == sid, sessions_t.c.user_id.is_not_distinct_from(self.user_id))
                .values(values)
                .returning(sessions_t.c.version, sessions_t.c.next_seq)
            )
        ).first()
        if bumped is None:
            raise SessionNotFoundError(f"session {sid!r} no longer exists for user {self.user_id!r}")
        version, next_seq = bumped
        changed = [*delta.upserts, *delta.deletes]
        if changed:
            stored = dict(
                (
                    await db.execute(
                        select(state_t.c.key, state_t.c.version).where(
                            state_t.c.session_id == sid, state_t.c.key.in_(changed)
                        )
                    )
                ).all()
            )
            lost = sorted(k for k in changed if stored.get(k) != snap.state_version.get(k))
            if lost:
                raise ConflictError(sid, lost)
        if delta.deletes:
            await db.execute(delete(state_t).where(state_t.c.session_id == sid, state_t.c.key.in_(delta.deletes)))
        if delta.upserts:
            upsert = dialect.insert(state_t)
            await db.execute(
                upsert.on_conflict_do_update(
                    index_elements=[state_t.c.session_id, state_t.c.key],
                    set_={
                        "value": upsert.excluded.value,
                        "version": upsert.excluded.version,
                        "updated_at": upsert.excluded.updated_at,
                    },
                ),
                [
                    {"session_id": sid, "key": k, "value": v, "version": version, "updated_at": now}
                    for k, v in delta.upserts.items()
                ],
            )
        first_seq = next_seq - len(delta.messages)
        if delta.messages:
            await db.execute(
                insert(messages_t),
                [
                    {**row, "session_id": sid, "seq": first_seq + i, "run_id": self._run_id, "created_at": now}
                    for i, row in enumerate(delta.messages)
                ],
            )
        await db.execute(
            insert(runs_t),
            {
                "session_id": sid,
                "run_id": self._run_id,
                "version": version,
                "messages_written": len(delta.messages),
                "state_keys_written": len(changed),
                "started_at": self._started_at,
                "committed_at": now,
            },
        )
        return int(version)

    async def _already_committed(self, db: AsyncConnection) -> bool:
        found = await db.execute(
            select(runs_t.c.version).where(
                runs_t.c.session_id == self.session.session_id, runs_t.c.run_id == self._run_id
            )
        )
        return found.first() is not None

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
            snap.state_text[key], snap.state_version[key] = text, version
        snap.message_ids.update(row["message_id"] for row in delta.messages)
        self._run_id, self._attempted = uuid.uuid4().hex, False
        return result


async def load(
    store: Store, session_id: str, *, user_id: str | None, agent_id: str | None, history_limit: int | None
) -> Run:
    """Read one session in a short read-only transaction and rebuild its ``AgentSession``."""
    check_id(session_id, "session_id", required=True)
    check_id(user_id, "user_id")
    check_id(agent_id, "agent_id")
    if history_limit is not None and (type(history_limit) is not int or history_limit < 0):
        raise InvalidValueError(f"history_limit must be a non-negative int or None, not {history_limit!r}")
    snap = Snapshot()
    session = AgentSession(session_id=session_id)
    messages: list[Message] = []
    async with store._transaction(write=False, doing="loading a session") as db:
        row = (
            await db.execute(
                select(
                    sessions_t.c.user_id,
                    sessions_t.c.agent_id,
                    sessions_t.c.service_session_id,
                    sessions_t.c.version,
                    sessions_t.c.next_seq,
                ).where(sessions_t.c.id == session_id)
            )
        ).first()
        if row is not None:
            if row.user_id != user_id or (row.agent_id is not None and row.agent_id != agent_id):
                # Same answer whether the id is unused or someone else's: ids do not leak across tenants.
                raise SessionNotFoundError(f"no session {session_id!r} for user {user_id!r}")
            snap.exists, snap.version = True, row.version
            snap.service_session_id = session.service_session_id = row.service_session_id
            for key, value, version in (
                await db.execute(
                    select(state_t.c.key, state_t.c.value, state_t.c.version).where(state_t.c.session_id == session_id)
                )
            ).all():
                snap.state_text[key] = codec.dumps(value, where=f"state[{key!r}]", max_bytes=2**62)
                snap.state_version[key] = version
                session.state[key] = codec.decode_state(value, key=key)
            query = select(messages_t.c.message_id, messages_t.c.body).where(messages_t.c.session_id == session_id)
            if history_limit is not None:
                query = query.where(messages_t.c.seq >= row.next_seq - history_limit)
            for message_id, body in (await db.execute(query.order_by(messages_t.c.seq))).all():
                snap.message_ids.add(message_id)
                messages.append(codec.message_from_row(body))
    history = session.state.get(HISTORY_KEY)
    session.state[HISTORY_KEY] = {**(history if isinstance(history, dict) else {}), "messages": messages}
    return Run(store, session, snap, user_id=user_id, agent_id=agent_id)
