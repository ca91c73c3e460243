"""The framework's vector-store seam over agent_store's tables (issue 40): ``VectorStoreHistoryProvider`` runs on
``StoreVectorStore``, and its records are the store's own messages, never a copy of them.

The provider owns its records' shape: an id it derives, scope fields (application, tenant, agent, source,
session), nanosecond stamps, the message's JSON and its contents again. Here a record *is* a stored message:
- its id is the message's store id (``additional_properties["agent_store_id"]``, the ``message_id`` column), so
  a retried save stores nothing twice;
- its scope fields and stamps ride in the message's ``additional_properties["agent_store_record"]``, with the
  collection's name (sealed with the message under per-user keys);
- ``session_id`` is the agent_store session (created for the store's user on first write), and ``contents`` is
  derived from the message when read.

Writes go through a run's commit, one transaction per session in a batch (Run.unloaded: the erasure fence,
per-user keys, row-level security's name). Reads are the user's: another user's session reads as empty.

Refused, with a typed error, never done silently:
- a definition other than the provider's history records, or one with vectors (``embedding_generator``):
  search goes through ``store.search`` and ``SearchHistoryProvider`` (hybrid), whose vectors the store keeps;
- listing records without a ``session_id`` equality in the filter (a scan of every session);
- an upsert whose message differs from the stored one under the same id (history is written once);
- a delete that is not a session's whole history (the provider's ``clear`` of a session it alone wrote).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import msgspec
from agent_framework import AgentSession, Message
from agent_framework._vector_filters import Filter, FilterGroup
from agent_framework._vectors import BaseVectorCollection, BaseVectorStore, VectorStoreCollectionDefinition

from agent_store.db import codec, message_rows, tenancy
from agent_store.errors import ConfigurationError, InvalidValueError, SessionNotFoundError
from agent_store.operations import lifecycle
from agent_store.run.commit import Run

if TYPE_CHECKING:
    from agent_store.store import Store

__all__ = ["StoreHistoryCollection", "StoreVectorStore"]
RECORD = "agent_store_record"  # where a record's scope fields and stamps ride in its message
SCOPE = ("application_id", "tenant_id", "agent_id", "source_id")
STAMPS = ("created_at", "modified_at")
FIELDS = {"id", *SCOPE, "session_id", *STAMPS, "message", "contents"}  # the provider's history definition
PAGE = 1000


class StoreVectorStore(BaseVectorStore):
    """A ``BaseVectorStore`` whose collections hold ``user_id``'s history records in the store's tables."""

    def __init__(self, store: Store, *, user_id: str | None) -> None:
        codec.check_id(user_id, "user_id")
        super().__init__()
        self.store, self.user_id = store, user_id

    def get_collection(
        self, record_type: type[Any], *, definition: VectorStoreCollectionDefinition | None = None,
        collection_name: str | None = None, embedding_generator: Any = None,
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
                names.update(str(r[RECORD]["collection"]) for r in await self._tagged(info.id))
            if (cursor := page.next_cursor) is None:
                return sorted(names)

    async def _inner_ensure_collection_deleted(
        self, collection_name: str, *, operation_options: Mapping[str, Any] | None = None
    ) -> None:
        raise NotImplementedError("agent_store deletes history by session: store.delete(session_id) or clear()")

    async def _tagged(self, session_id: str) -> list[dict[str, Any]]:
        """Every message of ``session_id`` that is a record of some collection: its body, in the stored order."""
        out, after = [], -1
        while True:
            try:
                rows = await self.store.messages(session_id, user_id=self.user_id, after_seq=after, limit=PAGE)
            except SessionNotFoundError:  # no such session, or another user's: no records
                return []
            out += [r.body["additional_properties"] for r in rows if _tag(r.body) is not None]
            if len(rows) < PAGE:
                return out
            after = rows[-1].seq


def _tag(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    found = body.get("additional_properties", {}).get(RECORD)
    return found if isinstance(found, Mapping) else None


class StoreHistoryCollection(BaseVectorCollection[str, Any]):
    """One collection of the framework's history records (see the module's text)."""

    def __init__(self, vectors: StoreVectorStore, record_type: type[Any], **kwargs: Any) -> None:
        super().__init__(record_type, **kwargs)
        names = set(self.definition.names)
        if self.definition.vector_fields:
            raise ConfigurationError(
                "StoreVectorStore keeps no provider vectors: search history with store.search or "
                "SearchHistoryProvider (hybrid, with the store's embedder), not a provider embedding_generator"
            )
        if names != FIELDS or self.definition.key_field.name != "id":
            raise ConfigurationError(f"StoreVectorStore holds the framework's history records, not {sorted(names)}")
        codec.check_id(self.collection_name, "collection_name", required=True)
        self.vectors, self.store, self.user_id = vectors, vectors.store, vectors.user_id

    async def ensure_collection_exists(self, *, operation_options: Mapping[str, Any] | None = None) -> None:
        return None  # its tables are the store's, made by its migrations

    async def collection_exists(self, *, operation_options: Mapping[str, Any] | None = None) -> bool:
        return True

    async def ensure_collection_deleted(self, *, operation_options: Mapping[str, Any] | None = None) -> None:
        await self.vectors._inner_ensure_collection_deleted(self.collection_name)

    async def _inner_upsert(
        self, records: Sequence[Any], *, operation_options: Mapping[str, Any] | None = None
    ) -> Sequence[str]:
        by_session: dict[str, list[Message]] = {}
        for record in records:
            message = self._message(record)
            by_session.setdefault(record["session_id"], []).append(message)
        stored = {r["id"]: r for r in await self._by_keys([str(r["id"]) for r in records])}
        for session_id, messages in by_session.items():
            new = [m for m in messages if not self._same_as_stored(m, stored)]
            if new:
                run = Run.unloaded(self.store.db, AgentSession(session_id=session_id), user_id=self.user_id,
                                   read_at=datetime.now(UTC))  # fmt: skip
                run.add_messages(new)
                await run.commit()
        return [str(r["id"]) for r in records]

    def _message(self, record: Any) -> Message:
        """The stored form of one record: its message, carrying its id, scope and stamps."""
        if not isinstance(record, Mapping) or set(record) - {"embedding"} != FIELDS:
            raise InvalidValueError(f"a history record has the fields {sorted(FIELDS)}")
        codec.check_id(record["id"], "a record's id", required=True)
        codec.check_id(record["session_id"], "session_id", required=True)
        for name in SCOPE:
            if not isinstance(record[name], str):
                raise InvalidValueError(f"a record's {name} must be a string, not {type(record[name]).__name__}")
        for name in STAMPS:
            if not isinstance(record[name], int) or isinstance(record[name], bool):
                raise InvalidValueError(f"a record's {name} must be whole nanoseconds")
        if not isinstance(record["message"], str):
            raise InvalidValueError("a record's message must be the JSON of a Message")
        try:
            message = Message.from_json(record["message"])
        except (TypeError, ValueError) as exc:
            raise InvalidValueError(f"record {record['id']!r} holds no Message: {exc}") from exc
        message.additional_properties[message_rows.STORE_ID] = record["id"]
        packed = not str(record["contents"]).startswith("[")  # the provider's msgpack contents are base64
        message.additional_properties[RECORD] = {"collection": self.collection_name, "msgpack": packed,
                                                 **{k: record[k] for k in (*SCOPE, *STAMPS)}}  # fmt: skip
        return message

    def _same_as_stored(self, message: Message, stored: Mapping[str, dict[str, Any]]) -> bool:
        """Whether the record is stored already (a retry); refused when its message differs (written once)."""
        key = message.additional_properties[message_rows.STORE_ID]
        if key not in stored:
            return False
        if _plain(Message.from_json(stored[key]["message"])).to_dict() != _plain(message).to_dict():
            raise InvalidValueError(f"record {key!r} is stored with another message: agent_store writes history once")
        return True

    async def _inner_get(
        self, *, keys: Sequence[str] | None = None, filter: Any = None, top: int = 10, skip: int = 0,
        order_by: Mapping[str, bool] | None = None, include_vectors: bool = False,
        operation_options: Mapping[str, Any] | None = None,
    ) -> Sequence[Any] | None:  # fmt: skip
        if keys is not None:
            return await self._by_keys([str(k) for k in keys])
        session_id = _session_of(filter)
        _check(filter)
        every = [self._record(b, session_id) for b in await self._bodies(session_id)]
        found = [r for r in every if r is not None and _matches(filter, r)]
        for name, ascending in reversed(list((order_by or {"created_at": True, "id": True}).items())):
            if name not in FIELDS:
                raise ValueError(f"order field {name!r} is not a history record's")
            found.sort(key=itemgetter(name), reverse=not ascending)
        return found[skip : skip + top]

    async def _bodies(self, session_id: str) -> list[dict[str, Any]]:
        out, after = [], -1
        while True:
            try:
                rows = await self.store.messages(session_id, user_id=self.user_id, after_seq=after, limit=PAGE)
            except SessionNotFoundError:  # no such session (yet), or another user's: no records
                return []
            out += [r.body for r in rows]
            if len(rows) < PAGE:
                return out
            after = rows[-1].seq

    def _record(self, body: dict[str, Any], session_id: str) -> dict[str, Any] | None:
        """The record a stored message is, or None for a message that is not one of this collection's."""
        tag = _tag(body)
        if tag is None or tag.get("collection") != self.collection_name:
            return None
        message = Message.from_dict(body)
        key = message.additional_properties[message_rows.STORE_ID]
        plain = _plain(message)
        contents = [c.to_dict() for c in plain.contents]
        packed = base64.b64encode(msgspec.msgpack.encode(contents)).decode("ascii") if tag.get("msgpack") else None
        return {"id": key, **{k: tag[k] for k in (*SCOPE, *STAMPS)}, "session_id": session_id,
                "message": plain.to_json(), "contents": packed or json.dumps(contents)}  # fmt: skip

    async def _by_keys(self, keys: list[str]) -> list[dict[str, Any]]:
        if not keys:
            return []
        for key in keys:
            codec.check_id(key, "a record's id", required=True)
        with tenancy.acting_as(self.user_id):
            rows = await lifecycle.messages_by_ids(self.store.db, self.user_id, keys)
        found = [self._record(r.body, r.session_id) for r in rows]
        return [r for r in found if r is not None]

    async def _inner_delete(self, keys: Sequence[str], *, operation_options: Mapping[str, Any] | None = None) -> None:
        rows = await self._by_keys([str(k) for k in keys])
        by_session: dict[str, set[str]] = {}
        for row in rows:
            by_session.setdefault(row["session_id"], set()).add(row["id"])
        for session_id, wanted in by_session.items():
            await lifecycle.clear(self.store.db, session_id, self.user_id, only=frozenset(wanted))


