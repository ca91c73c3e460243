"""AG-UI thread snapshots in the store's database: ``StoreThreadSnapshotStore`` (``pip install "agent-store[ag-ui]"``).

Web front ends speaking AG-UI (``agent-framework-ag-ui``) keep the latest snapshot of each thread (its replayable
messages, shared state, pending interrupts and the private session state) under an application-defined scope,
the app's authorization boundary. One row per (scope, thread) in ``agent_ui_snapshots`` (migration 0006): a
scope never sees another's threads, and ``erase_user(user_id)`` removes the snapshots whose scope is that user id.
A ``save`` dates from the ``get`` before it (the runner reads the thread, the model thinks, the runner saves; the
earliest get of the thread on record, see read_times.py): if the scope's user was erased since, it is refused, so
an erased transcript is never written back.

A save made inside a detached run (journal/detached.py) records where that run's journal stood
(``"agent_store_run": {"run_id", "seq"}`` beside the snapshot's fields): a client that reloads is given this
snapshot and then the run's events after that number (ag_ui_resume.py), none missed, none twice.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, select
from sqlalchemy.dialects import postgresql, sqlite

from agent_store.db import codec, erasures, sealing, tenancy
from agent_store.db.erasures import erased_since
from agent_store.db.statements import lock_user
from agent_store.db.tables import ui_snapshots_t
from agent_store.errors import InvalidValueError, SessionNotFoundError, needs_extra
from agent_store.journal.detached import journal_point
from agent_store.run.commit import ERASURE_MARGIN
from agent_store.run.read_times import UNKNOWN, ReadTimes

if TYPE_CHECKING:
    from agent_framework_ag_ui import AGUIThreadSnapshot

    from agent_store.store import Store

__all__ = ["StoreThreadSnapshotStore", "served_marks"]
U = ui_snapshots_t.c
RUN_MARK = "agent_store_run"  # where a detached run's journal stood when the snapshot was saved
# A run's mark: its stream id, the sequence number the snapshot reflects, and the user messages it started with
# that the snapshot does not hold yet (shown on a reload; the package's own next save takes them in).
RunMark = tuple[str, int, list[dict[str, Any]]]
# The marks of the snapshots ``get`` served in this context, by (scope, thread): see served_marks().
_SERVED: contextvars.ContextVar[dict[tuple[str, str], RunMark | None] | None] = contextvars.ContextVar(
    "agent_store_served_marks", default=None
)


@contextlib.contextmanager
def served_marks() -> Iterator[dict[tuple[str, str], RunMark | None]]:
    """Collect, for each snapshot ``get`` returns in this block, the run mark read with it in the same row (a
    mark read apart could be a later save's, and a client resuming from it would miss the events between)."""
    marks: dict[tuple[str, str], RunMark | None] = {}
    token = _SERVED.set(marks)
    try:
        yield marks
    finally:
        _SERVED.reset(token)


class StoreThreadSnapshotStore:
    """The AG-UI package's ``AGUIThreadSnapshotStore`` protocol (save / get / delete / clear), on both backends."""

    def __init__(self, store: Store) -> None:
        with needs_extra("ag-ui", "StoreThreadSnapshotStore"):
            from agent_framework_ag_ui import AGUIThreadSnapshot
        self._db, self._snapshot_type = store.db, AGUIThreadSnapshot
        self._reads = ReadTimes()  # per (scope, thread): when it was read (read_times.py)

    @tenancy.for_argument("scope")
    async def save(self, *, scope: str, thread_id: str, snapshot: AGUIThreadSnapshot,
                   pending: list[dict[str, Any]] | None = None) -> None:  # fmt: skip
        """Save (replace) the thread's latest snapshot (``pending``: a run's new user messages, kept in its mark).

        Raises ``InvalidValueError`` for what JSON cannot hold, ``SessionNotFoundError`` when the scope's user was
        erased after the ``get`` this save follows (none on record: while any erasure of it is on record)."""
        key = _key(scope, thread_id)
        document = dataclasses.asdict(snapshot)
        if (point := journal_point()) is not None:
            document[RUN_MARK] = {"run_id": point[0], "seq": point[1], **({"pending": pending} if pending else {})}
        text = codec.dumps(
            document, where=f"snapshot of thread {thread_id!r}",
            max_bytes=self._db.settings.max_value_bytes, sort_keys=False,
        )  # fmt: skip
        read_at = self._reads.earliest(key)  # none on record: any erasure of the scope still on record fences it
        since = UNKNOWN if read_at is None else read_at - ERASURE_MARGIN
        fence = erasures.fence(self._db, key[0], since, lambda: _erased(thread_id))  # (before a first key)
        if (cipher := await sealing.for_user(self._db, key[0], writing=True, fence=fence)) is not None:
            text = sealing.seal_json(cipher, "u\0" + key[1], text)  # the scope's keys
        row = {"scope": key[0], "thread_id": key[1], "snapshot": text, "updated_at": datetime.now(UTC)}
        async with self._db.transaction(write=True, doing="saving an AG-UI thread snapshot") as conn:
            await lock_user(conn, key[0], exclusive=False)  # erase_user takes it too: wholly before or after
            if await erased_since(conn, key[0], since):
                raise _erased(thread_id)
            insert = (postgresql if conn.dialect.name == "postgresql" else sqlite).insert(ui_snapshots_t).values(row)
            changed = {"snapshot": insert.excluded.snapshot, "updated_at": insert.excluded.updated_at}
            await conn.execute(insert.on_conflict_do_update(index_elements=[U.scope, U.thread_id], set_=changed))

    @tenancy.for_argument("scope")
    async def get(self, *, scope: str, thread_id: str) -> AGUIThreadSnapshot | None:
        """The thread's latest snapshot in this scope, or None (also for another scope's thread)."""
        key = _key(scope, thread_id)
        self._reads.read(key, datetime.now(UTC))
        async with self._db.transaction(write=False, doing="reading an AG-UI thread snapshot") as conn:
            found = (await conn.execute(select(U.snapshot).where(U.scope == key[0], U.thread_id == key[1]))).first()
        stored = None if found is None else found[0]
        if stored is not None:  # sealed with the scope's keys (a store with keys=): opened
            cipher = await sealing.for_user(self._db, key[0], writing=False)
            stored = sealing.open_json(cipher, "u\0" + key[1], stored)[0]
        if (marks := _SERVED.get()) is not None:
            mark = stored.get(RUN_MARK) if stored is not None else None
            marks[key] = (mark["run_id"], int(mark["seq"]), list(mark.get("pending") or [])) \
                if isinstance(mark, dict) else None  # fmt: skip
        if stored is None:
            return None
        fields = {f.name for f in dataclasses.fields(self._snapshot_type)}
        snapshot: AGUIThreadSnapshot = self._snapshot_type(**{k: v for k, v in stored.items() if k in fields})
        return snapshot

    @tenancy.for_argument("scope")
    async def delete(self, *, scope: str, thread_id: str) -> bool:
        """Delete the thread's snapshot; False if there was none in this scope."""
        key = _key(scope, thread_id)
        async with self._db.transaction(write=True, doing="deleting an AG-UI thread snapshot") as conn:
            done = await conn.execute(delete(ui_snapshots_t).where(U.scope == key[0], U.thread_id == key[1]))
        return bool(done.rowcount)

    @tenancy.for_argument("scope")
    async def clear(self, *, scope: str | None = None) -> None:
        """Delete every snapshot of ``scope``, or every snapshot of every scope."""
        statement = delete(ui_snapshots_t)
        if scope is not None:
            statement = statement.where(U.scope == _checked(scope, "scope"))
        async with self._db.transaction(write=True, doing="clearing AG-UI thread snapshots") as conn:
            await conn.execute(statement)


def _key(scope: Any, thread_id: Any) -> tuple[str, str]:
    return _checked(scope, "scope"), _checked(thread_id, "thread_id")


def _checked(value: Any, name: str) -> str:
    """As the AG-UI package's in-memory store checks them: non-empty strings (and here, at most 255 characters)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string.")
    if not value:
        raise InvalidValueError(f"{name} must be a non-empty string.")
    codec.check_id(value, name, required=True)
    return value


def _erased(thread_id: str) -> SessionNotFoundError:
    return SessionNotFoundError(f"thread {thread_id!r}: its scope's user was erased since it was read")
