"""A stored message: its row's columns, its body (``Message.to_dict()`` without what the columns hold), and back.

The rules of what a body may hold (JSON, no NUL, valid UTF-8, the size limit) are codec.py's; this module
decides what goes into which column, what the body leaves out, and how a ``Message`` is rebuilt from a row.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

from agent_framework import Content, Message

from agent_store.db import ids, sealing
from agent_store.db.codec import MAX_DEPTH, dumps
from agent_store.errors import InvalidValueError


@dataclass(frozen=True)
class EncodedMessage:
    """One message ready for insertion: its columns, and its function calls/results as (call_id, kind, name)."""

    message_id: str
    columns: dict[str, Any]
    tools: list[tuple[str, str, str | None]]


class MessageCipher(Protocol):
    """Encrypts message content at rest (see docs/reliability.md, Security): text in, text out."""

    def encrypt(self, plaintext: str) -> str: ...

    def decrypt(self, token: str) -> str: ...


ENCRYPTED = "$encrypted"


def message_record(
    message: Message, *, max_bytes: int, tool_names: dict[str, str], cipher: MessageCipher | None = None
) -> EncodedMessage:
    """The rows for one message; its row's ``message_id`` is the store's own id (see :func:`store_id`).

    The id is written back onto the in-memory message so a retried commit, and the framework's own
    de-duplication, see the same identity. ``tool_names`` maps call ids to names seen so far (it is updated),
    so a function result's row can carry the name of the tool that produced it.
    """
    if not isinstance(message, Message):
        raise InvalidValueError(f"history holds a {type(message).__name__}, not an agent_framework.Message")
    identity = store_id(message)
    where = f"message {message.message_id or identity!r}"
    tools: list[tuple[str, str, str | None]] = []
    for content in message.contents:
        if content.type == "function_call" and content.call_id:
            tool_names[content.call_id] = content.name or ""
            tools.append((content.call_id, "call", content.name))
        elif content.type == "function_result" and content.call_id:
            tools.append((content.call_id, "result", tool_names.get(content.call_id)))
    # One row per call id and message: a message that holds a call and its result (or one id twice) is whole
    # by itself, and its first mention is what the window-widening index needs.
    first: dict[str, tuple[str, str, str | None]] = {}
    for row in tools:
        first.setdefault(row[0], row)
    tools = list(first.values())
    columns = {"message_id": identity, "role": str(message.role), "author_name": message.author_name,
               "text": message.text or ""}  # fmt: skip
    try:
        body = compact_body(message.to_dict())
    except RecursionError:  # the framework's to_dict() walks it recursively: refuse it here, typed
        raise InvalidValueError(f"{where}: nested more than {MAX_DEPTH} levels deep") from None
    if isinstance(extra := body.get("additional_properties"), dict):
        for key in MARK_KEYS:
            extra.pop(key, None)  # in their own columns
    columns.update(mark_columns(marks_of(message), where=where, max_bytes=max_bytes), pos=None)
    if body.get("id") == identity:
        del body["id"]  # the de-duplication handle store_id() gave it, not data
    for name in ("message_id", "role", "author_name"):  # e.g. an author_name of 5: refused by name, never str()-ed
        if columns[name] is not None and not isinstance(columns[name], str):
            raise InvalidValueError(f"{where}: {name} must be text, not {type(columns[name]).__name__}")
    if cipher is not None:  # content leaves the process encrypted; ids, roles, authors, tool names stay readable
        full = dumps(body, where=where, max_bytes=max_bytes)
        bound: Any = cipher if getattr(cipher, "binds_rows", False) else None  # per-user keys: bound to the row
        columns["text"] = bound.index_text(message.text or "") if bound else ""  # per-user keys: the blind index
        token = bound.encrypt(full, sealing.message_row(identity)) if bound else cipher.encrypt(full)
        columns["body"] = dumps({ENCRYPTED: token}, where=where, max_bytes=2**62)
    else:
        stripped = _without_columns(body, columns)
        stored = columns["body"] = dumps(stripped, where=where, max_bytes=2**62)
        # What left the body for the columns is checked here: the limit is on the message as stored.
        sizes = {n: _column_bytes(columns[n] or "", where) for n in ("message_id", "role", "author_name", "text")}
        size = len(stored.encode()) + (sizes["text"] if TEXT_FROM_COLUMN in stripped else 0)
        if size > max_bytes:
            raise InvalidValueError(f"{where}: {size} bytes is over the limit of {max_bytes} (Store max_value_bytes)")
    return EncodedMessage(identity, columns, tools)


# What the framework's compaction writes into a message's additional_properties (agent_framework._compaction):
# kept in the row's marks column, out of the body, so a compaction rewrites those columns and nothing else.
MARK_KEYS = ("_group", "_excluded", "_exclude_reason")


MESSAGE_ID_MARK = "$message_id"  # in the marks: the message's message_id, which a compaction may have given it


def has_marks(message: Message) -> bool:
    """Whether a compaction marked the message (a set test: every commit asks it of every loaded message)."""
    return not message.additional_properties.keys().isdisjoint(MARK_KEYS)


def marks_of(message: Message) -> dict[str, Any] | None:
    """The compaction marks the message carries now (None: none), with its ``message_id`` (a compaction gives
    one to messages without, ``msg_<index>``: its summaries link to them by it)."""
    extra = message.additional_properties
    marks = {k: extra[k] for k in MARK_KEYS if k in extra}
    if marks and message.message_id is not None:
        marks[MESSAGE_ID_MARK] = message.message_id
    return marks or None


# A summary's links to what it replaced (in its _group), written once, when the summary is made: kept in their
# own column (summary_of), which a load of only the included messages leaves unread (a summary of 5,000
# messages names 5,000 ids). A rewrite that does not carry them (such a load's) keeps the stored ones.
SUMMARY_LINKS = ("_summary_of_message_ids", "_summary_of_group_ids")


def mark_columns(marks: dict[str, Any] | None, *, where: str, max_bytes: int) -> dict[str, Any]:
    """The row's compaction columns for ``marks`` (``summarized_by`` is the caller's: it names a store id)."""
    if not marks:
        return {"marks": None, "excluded": False, "exclude_reason": None, "summarized_by": None, "summary_of": None}
    reason = marks.get("_exclude_reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > 255):
        raise InvalidValueError(f"{where}: _exclude_reason must be text of at most 255 characters")
    group, links = marks.get("_group"), None
    if isinstance(group, dict) and any(k in group for k in SUMMARY_LINKS):
        links = {k: group[k] for k in SUMMARY_LINKS if k in group}
        marks = {**marks, "_group": {k: v for k, v in group.items() if k not in SUMMARY_LINKS}}
    return {
        "marks": dumps(marks, where=f"{where} compaction marks", max_bytes=max_bytes),
        "excluded": bool(marks.get("_excluded", False)),
        "exclude_reason": reason,
        "summarized_by": None,
        "summary_of": None if links is None else dumps(links, where=f"{where} summary links", max_bytes=max_bytes),
    }


def with_links(marks: dict[str, Any] | None, links: dict[str, Any] | None) -> dict[str, Any] | None:
    """The marks as the framework wrote them: the summary links put back into ``_group``."""
    if not marks or not links or not isinstance(marks.get("_group"), dict):
        return marks
    return {**marks, "_group": {**marks["_group"], **links}}


def with_marks(body: Mapping[str, Any], marks: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A message's ``to_dict()`` with its compaction marks where the framework keeps them: in
    ``additional_properties`` (copies: the framework edits a mark in place, and the loaded marks are what a
    commit compares against), and the ``message_id`` a compaction gave it after it was stored."""
    if not marks:
        return body
    given = {k: dict(v) if isinstance(v, dict) else v for k, v in marks.items() if k != MESSAGE_ID_MARK}
    body = {**body, "additional_properties": {**body.get("additional_properties", {}), **given}}
    return {**body, "message_id": marks[MESSAGE_ID_MARK]} if isinstance(marks.get(MESSAGE_ID_MARK), str) else body


