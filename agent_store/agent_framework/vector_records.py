"""What ``StoreVectorStore`` (vector_history.py) reads and writes: a history record as a stored message and back,
the listing's filters, and the provider's own vectors in an embedding profile of their own.

A record's key is its message's store id; its scope fields and stamps ride in the message's
``additional_properties[RECORD]``; its ``contents`` is derived from the message when read. The provider's vectors
(``embedding``, from its own embedding client) are kept beside the message like the store's (4 bits a dimension,
agent_message_vectors), in the profile ``agent-framework:<collection>/<dimensions>/given``: never compared with
another embedder's, deleted with their message or when its text changes.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from agent_framework import Message
from agent_framework._vector_filters import Filter, FilterGroup
from sqlalchemy import select

from agent_store.db import codec, message_rows
from agent_store.db.database import Database
from agent_store.db.tables import vectors_t
from agent_store.errors import ConfigurationError, InvalidValueError
from agent_store.models import MessageRecord

RECORD = "agent_store_record"  # where a record's scope fields and stamps ride in its message
SCOPE = ("application_id", "tenant_id", "agent_id", "source_id")
STAMPS = ("created_at", "modified_at")
FIELDS = {"id", *SCOPE, "session_id", *STAMPS, "message", "contents"}  # the provider's history definition
VECTOR = "embedding"  # the provider's vector field, when it has an embedding client
OPERATORS = ("eq", "ne", "in", "not_in")
FLOAT32_MAX = 3.4028234663852886e38  # a vector is kept as float32 before its 4 bits: beyond this it is inf


def message_of(record: Any, collection: str, *, vectors: bool, dimensions: int = 0) -> Message:
    """The stored form of one record: its message, carrying its key, session, scope and stamps."""
    if not isinstance(record, Mapping) or set(record) - {VECTOR} != FIELDS or (VECTOR in record) != vectors:
        raise InvalidValueError(f"a history record has the fields {sorted(FIELDS | ({VECTOR} if vectors else set()))}")
    codec.check_id(record["id"], "a record's id", required=True)
    codec.check_id(record["session_id"], "session_id", required=True)
    if record["id"].startswith(message_rows.NO_ID_PREFIX):
        raise InvalidValueError(f"a record's id may not start with {message_rows.NO_ID_PREFIX!r} (the store's mark)")
    for name in SCOPE:
        if not isinstance(record[name], str):
            raise InvalidValueError(f"a record's {name} must be a string, not {type(record[name]).__name__}")
    for name in STAMPS:
        if type(record[name]) is not int or not 0 <= record[name] < 2**63:
            raise InvalidValueError(f"a record's {name} must be whole nanoseconds (0 to 2**63 - 1)")
    if not isinstance(record["message"], str) or not isinstance(record["contents"], str):
        raise InvalidValueError("a record's message is the JSON of a Message, and its contents a string")
    try:
        message = Message.from_json(record["message"])
    except (AttributeError, TypeError, ValueError) as exc:
        raise InvalidValueError(f"record {record['id']!r} holds no Message: {exc}"[:300]) from exc
    if not isinstance(message.role, str) or not message.role:
        raise InvalidValueError(f"record {record['id']!r} holds a message without a role")
    if vectors:
        check_vector(record[VECTOR], dimensions)
    tag = {"collection": collection, "msgpack": not record["contents"].startswith("["),  # base64: msgpack
           "session_id": record["session_id"], **{k: record[k] for k in (*SCOPE, *STAMPS)}}  # fmt: skip
    if (own := message.additional_properties.get(message_rows.STORE_ID)) is not None:
        tag["own_store_id"] = own  # the message's own, put back when read
    message.additional_properties[message_rows.STORE_ID] = record["id"]
    message.additional_properties[RECORD] = tag
    return message


def check_vector(vector: Any, dimensions: int, what: str = f"record's {VECTOR}") -> None:
    """A record's vector: ``dimensions`` finite numbers (refused before anything of its batch is written)."""
    import math

    if isinstance(vector, str | bytes) or not isinstance(vector, Sequence) or len(vector) != dimensions or not all(
        isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and abs(x) <= FLOAT32_MAX
        for x in vector
    ):
        raise InvalidValueError(f"a {what} must be {dimensions} finite numbers (float32's range)")


