"""Workflow checkpoints in the store's database: Agent Framework's ``CheckpointStorage`` protocol.

A workflow paused for a human's answer resumes from a checkpoint, often in another process and days later. Each
checkpoint is one row of ``agent_checkpoints`` (migration 0006), its payload exactly what the framework's
checkpoint encoding produces, as ``FileCheckpointStorage`` writes it to a file. Trust: a payload is decoded only
when a caller asks for that checkpoint (``load``, ``list_checkpoints``, ``get_latest``; never to list ids or
describe rows), only after checkpoint_payloads.py found it calls no constructor, and then by the framework's
restricted decoding: its safe types plus those allowed here (``allowed_checkpoint_types``,
``register_checkpoint_type``). A checkpoint that could not be read back that way is refused at ``save``, and one
that came in another way (an imported file, SQL) raises :class:`~agent_store.CheckpointRefusedError` at ``load``.

Saves of one workflow are numbered in commit order (the row lock of its ``agent_checkpoint_workflows`` row), so
"latest" is the last one committed, never a wall-clock comparison. A ``user_id`` gives the storage its own
namespace: another user's checkpoints answer as unknown ids do. A save takes the user's lock (before the
workflow's row, the one lock order) and is refused after the user was erased (``erase_user``) since what it
carries was read: a new lineage (no ``previous_checkpoint_id``) read nothing; one that continues a checkpoint
this storage read dates from that read (unknown, e.g. read by another process: any erasure still on record).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from agent_framework import WorkflowCheckpoint, WorkflowCheckpointException

# The framework's own checkpoint encoding (what FileCheckpointStorage uses; not re-exported by the package).
from agent_framework._workflows._checkpoint_encoding import encode_checkpoint_value
from sqlalchemy import delete, select
from sqlalchemy.dialects import postgresql, sqlite

from agent_store.agent_framework.checkpoint_payloads import decode_payload
from agent_store.db import codec, erasures, sealing, tenancy
from agent_store.db.erasures import erased_since
from agent_store.db.hosted_tables import checkpoint_binding, checkpoint_user
from agent_store.db.statements import lock_user
from agent_store.db.tables import checkpoint_workflows_t, checkpoints_t
from agent_store.errors import AgentStoreError, CheckpointRefusedError, ContentSealedError, InvalidValueError
from agent_store.run.commit import ERASURE_MARGIN
from agent_store.run.read_times import UNKNOWN, ReadTimes

if TYPE_CHECKING:
    from agent_store.store import Store

__all__ = ["StoreCheckpointStorage"]
logger = logging.getLogger("agent_store")
C, W = checkpoints_t.c, checkpoint_workflows_t.c


class StoreCheckpointStorage:
    """``CheckpointStorage`` for ``WorkflowBuilder(..., checkpoint_storage=...)`` and ``workflow.run(...)``.

    Args:
        store: the :class:`~agent_store.Store` whose database keeps the checkpoints.
        user_id: the user whose checkpoints these are (``None``: not scoped to a user).
        allowed_checkpoint_types: ``"module:qualname"`` types, beyond the framework's safe set, that a
            checkpoint may contain (as for ``FileCheckpointStorage``).
    """

    def __init__(
        self, store: Store, *, user_id: str | None = None, allowed_checkpoint_types: list[str] | None = None
    ) -> None:
        codec.check_id(user_id, "checkpoint owner")
        # The rows' owner, and the user it acts as: a hosted workflow context's collection is its user's.
        self._db, self._owner = store.db, user_id or ""
        self._user = checkpoint_user(user_id) if user_id is not None else None
        codec.check_id(self._user, "user_id")  # (no user id holds the separator of a context's name)
        self._allowed: frozenset[str] = frozenset(allowed_checkpoint_types or [])
        # Per checkpoint id, when what it carries was read from the store (the fence of saves that continue it).
        self._dated = ReadTimes()

    @tenancy.for_its("_user")
    async def save(self, checkpoint: WorkflowCheckpoint) -> str:
        """Store (or replace) a checkpoint; it becomes its workflow's latest.

        Raises:
            WorkflowCheckpointException: the checkpoint cannot be encoded, would not decode under this storage's
                allowed types, has an invalid id or name, or is over the store's ``max_value_bytes``; nothing is
                written.
        """
        ident = checkpoint.checkpoint_id
        try:
            for value, what in ((ident, "checkpoint_id"), (checkpoint.workflow_name, "workflow_name")):
                codec.check_id(value, what, required=True)
            codec.check_id(checkpoint.previous_checkpoint_id, "previous_checkpoint_id")
            codec.check_int(checkpoint.iteration_count, "iteration_count", low=0, high=codec.INT32)
            if not isinstance(checkpoint.timestamp, str) or len(checkpoint.timestamp) > 64:
                raise InvalidValueError("timestamp must be the framework's ISO 8601 text (at most 64 characters)")
            encoded = encode_checkpoint_value(checkpoint.to_dict())
            decode_payload(encoded, self._allowed)  # read back as load will: refused now, not at resume time
            # Key order kept (the framework iterates pending requests in order); NaN / Infinity refused (not JSON).
            payload = codec.dumps(
                encoded, where=f"checkpoint {ident!r}", max_bytes=self._db.settings.max_value_bytes, sort_keys=False
            )
        except CheckpointRefusedError as exc:  # what load would raise: said now, as a save's refusal
            raise WorkflowCheckpointException(
                f"Checkpoint {ident} would not be read back; refusing to save: {exc}"
            ) from exc
        except WorkflowCheckpointException:
            raise
        except InvalidValueError as exc:
            raise WorkflowCheckpointException(f"Checkpoint {ident} cannot be stored: {exc}") from exc
        except Exception as exc:  # whatever the encoder or the restricted decoder raised
            raise WorkflowCheckpointException(
                f"Checkpoint {ident} cannot be encoded or restored under this storage's allowed types; "
                "refusing to save."
            ) from exc
        # A new lineage read nothing from the store; one that continues a checkpoint carries what was read with
        # it (unknown if another storage read it: then any erasure of the user still on record fences it).
        previous = checkpoint.previous_checkpoint_id
        read_at = datetime.now(UTC) if previous is None else (self._dated.earliest(previous) or UNKNOWN)
        fence = erasures.fence(self._db, self._user, read_at - ERASURE_MARGIN, lambda: self._erased())
        if (cipher := await sealing.for_user(self._db, self._sealer, writing=True, fence=fence)) is not None:
            payload = sealing.seal_json(cipher, self._row(checkpoint.workflow_name, ident), payload)  # per-user keys
        row = {
            "user_id": self._owner, "checkpoint_id": ident, "workflow_name": checkpoint.workflow_name,
            "previous_checkpoint_id": checkpoint.previous_checkpoint_id, "timestamp": checkpoint.timestamp,
            "iteration_count": checkpoint.iteration_count, "saved_at": datetime.now(UTC), "payload": payload,
        }  # fmt: skip
        try:
            await self._write(row, read_at)
        except InvalidValueError as exc:  # a value the database refused (both backends check the same first)
            raise WorkflowCheckpointException(f"Checkpoint {ident} cannot be stored: {exc}") from exc
        self._dated.read(ident, read_at)
        return ident

    def _erased(self) -> WorkflowCheckpointException:
        return WorkflowCheckpointException(f"user {self._user!r} was erased; the checkpoint was not saved")

    async def _write(self, row: dict[str, Any], read_at: datetime) -> None:
        async with self._db.transaction(write=True, doing="saving a workflow checkpoint") as conn:
            if self._user is not None:  # erase_user takes the same lock: a save lands wholly before or after it
                await lock_user(conn, self._user, exclusive=False)
                if await erased_since(conn, self._user, read_at - ERASURE_MARGIN):
                    raise self._erased()
            insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
            first = insert(checkpoint_workflows_t).values(
                user_id=self._owner, workflow_name=row["workflow_name"], next_seq=1
            )
            counter = first.on_conflict_do_update(
                index_elements=[W.user_id, W.workflow_name], set_={"next_seq": W.next_seq + 1}
            ).returning(W.next_seq)
            row["seq"] = (await conn.execute(counter)).scalar_one()  # the row lock orders concurrent saves
            upsert = insert(checkpoints_t).values(row)
            columns = {k: upsert.excluded[k] for k in row if k not in ("user_id", "checkpoint_id")}
            await conn.execute(upsert.on_conflict_do_update(index_elements=[C.user_id, C.checkpoint_id], set_=columns))

    @tenancy.for_its("_user")
    async def load(self, checkpoint_id: str) -> WorkflowCheckpoint:
        """The checkpoint with this id.

        Raises:
            WorkflowCheckpointException: there is none with this id (for this user).
            CheckpointRefusedError: (also a ``WorkflowCheckpointException``) it may not be read back under this
                storage's allowed types, or would run a constructor; nothing of it was built.
        """
        rows, read_at = [], datetime.now(UTC)
        if _storable(checkpoint_id):  # anything else was never stored: the same answer as an unknown id
            rows = await self._read(select(*_PAYLOAD).where(*self._mine(), C.checkpoint_id == checkpoint_id))
        if not rows:
            raise WorkflowCheckpointException(f"No checkpoint found with ID {checkpoint_id}")
        return self._decode(rows[0], read_at, await sealing.for_user(self._db, self._sealer, writing=False))

    @tenancy.for_its("_user")
    async def list_checkpoints(self, *, workflow_name: str) -> list[WorkflowCheckpoint]:
        """A workflow's checkpoints, oldest first (commit order); those that no longer decode are left out."""
        read_at = datetime.now(UTC)
        rows = await self._read(self._of(workflow_name, *_PAYLOAD).order_by(C.seq))
        cipher = await sealing.for_user(self._db, self._sealer, writing=False)
        return [found for row in rows if (found := self._decode_or_skip(row, read_at, cipher)) is not None]

    @tenancy.for_its("_user")
    async def list_checkpoint_ids(self, *, workflow_name: str) -> list[str]:
        """The ids of the workflow's stored checkpoints, oldest first, read without decoding any payload.

        Unlike ``FileCheckpointStorage``, which decodes every file to list ids, an id is listed here even if its
        checkpoint does not decode under this storage's allowed types (``load`` then refuses it): listing reads
        no payload, so it never builds anything a payload names.
        """
        return [ident for (ident,) in await self._read(self._of(workflow_name, C.checkpoint_id).order_by(C.seq))]

    @tenancy.for_its("_user")
    async def get_latest(self, *, workflow_name: str) -> WorkflowCheckpoint | None:
        """The workflow's last committed checkpoint that decodes, or None."""
        read_at = datetime.now(UTC)
        ids = await self._read(self._of(workflow_name, C.checkpoint_id).order_by(C.seq.desc()))
        cipher = await sealing.for_user(self._db, self._sealer, writing=False)
        for (ident,) in ids:  # the first, unless it no longer decodes under this storage's allowed types
            rows = await self._read(select(*_PAYLOAD).where(*self._mine(), C.checkpoint_id == ident))
            if rows and (found := self._decode_or_skip(rows[0], read_at, cipher)) is not None:
                return found
        return None

    @tenancy.for_its("_user")
    async def delete(self, checkpoint_id: str) -> bool:
        """Delete one checkpoint; False if there is none with this id (for this user)."""
        if not _storable(checkpoint_id):
            return False  # never stored: no such checkpoint
        async with self._db.transaction(write=True, doing="deleting a workflow checkpoint") as conn:
            done = await conn.execute(delete(checkpoints_t).where(*self._mine(), C.checkpoint_id == checkpoint_id))
        return bool(done.rowcount)

    @tenancy.for_its("_user")
    async def describe(
        self, *, workflow_name: str | None = None, checkpoint_id: str | None = None
    ) -> list[dict[str, Any]]:
        """The stored rows' facts, oldest first, without decoding any payload (what the CLI shows): of one
        workflow, or one checkpoint (then with its ``payload`` as stored: the framework's encoding)."""
        columns = [C.checkpoint_id, C.workflow_name, C.seq, C.previous_checkpoint_id, C.iteration_count,
                   C.timestamp, C.saved_at]  # fmt: skip
        query = select(*columns, *([C.payload] if checkpoint_id is not None else [])).where(*self._mine())
        if workflow_name is not None:
            query = query.where(C.workflow_name == (workflow_name if _storable(workflow_name) else None))
        if checkpoint_id is not None:
            query = query.where(C.checkpoint_id == (checkpoint_id if _storable(checkpoint_id) else None))
        return [dict(row._mapping) for row in await self._read(query.order_by(C.seq))]

    @property
    def _sealer(self) -> str:
        return self._user or ""  # whose keys seal the payloads (the owner's user: db/hosted_tables.py)

    def _row(self, workflow_name: str, checkpoint_id: str) -> str:
        return checkpoint_binding(self._owner, workflow_name, checkpoint_id)

    def _mine(self) -> list[Any]:
        return [C.user_id == self._owner]

    def _of(self, workflow_name: str, *columns: Any) -> Any:
        name = workflow_name if _storable(workflow_name) else None  # never stored: matches nothing
        return select(*columns).where(*self._mine(), C.workflow_name == name)

    async def _read(self, statement: Any) -> list[Any]:
        async with self._db.transaction(write=False, doing="reading workflow checkpoints") as conn:
            return list((await conn.execute(statement)).all())

    def _decode(self, row: Any, read_at: datetime, cipher: sealing.UserCipher | None) -> WorkflowCheckpoint:
        """The checkpoint, dated: saves that continue its lineage are fenced from ``read_at``. Sealed (per-user
        keys): opened with ``cipher`` first."""
        payload, _ = sealing.open_json(cipher, self._row(row.workflow_name, row.checkpoint_id), row.payload)
        checkpoint = decode_payload(payload, self._allowed)
        self._dated.read(checkpoint.checkpoint_id, read_at)
        return checkpoint

    def _decode_or_skip(self, row: Any, read_at: datetime, cipher: Any) -> WorkflowCheckpoint | None:
        try:
            return self._decode(row, read_at, cipher)
        except (CheckpointRefusedError, ContentSealedError) as exc:
            logger.warning("a stored workflow checkpoint does not decode (allowed types, or its key): %s", exc)
            return None


_PAYLOAD = (C.payload, C.workflow_name, C.checkpoint_id)  # a payload, and what its seal is bound to


def _storable(value: Any) -> bool:
    """Whether ``value`` could be a stored id or name (others are answered as unknown, without SQL)."""
    if not isinstance(value, str):
        return False
    try:
        codec.check_id(value, "id", required=True)
        codec.dumps(value, where="id")  # NUL characters and lone surrogates are never stored
    except AgentStoreError:
        return False
    return True
