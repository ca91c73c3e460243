"""The framework's vector-store seam over agent_store's tables (issue 40): ``VectorStoreHistoryProvider`` runs on
``StoreVectorStore``, and its records are the store's own messages, never a copy of them.

The provider owns its records' shape: a key it derives, scope fields (application, tenant, agent, source,
session), nanosecond stamps, the message's JSON, its contents again, and with an embedding client a vector.
Here a record *is* a stored message (vector_records.py):
- its key is the message's store id (``additional_properties["agent_store_id"]``, the ``message_id`` column), so
  a retried save stores nothing twice;
- its scope fields and stamps ride in the message's ``additional_properties["agent_store_record"]``, with the
  collection's name (sealed with the message under per-user keys);
- ``session_id`` is the agent_store session (created for the store's user on first write), and ``contents`` is
  derived from the message when read;
- its vector, if any, is kept beside the message at 4 bits a dimension in a profile of the collection's own.

Writes go through a run's commit, one transaction per session in a batch (Run.unloaded: the erasure fence,
per-user keys, row-level security's name); the vectors follow in a short transaction of their own, never in the
commit (the store's rule), and a retried save writes a vector that is missing. Reads are the user's: another
user's session reads as empty.

Refused, with a typed error, never done silently:
- a definition other than the provider's history records;
- vectors in a store with per-user keys or a message cipher (a vector gives its text away);
- listing or searching without a ``session_id`` equality in the filter (a scan of every session);
- an upsert whose message differs from the stored one under the same key (history is written once);
- a delete that is not a session's whole history (the provider's ``clear`` of a session it alone wrote);
- vectors given back (``include_vectors``): they are kept at 4 bits, not as given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from operator import itemgetter
from typing import TYPE_CHECKING, Any, ClassVar

from agent_framework import AgentSession, Message
from agent_framework._vectors import BaseVectorCollection, BaseVectorSearch, BaseVectorStore, SearchResults

from agent_store.agent_framework import vector_records as records
from agent_store.db import codec, tenancy
from agent_store.errors import ConfigurationError, InvalidValueError, SessionNotFoundError
from agent_store.models import MessageRecord
from agent_store.operations import lifecycle
from agent_store.run.commit import Run
from agent_store.run.read_times import ReadTimes
from agent_store.search.vectors import Embeddings

if TYPE_CHECKING:
    from agent_store.store import Store

__all__ = ["StoreHistoryCollection", "StoreVectorStore"]
PAGE = 1000


class StoreVectorStore(BaseVectorStore):
    """A ``BaseVectorStore`` whose collections hold ``user_id``'s history records in the store's tables."""

    def __init__(self, store: Store, *, user_id: str | None) -> None:
        codec.check_id(user_id, "user_id")
        super().__init__()
        self.store, self.user_id = store, user_id
        self.reads = ReadTimes()  # each session's earliest read here: a save dates from it (the erasure fence)

    def get_collection(
        self, record_type: type[Any], *, definition: Any = None, collection_name: str | None = None,
        embedding_generator: Any = None,
    ) -> StoreHistoryCollection:  # fmt: skip
        return StoreHistoryCollection(self, record_type, definition=definition, collection_name=collection_name,
                                      embedding_generator=embedding_generator)  # fmt: skip

    async def list_collection_names(self, *, operation_options: Mapping[str, Any] | None = None) -> Sequence[str]:
        """The names records were written under, read through every session of the user (a scan)."""
        names: set[str] = set()
        cursor = None
        while True:
            page = await self.store.list_sessions(user_id=self.user_id, cursor=cursor, limit=200)
            for info in page.items:
                for row in await stored_rows(self, info.id):
                    if (tag := records.tag_of(row.body)) is not None:
                        names.add(str(tag["collection"]))
            if (cursor := page.next_cursor) is None:
                return sorted(names)

    async def _inner_ensure_collection_deleted(
        self, collection_name: str, *, operation_options: Mapping[str, Any] | None = None
    ) -> None:
        raise NotImplementedError("agent_store deletes history by session: store.delete(session_id) or clear()")


async def stored_rows(vectors: StoreVectorStore, session_id: str) -> list[MessageRecord]:
    """Every message of the user's session ``session_id`` (none for another user's, or no such session)."""
    out, after = [], -1
    while True:
        try:
            rows = await vectors.store.messages(session_id, user_id=vectors.user_id, after_seq=after, limit=PAGE)
        except SessionNotFoundError:
            return []
        out += rows
        if len(rows) < PAGE:
            return out
        after = rows[-1].seq


class StoreHistoryCollection(BaseVectorCollection[str, Any], BaseVectorSearch[str, Any]):
    """One collection of the framework's history records (see the module's text)."""

    supported_search_types: ClassVar[set[Any]] = {"vector"}

    def __init__(self, vectors: StoreVectorStore, record_type: type[Any], **kwargs: Any) -> None:
        super().__init__(record_type, **kwargs)
        names, fields = set(self.definition.names), self.definition.vector_fields
        if names - {records.VECTOR} != records.FIELDS or self.definition.key_field.name != "id" or (
            fields and (fields[0].name != records.VECTOR or fields[0].distance_function != "cosine_similarity")
        ):
            raise ConfigurationError(f"StoreVectorStore holds the framework's history records, not {sorted(names)}")
        codec.check_id(self.collection_name, "collection_name", required=True)
        self.vectors, self.store, self.user_id = vectors, vectors.store, vectors.user_id
        self.embeddings: Embeddings | None = None
        self.dimensions = int(fields[0].dimensions or 0) if fields else 0
        if fields:
            if self.store.db.settings.message_cipher or self.store.db.settings.keys:
                raise ConfigurationError("a store with keys or a message_cipher keeps no vectors: they give text away")
            given = records.GivenVectors(self.collection_name, self.dimensions)
            self.embeddings = Embeddings(self.store.db, given)

    async def ensure_collection_exists(self, *, operation_options: Mapping[str, Any] | None = None) -> None:
        return None  # its tables are the store's, made by its migrations

    async def collection_exists(self, *, operation_options: Mapping[str, Any] | None = None) -> bool:
        return True

    async def ensure_collection_deleted(self, *, operation_options: Mapping[str, Any] | None = None) -> None:
        await self.vectors._inner_ensure_collection_deleted(self.collection_name)

    async def _inner_upsert(
        self, given: Sequence[Any], *, operation_options: Mapping[str, Any] | None = None
    ) -> Sequence[str]:
        """Checks the whole batch before writing any of it; then one commit a session, and the vectors."""
        batch: dict[str, Message] = {}
        for record in given:
            message = records.message_of(record, self.collection_name, vectors=self.embeddings is not None,
                                         dimensions=self.dimensions)
            first = batch.setdefault(record["id"], message)
            if first is not message and not records.same_record(records.tagged(first), message):
                raise InvalidValueError(f"record {record['id']!r} is given twice, as two records")
        stored = await self._rows(list(batch))
        by_session: dict[str, list[Message]] = {}
        for key, message in batch.items():
            session_id = message.additional_properties[records.RECORD]["session_id"]
            here = [r for r in stored if r.message_id == key and r.session_id == session_id]
            if not here:
                by_session.setdefault(session_id, []).append(message)
                continue
            record = records.record_of(here[0].body, session_id, self.collection_name)
            if record is None:
                raise InvalidValueError(f"{key!r} is a message of session {session_id!r} but not a record of "
                                        f"collection {self.collection_name!r}: keys are one a session")  # fmt: skip
            if not records.same_record(record, message):
                raise InvalidValueError(f"record {key!r} is stored as another record: agent_store writes history once")
        for session_id, new in by_session.items():  # dated from this process's first read of it (the fence)
            run = Run.unloaded(self.store.db, AgentSession(session_id=session_id), user_id=self.user_id,
                               read_at=self.vectors.reads.earliest(session_id))  # fmt: skip
            run.add_messages(new)
            await run.commit()
        if self.embeddings is not None:  # after the commit, as the store's backfill: a retry writes what is missing
            rows = {(r.session_id, r.message_id): r for r in await self._rows(list(batch))}
            keep = [(rows[(r["session_id"], r["id"])], r[records.VECTOR]) for r in given
                    if (r["session_id"], r["id"]) in rows]  # fmt: skip
            with tenancy.acting_as(self.user_id):
                await records.write_vectors(self.embeddings, [r for r, _ in keep], [v for _, v in keep])
        return [str(r["id"]) for r in given]

    async def _inner_get(
        self, *, keys: Sequence[str] | None = None, filter: Any = None, top: int = 10, skip: int = 0,
        order_by: Mapping[str, bool] | None = None, include_vectors: bool = False,
        operation_options: Mapping[str, Any] | None = None,
    ) -> Sequence[Any] | None:  # fmt: skip
        if include_vectors:
            raise NotImplementedError("StoreVectorStore keeps vectors at 4 bits: it does not give them back")
        if keys is not None:
            return await self._by_keys([str(k) for k in keys])
        found = [record for _, record in await self._listed(filter)]
        for name, ascending in reversed(list((order_by or {"created_at": True, "id": True}).items())):
            if name not in records.FIELDS:
                raise ValueError(f"order field {name!r} is not a history record's")
            if not isinstance(ascending, bool):
                raise TypeError(f"order direction for field {name!r} must be a boolean")
            found.sort(key=itemgetter(name), reverse=not ascending)
        return found[skip : skip + top]

    async def _listed(self, expression: Any) -> list[tuple[int, dict[str, Any]]]:
        """(seq, record) of the records of the one session ``expression`` names that it admits, in stored order."""
        session_id = records.session_of(expression)
        self.vectors.reads.read(session_id, datetime.now(UTC))  # what a later save carries was read from here on
        rows = await stored_rows(self.vectors, session_id)
        every = [(r.seq, records.record_of(r.body, session_id, self.collection_name)) for r in rows]
        return [(seq, r) for seq, r in every if r is not None and records.matches(expression, r)]

    async def _inner_search(
        self, *, search_type: Any, filter: Any = None, values: Any = None, vector: Any = None, top: int = 3,
        skip: int = 0, include_vectors: bool = False, vector_property_name: str | None = None,
        additional_property_name: str | None = None, score_threshold: float | None = None,
        operation_options: Mapping[str, Any] | None = None,
    ) -> SearchResults[Any]:  # fmt: skip
        """The session's records by cosine similarity to ``vector`` (as stored: 4 bits a dimension), best first;
        ``score_threshold`` keeps those at or above it."""
        if self.embeddings is None or vector is None or search_type != "vector":
            raise NotImplementedError("StoreVectorStore searches by vector a collection that has vectors")
        if include_vectors:
            raise NotImplementedError("StoreVectorStore keeps vectors at 4 bits: it does not give them back")
        records.check_vector(vector, self.dimensions, "query vector")
        if not any(vector):
            raise InvalidValueError("a query vector of zeros has no direction to rank by")
        listed = dict(await self._listed(filter))  # seq -> record, of the user's own session (or nothing)
        if not listed:
            return SearchResults([])
        with tenancy.acting_as(self.user_id):
            ranking = await records.ranked(self.store.db, self.embeddings, records.session_of(filter), vector)
        scored = [(listed[seq], score) for seq, score in ranking
                  if seq in listed and (score_threshold is None or score >= score_threshold)]  # fmt: skip
        return SearchResults([{"record": r, "score": s} for r, s in scored[skip : skip + top]])

    def _get_record_from_result(self, result: Any) -> Any:
        return result["record"]

    def _get_score_from_result(self, result: Any) -> float | None:
        return float(result["score"])

    async def _rows(self, keys: list[str]) -> list[Any]:
        for key in keys:
            codec.check_id(key, "a record's id", required=True)
        if not keys:
            return []
        return await lifecycle.messages_by_ids(self.store.db, self.user_id, keys)

    async def _by_keys(self, keys: list[str]) -> list[dict[str, Any]]:
        found = [records.record_of(r.body, r.session_id, self.collection_name) for r in await self._rows(keys)]
        return [r for r in found if r is not None]

    async def _inner_delete(self, keys: Sequence[str], *, operation_options: Mapping[str, Any] | None = None) -> None:
        by_session: dict[str, set[str]] = {}
        for row in await self._by_keys([str(k) for k in keys]):
            by_session.setdefault(row["session_id"], set()).add(row["id"])
        for session_id, wanted in by_session.items():
            await lifecycle.clear(self.store.db, session_id, self.user_id, only=frozenset(wanted))