def summary_link(marks: dict[str, Any] | None) -> str | None:
    """The framework's ``message_id`` of the summary that replaced this message, if one did."""
    group = (marks or {}).get("_group")
    link = group.get("_summarized_by_summary_id") if isinstance(group, dict) else None
    return link if isinstance(link, str) else None


def _column_bytes(value: str, where: str) -> int:
    """The UTF-8 size of a text column's value, refusing what dumps() refuses in a JSON document."""
    if "\x00" in value:
        raise InvalidValueError(f"{where}: text contains a NUL character (\\x00), which cannot be stored")
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidValueError(f"{where}: text contains a lone surrogate, which is not valid UTF-8") from exc


# A stored body does not repeat what its row's columns hold (the id, role, author, and the text of a message that
# is one plain text): those are left out, and put back from the columns on the way out (full_body).
TEXT_FROM_COLUMN = "$text"


def _without_columns(body: dict[str, Any], columns: dict[str, Any]) -> dict[str, Any]:
    if body.get("type") == "message":
        del body["type"]
    for key, column in (("role", "role"), ("author_name", "author_name"), ("message_id", "message_id")):
        if key in body and body[key] == columns[column]:
            del body[key]
    extra = body.get("additional_properties")
    if isinstance(extra, dict):
        extra.pop(STORE_ID, None)
        if not extra:
            del body["additional_properties"]
    contents = body.get("contents")
    if isinstance(contents, list) and len(contents) == 1 and contents[0].get("type") == "text":
        only = contents[0]
        if only.get("text") == columns["text"] and set(only) <= {"type", "text", "additional_properties"}:
            if not only.get("additional_properties"):
                del body["contents"]
                body[TEXT_FROM_COLUMN] = 1
    return body