def _plain(message: Message) -> Message:
    """``message`` without what the store added to it (its id and the record's tag)."""
    plain = Message.from_dict(message.to_dict())
    plain.additional_properties.pop(RECORD, None)
    plain.additional_properties.pop(message_rows.STORE_ID, None)
    return plain


def _session_of(expression: Any) -> str:
    """The session an ``and`` of the filter names by equality: a listing reads one session, never them all."""
    grouped = isinstance(expression, FilterGroup) and expression.operator == "and"
    leaves = expression.filters if grouped else [expression]
    for leaf in leaves:
        if isinstance(leaf, Filter) and leaf.field_name == "session_id" and leaf.operator == "eq":
            if isinstance(leaf.value, str) and leaf.value:
                return leaf.value
    raise NotImplementedError("StoreVectorStore lists records of one session: filter on session_id 'eq'")


def _check(expression: Any) -> None:
    """Refuse an operator the listing does not evaluate, before anything is read."""
    if isinstance(expression, FilterGroup):
        for item in expression.filters:
            _check(item)
    elif expression.operator not in ("eq", "ne", "in", "not_in"):
        raise NotImplementedError(f"StoreVectorStore filters by eq, ne, in and not_in, not {expression.operator!r}")


def _matches(expression: Any, record: Mapping[str, Any]) -> bool:
    if isinstance(expression, FilterGroup):
        results = [_matches(f, record) for f in expression.filters]
        if expression.operator == "not":
            return not results[0] if results else True
        return all(results) if expression.operator == "and" else any(results)
    value, operand = record.get(expression.field_name), expression.value
    if expression.operator == "eq":
        return bool(value == operand)
    if expression.operator == "ne":
        return bool(value != operand)
    return bool((value in list(operand)) == (expression.operator == "in"))

