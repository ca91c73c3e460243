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
from datetime import date, datetime, timedelta
from typing import Any

# The framework keeps its state-type registry private; these two dicts are what register_state_type fills.
# tests/test_codec.py pins that they still exist and behave, so a framework change fails loudly here.
from agent_framework._sessions import _STATE_CLASS_REGISTRY, _STATE_TYPE_REGISTRY

from agent_store.db.tables import ID_MAX
from agent_store.errors import InvalidValueError

_TAGS = frozenset({"$datetime", "$date", "$tuple", "$state", "$dict", "$sealed"})  # ($sealed: db/sealing.py)
_SCALARS = (str, int, bool, type(None))
# A JSON \u0000 escape that is not itself escaped (preceded by an even number of backslashes).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

DEFAULT_MAX_VALUE_BYTES = 16 * 1024 * 1024
# How deep lists and dicts may nest in a state value or message: far beyond any real document, far below the
# depth at which Python's json (about 1,000) or a reader's parser gives up with a RecursionError of its own.
MAX_DEPTH = 100


def check_id(value: str | None, what: str, *, required: bool = False) -> None:
    """Ids are opaque, bounded, bound as SQL parameters; refuse what no backend stores faithfully."""
    if value is None and not required:
        return
    if not isinstance(value, str) or not value:
        raise InvalidValueError(f"{what} must be a non-empty string, not {value!r}")
    if len(value) > ID_MAX or "\x00" in value or (not value.isprintable() and has_surrogate(value)):
        raise InvalidValueError(f"{what} must be at most {ID_MAX} characters with no NUL or lone surrogate characters")
    if what == "user_id" and "\x1f" in value:  # a user's hosted workflow contexts are named with it (hosted_tables)
        raise InvalidValueError("user_id must not contain the character \\x1f: it names a user's checkpoints")


def has_surrogate(value: str) -> bool:
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


def service_session_json(service_session_id: Any) -> str | None:
    """A service session id as JSON text; None (no service-side conversation) as SQL NULL."""
    return None if service_session_id is None else dumps(service_session_id, where="service_session_id")


def dumps(value: Any, *, where: str, max_bytes: int = DEFAULT_MAX_VALUE_BYTES, sort_keys: bool = True) -> str:
    """Serialize an already-encoded JSON value, enforcing what every backend can store.

    Raises:
        InvalidValueError: NUL characters (PostgreSQL cannot store them), lone surrogates (not UTF-8),
            or a document larger than ``max_bytes``.
    """
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, sort_keys=sort_keys, separators=(",", ":"))
    except (TypeError, ValueError) as exc:  # a non-JSON object or NaN inside a message body
        why = "NaN or Infinity, which JSON cannot hold" if "Out of range float" in str(exc) else str(exc)
        raise InvalidValueError(f"{where}: {why}") from exc
    except RecursionError:  # a message body nested deeper than json can walk
        raise InvalidValueError(f"{where}: nested more than {MAX_DEPTH} levels deep") from None
    if text.count("[") + text.count("{") > MAX_DEPTH and depth(value) > MAX_DEPTH:  # counts: C speed, rarely true
        raise InvalidValueError(f"{where}: nested more than {MAX_DEPTH} levels deep")
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise InvalidValueError(f"{where}: text contains a NUL character (\\x00), which cannot be stored")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidValueError(f"{where}: text contains a lone surrogate, which is not valid UTF-8") from exc
    if size > max_bytes:
        raise InvalidValueError(f"{where}: {size} bytes is over the limit of {max_bytes} (Store max_value_bytes)")
    return text


def depth(value: Any) -> int:
    """How deep lists and dicts nest in a JSON value (a scalar: 0), without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, level)
            todo.extend((child, level + 1) for child in children)
    return deepest


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
        if len(active) >= MAX_DEPTH:  # ``active`` holds the containers on the path down to here
            raise InvalidValueError(f"{path[:200]}...: nested more than {MAX_DEPTH} levels deep")
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
    """Rebuild a state value stored by :func:`encode_state`.

    Raises:
        InvalidValueError: the stored value is malformed (a bad ``$datetime``, a registered type's decoder
            refusing its payload, ...): named by key, the original error as ``__cause__``.
    """
    path = f"state[{key!r}]"
    try:
        return _decode(value, path)
    except InvalidValueError:
        raise
    except Exception as exc:  # a decoder of a registered type may raise anything: say which key, keep the cause
        raise InvalidValueError(f"{path}: the stored value cannot be rebuilt ({type(exc).__name__})") from exc


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


__all__ = [
    "DEFAULT_MAX_VALUE_BYTES",
    "check_id",
    "check_int",
    "check_ttl",
    "decode_state",
    "dumps",
    "encode_state",
]