def full_body(
    body: Mapping[str, Any], cipher: MessageCipher | None, *, message_id: str, role: str, author_name: str | None,
    text: str,
) -> Mapping[str, Any]:  # fmt: skip
    """The message's full ``to_dict()`` from its row: decrypted if stored encrypted, the columns put back."""
    if ENCRYPTED in body:
        return plain_body(body, cipher, message_id)
    if getattr(cipher, "binds_rows", False):  # per-user keys seal every body: this one was put there in clear
        raise sealing.in_clear("m")
    filled = dict(body)
    if filled.pop(TEXT_FROM_COLUMN, None) is not None:
        filled["contents"] = [{"type": "text", "text": text, "additional_properties": {}}]
    filled.setdefault("type", "message")
    filled.setdefault("role", role)
    filled.setdefault("message_id", None if message_id.startswith(NO_ID_PREFIX) else message_id)
    if author_name is not None:
        filled.setdefault("author_name", author_name)
    filled["additional_properties"] = {**filled.get("additional_properties", {}), STORE_ID: message_id}
    return _expand(filled)


# Where a message carries the store's own identity. A provider's ``message_id`` (a completion id, reused by
# some servers) is kept as data and never decides whether a message is new, stored, or the same as another.
STORE_ID = "agent_store_id"
# The store's id of a message that came with no message_id starts with this: its body then holds none, and the
# message comes back with none (before 0013 such a message was given the store's id as its message_id).
NO_ID_PREFIX = "~"


def store_id(message: Message) -> str:
    """The store's id of ``message``, given the first time agent_store sees it (and kept on the object).

    A message with no ``message_id`` keeps none (the model, and a compaction's token counts, see it as the
    framework does), and gets this id as ``id``, the handle the framework's de-duplication reads when there is
    no ``message_id``: two identical turns stay two.
    """
    identity = message.additional_properties.get(STORE_ID)
    if not isinstance(identity, str):
        identity = (NO_ID_PREFIX if message.message_id is None else "") + ids.random_id()
        message.additional_properties[STORE_ID] = identity
    if message.message_id is None and getattr(message, "id", None) is None:
        give_id(message, identity)  # never sent, never stored (message_record drops it)
    return identity


# Message() takes no ``id``: out of to_dict() (which reads the instance's DEFAULT_EXCLUDE), or a session's
# to_dict() / from_dict() round trip fails; the store's id stays in additional_properties, and comes back.
_ID_HIDDEN = {*Message.DEFAULT_EXCLUDE, "id", "DEFAULT_EXCLUDE"}


def give_id(message: Message, identity: str) -> None:
    """``identity`` as ``message.id``, the handle the framework's de-duplication reads without a message_id."""
    message.id = identity  # type: ignore[attr-defined]
    message.DEFAULT_EXCLUDE = _ID_HIDDEN  # type: ignore[misc]  # (shared, never changed)


def plain_body(body: Mapping[str, Any], cipher: MessageCipher | None, message_id: str) -> Mapping[str, Any]:
    """The message's full ``to_dict()``: decrypted if stored encrypted (sealed with per-user keys: bound to its
    ``message_id``, db/sealing.py), derived parts put back."""
    if ENCRYPTED in body:
        if cipher is None:
            raise InvalidValueError("this message is stored encrypted: open the Store with its message_cipher or keys")
        token, bound = body[ENCRYPTED], cast(Any, cipher) if getattr(cipher, "binds_rows", False) else None
        body = json.loads(bound.decrypt(token, sealing.message_row(message_id)) if bound else cipher.decrypt(token))
    return _expand(body)


# A function result's to_dict() holds the result twice: as "result" and again as text "items" derived from it.
# The stored body keeps it once: "items" is replaced by this marker when it is exactly what the framework
# derives from "result", and derived again (by the framework) on the way out.
DERIVED_ITEMS = "$items"


def _derived_items(content: Mapping[str, Any]) -> Any:
    rebuilt = Content.from_function_result(call_id=content.get("call_id") or "", result=content.get("result"))
    return rebuilt.to_dict().get("items")


def compact_body(body: dict[str, Any]) -> dict[str, Any]:
    for content in body.get("contents", []):
        if content.get("type") == "function_result" and "items" in content:
            if content["items"] == _derived_items(content):
                del content["items"]
                content[DERIVED_ITEMS] = "result"
    return body


def _expand(body: Mapping[str, Any]) -> Mapping[str, Any]:
    contents = body.get("contents", [])
    if not any(DERIVED_ITEMS in c for c in contents):
        return body
    expanded = []
    for content in contents:
        if DERIVED_ITEMS in content:
            content = {k: v for k, v in content.items() if k != DERIVED_ITEMS}
            content["items"] = _derived_items(content)
        expanded.append(content)
    return {**body, "contents": expanded}
