"""Agent Framework objects <-> JSON rows, with one documented rule set and no silent conversions.

State values (one row per top-level key of ``AgentSession.state``) are stored as JSON:

- ``None``, ``bool``, ``int``, ``str``, finite ``float``, ``list`` and ``dict`` with string keys: as themselves.
- ``datetime`` -> ``{"$datetime": "<ISO 8601>"}``, ``date`` -> ``{"$date": ...}``, ``tuple`` -> ``{"$tuple": [...]}``:
  they come back as the same type (a naive datetime stays naive, an aware one keeps its offset).
- Types registered with ``agent_framework.register_state_type`` (``Message`` is) ->
  ``{"$state": {"type": "<type id>", ...payload}}``, rebuilt by the registered decoder.
- A plain dict whose only key is one of those ``$`` tags is wrapped as ``{"$dict": {...}}``, so user data
  never turns into another type by accident (a dict with ``"type": "message"`` stays a dict).
- Anything else (sets, bytes, NaN/Infinity, custom objects, non-string keys, cycles, strings holding NUL
  or lone surrogates) raises :class:`InvalidValueError` naming the key and the path inside it.

Messages are stored as ``Message.to_dict()`` plus columns extracted for SQL (role, author, plain text).
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any, Protocol

from agent_framework import Content, Message

# The framework keeps its state-type registry private; these two dicts are what register_state_type fills.
# tests/test_codec.py pins that they still exist and behave, so a framework change fails loudly here.
from agent_framework._sessions import _STATE_CLASS_REGISTRY, _STATE_TYPE_REGISTRY

from .errors import InvalidValueError
from .tables import ID_MAX

_TAGS = frozenset({"$datetime", "$date", "$tuple", "$state", "$dict"})
_SCALARS = (str, int, bool, type(None))
# A JSON \u0000 escape that is not itself escaped (preceded by an even number of backslashes).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

DEFAULT_MAX_VALUE_BYTES = 16 * 1024 * 1024


def check_id(value: str | None, what: str, *, required: bool = False) -> None:
    """Ids are opaque, bounded, bound as SQL parameters; refuse what no backend stores faithfully."""
    if value is None and not required:
        return
    if not isinstance(value, str) or not value:
        raise InvalidValueError(f"{what} must be a non-empty string, not {value!r}")
    if len(value) > ID_MAX or "\x00" in value or (not value.isprintable() and _has_surrogate(value)):
        raise InvalidValueError(f"{what} must be at most {ID_MAX} characters with no NUL or lone surrogate characters")


def _has_surrogate(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


INT32 = 2**31
INT64 = 2**63


def check_int(value: Any, what: str, *, low: int, high: int) -> None:
    """An int (not a bool) in ``[low, high)``: what every backend's integer columns hold."""
    if type(value) is not int or not low <= value < high:
        raise InvalidValueError(f"{what} must be an int from {low} to {high - 1}, not {value!r}"[:300])


def check_ttl(ttl: Any, what: str) -> int | None:
    """A time-to-live as whole seconds (None: none), refused unless a timedelta from 1 s to 68 years."""
    if ttl is None:
        return None
    if not isinstance(ttl, timedelta):
        raise InvalidValueError(f"{what} must be a datetime.timedelta or None, not {type(ttl).__name__}")
    seconds = int(ttl.total_seconds())
    if not 1 <= seconds < INT32:
        raise InvalidValueError(f"{what} must be between 1 second and {INT32 - 1} seconds")
    return seconds