def tag_of(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A stored message's record tag, or None (no tag, or not one this module wrote: never a half record)."""
    found = body.get("additional_properties", {}).get(RECORD)
    if not isinstance(found, Mapping) or not all(isinstance(found.get(k), str) for k in ("collection", *SCOPE)):
        return None
    if not isinstance(found.get("session_id"), str) or not all(type(found.get(k)) is int for k in STAMPS):
        return None
    return found


def record_of(body: Mapping[str, Any], session_id: str, collection: str) -> dict[str, Any] | None:
    """The record a stored message is, or None for a message that is not one of ``collection``'s in this session
    (a fork's copy of another session's record is not: its key names the other session)."""
    tag = tag_of(body)
    if tag is None or tag["collection"] != collection or tag["session_id"] != session_id:
        return None
    message = Message.from_dict(dict(body))
    key = message.additional_properties[message_rows.STORE_ID]
    contents = [c.to_dict() for c in plain(message).contents]
    packed = base64.b64encode(msgspec.msgpack.encode(contents)).decode("ascii") if tag.get("msgpack") else None
    contents_text = packed or msgspec.json.encode(contents).decode()  # as the provider writes it
    return {"id": key, **{k: tag[k] for k in (*SCOPE, *STAMPS)}, "session_id": session_id,
            "message": plain(message).to_json(), "contents": contents_text}  # fmt: skip


def same_record(stored: Mapping[str, Any], message: Message) -> bool:
    """Whether ``message`` (message_of's) is the record stored: its message, session and scope (its stamps may
    differ: a retry is stamped anew, and the first write's stay)."""
    tag = message.additional_properties[RECORD]
    if any(stored[k] != tag[k] for k in ("session_id", *SCOPE)):
        return False
    return bool(Message.from_json(stored["message"]).to_dict() == plain(message).to_dict())  # stored: plain already


def tagged(message: Message) -> dict[str, Any]:
    """What ``same_record`` compares, of a message ``message_of`` made."""
    tag = message.additional_properties[RECORD]
    return {"session_id": tag["session_id"], **{k: tag[k] for k in SCOPE}, "message": plain(message).to_json()}


def plain(message: Message) -> Message:
    """``message`` without what the store added to it (the record's key and tag; its own store id put back)."""
    bare = Message.from_dict(message.to_dict())
    tag = bare.additional_properties.pop(RECORD, None)
    bare.additional_properties.pop(message_rows.STORE_ID, None)
    if isinstance(tag, Mapping) and "own_store_id" in tag:
        bare.additional_properties[message_rows.STORE_ID] = tag["own_store_id"]
    return bare


def session_of(expression: Any) -> str:
    """The session an ``and`` of the filter names by equality: a listing reads one session, never them all.
    Refuses an operator it does not evaluate before anything is read."""
    if expression is None:
        raise NotImplementedError("StoreVectorStore lists and searches records of one session: filter on session_id")
    check(expression)
    grouped = isinstance(expression, FilterGroup) and expression.operator == "and"
    for leaf in expression.filters if grouped else [expression]:
        if isinstance(leaf, Filter) and leaf.field_name == "session_id" and leaf.operator == "eq":
            if isinstance(leaf.value, str) and leaf.value:
                return leaf.value
    raise NotImplementedError("StoreVectorStore lists and searches records of one session: filter on session_id 'eq'")


def check(expression: Any) -> None:
    if isinstance(expression, FilterGroup):
        for item in expression.filters:
            check(item)
    elif expression.operator not in OPERATORS:
        raise NotImplementedError(f"StoreVectorStore filters by eq, ne, in and not_in, not {expression.operator!r}")


def matches(expression: Any, record: Mapping[str, Any]) -> bool:
    if isinstance(expression, FilterGroup):
        results = [matches(f, record) for f in expression.filters]
        if expression.operator == "not":
            return not results[0] if results else True
        return all(results) if expression.operator == "and" else any(results)
    value, operand = record.get(expression.field_name), expression.value
    if expression.operator == "eq":
        return bool(value == operand)
    if expression.operator == "ne":
        return bool(value != operand)
    return bool((value in list(operand)) == (expression.operator == "in"))


class GivenVectors:
    """The profile of a provider's vectors: they come with its records (its own embedding client made them)."""

    def __init__(self, collection: str, dimensions: int) -> None:
        from agent_store.search.embedders import EmbeddingProfile  # numpy: a MissingExtraError without it
        from agent_store.search.vectors import GIVEN

        self.profile = EmbeddingProfile(f"agent-framework:{collection}", dimensions, GIVEN)

    async def embed(self, texts: Sequence[str]) -> Any:
        raise ConfigurationError("a provider's vectors come with its records: nothing here embeds")


async def write_vectors(embeddings: Any, rows: Sequence[MessageRecord], vectors: Sequence[Any]) -> None:
    """The records' vectors (checked by ``message_of``) beside their messages, each only while its message holds
    the text it was stored with (the backfill's own write, search/vectors.py)."""
    import numpy as np

    from agent_store.search.embedders import pack  # first: names a missing extra

    if not rows:
        return
    pid = await embeddings.profile_id(create=True)
    await embeddings._write(pid, list(rows), pack(np.asarray(vectors, np.float32)))


async def ranked(db: Database, embeddings: Any, session_id: str, vector: Sequence[float]) -> list[tuple[int, float]]:
    """(seq, cosine similarity) of the session's messages with a vector in the profile, best first."""
    import numpy as np

    from agent_store.search.embedders import unit, unpack  # first: names a missing extra

    pid = await embeddings.profile_id(create=False)
    if pid is None:
        return []
    V = vectors_t.c
    async with db.transaction(write=False, replica=True, doing="ranking history records") as conn:
        rows = (await conn.execute(select(V.seq, V.vec).where(V.session_id == session_id, V.profile_id == pid))).all()
    if not rows:
        return []
    query = unit(np.asarray([vector], np.float32))[0]
    scores = unpack([r.vec for r in rows], embeddings.embedder.profile.dimensions) @ query
    return sorted(((rows[i].seq, float(scores[i])) for i in range(len(rows))), key=lambda pair: -pair[1])