def dumps(value: Any, *, where: str, max_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> str:
    """Serialize an already-encoded JSON value, enforcing what every backend can store.

    Raises:
        InvalidValueError: NUL characters (PostgreSQL cannot store them), lone surrogates (not UTF-8),
            or a document larger than ``max_bytes``.
    """
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:  # a non-JSON object or NaN inside a message body
        raise InvalidValueError(f"{where}: {exc}") from exc
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise InvalidValueError(f"{where}: text contains a NUL character (\\x00), which cannot be stored")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidValueError(f"{where}: text contains a lone surrogate, which is not valid UTF-8") from exc
    if size > max_bytes:
        raise InvalidValueError(f"{where}: {size} bytes is over the limit of {max_bytes} (Store max_value_bytes)")
    return text


def encode_state(value: Any, *, key: str) -> Any:
    """Encode one state value to JSON-compatible data by the module's rules."""
    return _encode(value, f"state[{key!r}]", set())


def _encode(value: Any, path: str, active: set[int]) -> Any:
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is float:
        if not math.isfinite(value):
            raise InvalidValueError(f"{path}: {value!r} is not a finite number; JSON cannot store it")
        return value
    if kind is dict or kind is list or kind is tuple:
        if id(value) in active:
            raise InvalidValueError(f"{path}: the value contains itself (a cycle)")
        active.add(id(value))
        try:
            if kind is dict:
                return _encode_dict(value, path, active)
            items = [_encode(item, f"{path}[{i}]", active) for i, item in enumerate(value)]
            return items if kind is list else {"$tuple": items}
        finally:
            active.discard(id(value))
    if kind is datetime:
        return {"$datetime": value.isoformat()}
    if kind is date:
        return {"$date": value.isoformat()}
    registration = _STATE_CLASS_REGISTRY.get(kind)
    if registration is not None:
        payload = dict(registration.encoder(value))
        payload.pop("type", None)
        encoded = _encode_dict(payload, path, active, tag_check=False)
        return {"$state": {**encoded, "type": registration.type_id}}
    raise InvalidValueError(
        f"{path}: a {kind.__name__} cannot be stored. Storable: JSON values, datetime, date, tuple, and "
        "types registered with agent_framework.register_state_type"
    )


def _encode_dict(value: dict[Any, Any], path: str, active: set[int], *, tag_check: bool = True) -> Any:
    out: dict[str, Any] = {}
    for k, item in value.items():
        if type(k) is not str:
            raise InvalidValueError(f"{path}: key {k!r} is a {type(k).__name__}; only string keys can be stored")
        out[k] = _encode(item, f"{path}[{k!r}]", active)
    if tag_check and len(out) == 1 and next(iter(out)) in _TAGS:
        return {"$dict": out}
    return out


def decode_state(value: Any, *, key: str) -> Any:
    """Rebuild a state value stored by :func:`encode_state`."""
    return _decode(value, f"state[{key!r}]")


def _decode(value: Any, path: str) -> Any:
    if type(value) is list:
        return [_decode(item, path) for item in value]
    if type(value) is not dict:
        return value
    if len(value) == 1:
        tag, inner = next(iter(value.items()))
        if tag == "$dict":
            return {k: _decode(item, path) for k, item in inner.items()}
        if tag == "$tuple":
            return tuple(_decode(item, path) for item in inner)
        if tag == "$datetime":
            return datetime.fromisoformat(inner)
        if tag == "$date":
            return date.fromisoformat(inner)
        if tag == "$state":
            registration = _STATE_TYPE_REGISTRY.get(inner.get("type"))
            if registration is None:
                raise InvalidValueError(
                    f"{path}: stored state type {inner.get('type')!r} is not registered in this process; "
                    "import the module that calls register_state_type before loading"
                )
            payload = {k: _decode(item, path) for k, item in inner.items()}
            return registration.decoder(payload)
    return {k: _decode(item, path) for k, item in value.items()}


@dataclass(frozen=True)
class EncodedMessage:
    """One message ready for insertion: its columns, and its function calls/results as (call_id, kind, name)."""

    message_id: str
    columns: dict[str, Any]
    tools: list[tuple[str, str, str | None]]


class MessageCipher(Protocol):
    """Encrypts message content at rest (see the README's Security section): text in, text out."""

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
    body = compact_body(message.to_dict())
    if cipher is not None:  # content leaves the process encrypted; ids, roles, authors, tool names stay readable
        full = dumps(body, where=where, max_bytes=max_bytes)
        columns["text"] = ""
        columns["body"] = dumps({ENCRYPTED: cipher.encrypt(full)}, where=where, max_bytes=2**62)
    else:
        stripped = _without_columns(body, columns)
        stored = columns["body"] = dumps(stripped, where=where, max_bytes=2**62)
        # What left the body for the columns is checked here: the limit is on the message as stored.
        sizes = {n: _column_bytes(columns[n] or "", where) for n in ("message_id", "role", "author_name", "text")}
        size = len(stored.encode()) + (sizes["text"] if TEXT_FROM_COLUMN in stripped else 0)
        if size > max_bytes:
            raise InvalidValueError(f"{where}: {size} bytes is over the limit of {max_bytes} (Store max_value_bytes)")
    return EncodedMessage(identity, columns, tools)


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
        return plain_body(body, cipher)
    filled = dict(body)
    if filled.pop(TEXT_FROM_COLUMN, None) is not None:
        filled["contents"] = [{"type": "text", "text": text, "additional_properties": {}}]
    filled.setdefault("type", "message")
    filled.setdefault("role", role)
    filled.setdefault("message_id", message_id)
    if author_name is not None:
        filled.setdefault("author_name", author_name)
    filled["additional_properties"] = {**filled.get("additional_properties", {}), STORE_ID: message_id}
    return _expand(filled)


# Where a message carries the store's own identity. A provider's ``message_id`` (a completion id, reused by
# some servers) is kept as data and never decides whether a message is new, stored, or the same as another.
STORE_ID = "agent_store_id"


def store_id(message: Message) -> str:
    """The store's id of ``message``, given the first time agent_store sees it (and kept on the object).

    A message with no ``message_id`` also gets this id as its ``message_id``, so the framework's own
    de-duplication tells two identical turns apart.
    """
    identity = message.additional_properties.get(STORE_ID)
    if not isinstance(identity, str):
        identity = uuid.uuid4().hex
        message.additional_properties[STORE_ID] = identity
    if message.message_id is None:
        message.message_id = identity
    return identity


def message_from_row(
    body: Mapping[str, Any], cipher: MessageCipher | None, *, identity: str, role: str, author_name: str | None,
    text: str,
) -> Message:  # fmt: skip
    """Rebuild a ``Message`` from its row: the stored body (decrypted if need be) and the columns it leaves out."""
    full = full_body(body, cipher, message_id=identity, role=role, author_name=author_name, text=text)
    message = Message.from_dict(dict(full))
    message.additional_properties[STORE_ID] = identity
    return message


def plain_body(body: Mapping[str, Any], cipher: MessageCipher | None) -> Mapping[str, Any]:
    """The message's full ``to_dict()``: decrypted if stored encrypted, derived parts put back."""
    if ENCRYPTED in body:
        if cipher is None:
            raise InvalidValueError("this message is stored encrypted: open the Store with its message_cipher")
        body = json.loads(cipher.decrypt(body[ENCRYPTED]))
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
