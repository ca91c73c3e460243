"""The rows of an imported file (transfer.py), each checked by the rules the API writes by, before any is written.

An import writes rows directly, not through a run: without these checks a file could hold what no run would ever
store (a message body that is no framework message, a state value the codec cannot read back, a role that is a
number) and leave sessions that ``store.load`` cannot rebuild. Each row is checked as it is read (the error names
its line); the import is all or nothing: a refused row means nothing was written.

- Every column: the type its table declares (text as text, within its length, no NUL or lone surrogate; ints in
  range; ISO 8601 timestamps), present unless nullable or filled in by the import itself.
- Ids as ``codec.check_id`` takes them; state keys as a commit does (no ``user:``/``app:``/``temp:`` key in a session).
- A message: rebuilt from its row as ``store.load`` rebuilds it, each content of a type the framework knows with
  text fields that are text, then encoded again as a commit encodes it (``message_rows.message_record``): what cannot
  make that round trip is refused. A body stored encrypted is checked so when the store holds the cipher.
- A state value: every ``$`` tag well formed, then decoded (``codec.decode_state``) and encoded again
  (``codec.encode_state``). A ``$state`` type not registered in the importing process (the CLI registers no
  application types) is checked for its form only; loading it where the type is not registered raises
  :class:`InvalidValueError`, as for any stored value.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, date, datetime
from typing import Any, get_args, get_type_hints

from agent_framework import Content, Message

# codec.py's private state-type registry and tags: the same rules, not a copy of them.
from agent_framework._sessions import _STATE_TYPE_REGISTRY
from sqlalchemy import BigInteger, Boolean, Float, Integer, String, Table

from agent_store.db import codec, message_decode, message_rows
from agent_store.db.codec import _TAGS
from agent_store.db.cut_points import GONE
from agent_store.db.database import Settings
from agent_store.db.history_tables import branch_marks_t, message_marks_t, state_history_t
from agent_store.db.ledger import COUNT_MAX, COUNTS, PURPOSES, RUN_LOG_MAX
from agent_store.db.load_statement import POSITION_STEP
from agent_store.db.scopes import APP_PREFIX, TEMP_PREFIX, USER_PREFIX
from agent_store.db.tables import (
    ExactJsonText,
    JsonText,
    UTCDateTime,
    checkpoints_t,
    messages_t,
    runs_t,
    sessions_t,
    state_t,
    tool_calls_t,
    usage_t,
    user_state_t,
)
from agent_store.errors import InvalidValueError
from agent_store.operations import import_trees, transfer_hosted

__all__ = ["TABLES", "check_usage", "row_values"]

TABLES: dict[str, Table] = {
    "session": sessions_t, "state": state_t, "run": runs_t, "message": messages_t, "tool_call": tool_calls_t,
    "user_state": user_state_t, "checkpoint": checkpoints_t, "usage": usage_t, "mark_history": message_marks_t,
    "state_history": state_history_t, "response": import_trees.RESPONSE_LINE, "branch_mark": branch_marks_t,
    **transfer_hosted.KINDS}  # fmt: skip
# Columns the import fills in itself (fresh stamps, the session a row belongs to, the checkpoint's new seq).
_FILLED = {
    "session": {"incarnation"}, "state": {"session_id", "version"}, "run": {"session_id"},
    "message": {"session_id"}, "tool_call": {"session_id"}, "user_state": {"version"}, "checkpoint": {"seq"},
    "usage": {"session_id"}, **{kind: {"session_id"} for kind in import_trees.KINDS}}  # fmt: skip
_IDS = {
    "session": ("id", "user_id", "agent_id", "forked_from", "base_id"), "run": ("run_id",),
    "message": ("message_id", "run_id"), "mark_history": ("message_id",), "branch_mark": ("message_id",),
    "state_history": ("key",), "response": ("response_id", "user_id", "parent_id"),
    "tool_call": ("call_id",), "user_state": ("user_id",), "state": ("key",),  # "user:" is stored as key ""
    "checkpoint": ("checkpoint_id", "workflow_name", "previous_checkpoint_id"),
    "usage": ("run_id", "user_id", "app_id"),
}  # fmt: skip
# Counts and seqs no run writes below 0 (not forked_at_seq: a fork of no messages records -1; nor a cut key's).
_NON_NEGATIVE = ("seq", "next_seq", "version", "iteration_count", "messages_written", "state_keys_written",
                 "messages_in", "messages_out", "call_no")  # fmt: skip
_CONTENT_TYPES = frozenset(get_args(get_type_hints(Content.__init__)["type"]))
_CONTENT_TEXT = ("text", "protected_data", "uri", "media_type", "message", "error_code", "error_details", "call_id",
                 "name", "exception", "file_id", "vector_store_id", "image_id", "status", "stdout", "stderr",
                 "tool_name", "server_name", "id")  # fmt: skip


def row_values(kind: str, row: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """The insert values of one exported ``kind`` row, checked; :class:`InvalidValueError` says what is wrong."""
    table = TABLES[kind]
    try:
        values = columns(table, row, _FILLED.get(kind, set()))
        for name in _IDS.get(kind, ()):
            codec.check_id(values.get(name), f"{kind}.{name}", required=not table.c[name].nullable)
        for name in _NON_NEGATIVE:  # (a cut key's response row is GONE there, -1: import_trees checks where)
            if values.get(name) is not None and not (kind == "response" and values.get("seq_end") == GONE):
                codec.check_int(values[name], f"{kind}.{name}", low=0, high=codec.INT64)
        if kind == "session":
            _check_session(values, row)
        elif kind in ("state", "user_state"):
            if kind == "state" and values["key"].startswith((USER_PREFIX, APP_PREFIX, TEMP_PREFIX)):
                raise InvalidValueError(f"state key {values['key']!r}: a commit never stores such a key in a session")
            check_state_value(row.get("value"), values["key"], settings.max_value_bytes)
        elif kind == "message":
            check_message(values, row.get("body"), settings)
        elif kind == "tool_call" and values.get("kind") not in ("call", "result"):
            raise InvalidValueError(f'tool_call.kind must be "call" or "result", not {values.get("kind")!r}')
        elif kind == "usage":
            _check_usage(values)
        elif kind in import_trees.KINDS:
            import_trees.check_row(kind, values, settings.max_value_bytes)
        elif kind == "checkpoint" and not isinstance(row.get("payload"), dict):
            raise InvalidValueError("checkpoint.payload must be a JSON object (the framework's encoded checkpoint)")
    except RecursionError as exc:
        raise InvalidValueError(f"a {kind} row is nested too deeply") from exc
    return values


def _check_usage(values: dict[str, Any]) -> None:
    """A usage row as a commit writes it: a known purpose, and counts from 0 to COUNT_MAX (others go to extra)."""
    if values.get("purpose") not in PURPOSES:
        raise InvalidValueError(f"usage.purpose must be one of {', '.join(PURPOSES)}, not {values.get('purpose')!r}")
    for column in COUNTS.values():
        if values.get(column) is not None and not 0 <= values[column] < COUNT_MAX:
            raise InvalidValueError(f"usage.{column} must be from 0 to {COUNT_MAX - 1}, as a commit stores it")


def columns(table: Table, data: dict[str, Any], filled: set[str]) -> dict[str, Any]:
    """Column values for an insert, each of its column's type; JSON re-serialized with the store's own rules."""
    values = {column.name: data[column.name] for column in table.c if column.name in data}
    for column in table.c:
        value, where = values.get(column.name), f"{table.name}.{column.name}"
        if value is None:
            required = not column.nullable and column.server_default is None and column.default is None
            if required and column.name not in filled:
                raise InvalidValueError(f"{where} is missing")
        elif isinstance(column.type, (Integer, BigInteger)):
            bound = codec.INT64 if isinstance(column.type, BigInteger) else codec.INT32
            codec.check_int(value, where, low=-bound, high=bound)
        elif isinstance(column.type, UTCDateTime):
            try:
                values[column.name] = datetime.fromisoformat(value).astimezone(UTC)
            except (TypeError, ValueError) as exc:
                raise InvalidValueError(f"{where} must be an ISO 8601 timestamp, not {value!r}"[:300]) from exc
        elif isinstance(column.type, JsonText):
            exact = isinstance(column.type, ExactJsonText)  # kept as written: key order included
            values[column.name] = codec.dumps(value, where=where, sort_keys=not exact)
        elif isinstance(column.type, String):  # Text too
            _check_text(value, where, column.type.length)
        elif isinstance(column.type, Boolean) and not isinstance(value, bool):
            raise InvalidValueError(f"{where} must be true or false, not {type(value).__name__}")
        elif isinstance(column.type, Float) and (isinstance(value, bool) or not isinstance(value, int | float)
                                                 or not math.isfinite(value)):  # fmt: skip
            raise InvalidValueError(f"{where} must be a finite number, not {type(value).__name__}")
    return values


def _check_text(value: Any, where: str, length: int | None) -> None:
    if not isinstance(value, str):
        raise InvalidValueError(f"{where} must be text, not {type(value).__name__}")
    if length is not None and len(value) > length:
        raise InvalidValueError(f"{where} is longer than {length} characters")
    if "\x00" in value or codec.has_surrogate(value):
        raise InvalidValueError(f"{where} holds a NUL character or a lone surrogate, which cannot be stored")


def _check_session(values: dict[str, Any], row: dict[str, Any]) -> None:
    if not isinstance(row.get("metadata"), (dict, type(None))):  # what update() takes (None reads as {})
        raise InvalidValueError("session.metadata must be a JSON object")
    if values.get("ttl_seconds") is not None:
        codec.check_int(values["ttl_seconds"], "session.ttl_seconds", low=1, high=codec.INT32)
    if not isinstance(row.get("service_session_id"), (str, dict, type(None))):  # AgentSession's own types
        raise InvalidValueError("session.service_session_id must be text, a JSON object or null")
    values["included_from"] = None  # a hint for loads of the included (0013), never taken on trust: 0
    import_trees.carry_base_history(values, row)


def check_message(values: dict[str, Any], parsed: Any, settings: Settings) -> None:
    """A message row (its columns checked, its body as parsed from the file) that ``store.load`` rebuilds and a
    commit would store as it is (see the module docstring)."""
    where = f"message {values['message_id']!r}"
    if not isinstance(parsed, dict):
        raise InvalidValueError(f"{where}: the body must be a JSON object (a Message.to_dict())")
    if message_rows.ENCRYPTED in parsed and settings.message_cipher is None:
        if set(parsed) != {message_rows.ENCRYPTED} or not isinstance(parsed[message_rows.ENCRYPTED], str):
            raise InvalidValueError(f"{where}: an encrypted body is one {message_rows.ENCRYPTED!r} key holding text")
        return  # sealed: only a store holding the cipher can read it back (and refuses to load it without one)
    extra = parsed.get("additional_properties")
    if isinstance(extra, dict) and set(extra) & set(message_rows.MARK_KEYS):  # a run keeps them in their columns
        raise InvalidValueError(f"{where}: its body carries compaction marks, which a stored body never does")
    try:
        message = message_decode.message_from_row(parsed, settings.message_cipher, identity=values["message_id"],
                                         role=values["role"], author_name=values.get("author_name"),
                                         text=values["text"])  # fmt: skip
        check_framework_message(message, where)
        encoded = message_rows.message_record(message, max_bytes=settings.max_value_bytes, tool_names={})
    except InvalidValueError:
        raise
    except Exception as exc:  # whatever the framework's from_dict / to_dict or the cipher raised
        why = f"{where}: not a valid Agent Framework message ({type(exc).__name__}: {exc})"
        raise InvalidValueError(why[:300]) from exc
    if encoded.columns["role"] != values["role"]:
        raise InvalidValueError(f"{where}: its role column {values['role']!r} is not its body's role")
    # A compaction's marks (0013) are what load puts back; the columns must say the same, and no marks say "not
    # excluded, not summarized": a row whose columns contradict its marks would be one thing to the whole load
    # and another to load(skip_excluded=True) and the model view (issue 37).
    marks = values.get("marks")
    if marks is not None:
        marks = json.loads(marks)
        if not isinstance(marks, dict) or not set(marks) <= {*message_rows.MARK_KEYS, message_rows.MESSAGE_ID_MARK}:
            raise InvalidValueError(f"{where}: marks must be a JSON object of the compaction's keys")
    same = message_rows.mark_columns(marks, where=where, max_bytes=settings.max_value_bytes)
    if (same["excluded"], same["exclude_reason"]) != (bool(values.get("excluded")), values.get("exclude_reason")):
        raise InvalidValueError(f"{where}: excluded and exclude_reason must say what its marks say")
    if values.get("summarized_by") is not None and message_rows.summary_link(marks) is None:
        raise InvalidValueError(f"{where}: summarized_by is set, but its marks name no summary")
    links = json.loads(values["summary_of"]) if values.get("summary_of") is not None else None
    if links is not None and (not isinstance(links, dict) or not set(links) <= set(message_rows.SUMMARY_LINKS)):
        raise InvalidValueError(f"{where}: summary_of must be a JSON object of a summary's links")


def check_framework_message(message: Message, where: str) -> None:
    """Roles, authors and contents of the types the framework declares (its constructors do not check them)."""
    if not isinstance(message.role, str) or not (message.author_name is None or isinstance(message.author_name, str)):
        raise InvalidValueError(f"{where}: role and author_name must be text")
    pending = list(message.contents)
    while pending:
        content = pending.pop()
        if not isinstance(content, Content) or content.type not in _CONTENT_TYPES:
            what = getattr(content, "type", content)
            raise InvalidValueError(f"{where}: a content of an unknown type {what!r}"[:300])
        for name in _CONTENT_TEXT:
            if not isinstance(getattr(content, name, None), (str, type(None))):
                raise InvalidValueError(f"{where}: a {content.type} content's {name} must be text")
        for name in ("items", "inputs", "outputs"):
            nested = getattr(content, name, None)
            if isinstance(nested, list):
                pending.extend(item for item in nested if isinstance(item, Content))


def check_state_value(doc: Any, key: str, max_bytes: int) -> None:
    """A stored state value that decodes, and encodes again, by codec.py's rules (see the module docstring)."""
    where = f"state[{key!r}]"
    unregistered, registered = _unregistered(doc, where)
    # A value holding a type this process does not know is checked in its known parts (each registered type,
    # Message among them, decoded and checked as it will be where it loads); otherwise whole.
    for part in registered if unregistered else [doc]:
        value = codec.decode_state(part, key=key)  # a typed InvalidValueError if it cannot be read back
        codec.dumps(codec.encode_state(value, key=key), where=where, max_bytes=max_bytes)
        _check_messages_in(value, where)


def _check_messages_in(value: Any, where: str) -> None:
    pending = [value]
    while pending:  # registered types (Message is one) may hold messages: the same rules as a transcript's
        item = pending.pop()
        if isinstance(item, Message):
            check_framework_message(item, where)
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item.values())


def _unregistered(doc: Any, where: str) -> tuple[bool, list[Any]]:
    """Check every ``$`` tag's form: (whether a ``$state`` type is not registered in this process, the
    ``$state`` values of registered types)."""
    found, pending, registered = False, [doc], []
    while pending:
        value = pending.pop()
        if isinstance(value, list):
            pending.extend(value)
        elif isinstance(value, dict) and len(value) == 1 and next(iter(value)) in _TAGS - {"$sealed"}:  # (a seal)
            tag, inner = next(iter(value.items()))
            shape = list if tag == "$tuple" else str if tag in ("$datetime", "$date") else dict
            if not isinstance(inner, shape):
                raise InvalidValueError(f"{where}: a {tag} must hold a {shape.__name__}, not {type(inner).__name__}")
            if isinstance(inner, str):  # $datetime, $date
                try:
                    (datetime if tag == "$datetime" else date).fromisoformat(inner)
                except ValueError as exc:
                    raise InvalidValueError(f"{where}: {inner!r} is not an ISO 8601 {tag[1:]}"[:300]) from exc
            elif isinstance(inner, list):  # $tuple
                pending.extend(inner)
            else:  # $dict, $state
                if tag == "$state" and not isinstance(inner.get("type"), str):
                    raise InvalidValueError(f"{where}: a $state must name its type")
                if tag == "$state" and inner["type"] in _STATE_TYPE_REGISTRY:
                    registered.append(value)
                found = found or (tag == "$state" and inner["type"] not in _STATE_TYPE_REGISTRY)
                pending.extend(inner.values())
        elif isinstance(value, dict):
            pending.extend(value.values())
    return found, registered


def check_compaction(session: dict[str, Any], messages: list[dict[str, Any]]) -> None:
    """A session's compaction columns (0013) as a run leaves them: each place distinct and below the next seq's,
    links to messages of the session, ``excluded_at`` only on excluded messages, links only on summaries."""
    where, end = f"import: session {session['id']!r}", session.get("next_seq", 0) * POSITION_STEP
    ids = {row["message_id"] for row in messages}
    places = [row["pos"] if row.get("pos") is not None else row["seq"] * POSITION_STEP for row in messages]
    if any(not -(2**62) < place < end for place in places) or len(set(places)) != len(places):
        raise InvalidValueError(f"{where}: a message's pos is not a place of its own below the next seq's")
    for row in messages:
        if row.get("summarized_by") is not None and row["summarized_by"] not in ids - {row["message_id"]}:
            raise InvalidValueError(f"{where}: message {row['message_id']!r} names a summary the session lacks")
        # excluded_at is a seq (the first of the commit that excluded it), never past the session's next seq
        at = row.get("excluded_at")
        if at is not None and not (row.get("excluded") and type(at) is int and 0 <= at <= session.get("next_seq", 0)):
            raise InvalidValueError(f"{where}: message {row['message_id']!r} has an excluded_at but is not excluded")
        marks = json.loads(row["marks"]) if row.get("marks") is not None else {}
        if not isinstance(marks.get("_group", {}), dict) or (row.get("summary_of") and "_group" not in marks):
            raise InvalidValueError(f"{where}: message {row['message_id']!r}: its _group mark is not a summary's")


def check_usage(session: dict[str, Any], runs: list[dict[str, Any]], calls: list[dict[str, Any]]) -> None:
    """A session's model calls are its runs' and its owner's (never charged to another user), and a run with
    calls logs their sums, as a commit writes them."""
    by_run = {run.get("run_id"): run for run in runs}
    for call in calls:
        if call.get("run_id") not in by_run or call.get("user_id") != session.get("user_id"):
            raise InvalidValueError(f"import: session {session['id']!r}: a usage row names a run it lacks, or "
                                    "another user")  # fmt: skip
    for run_id, run in by_run.items():
        own = [call for call in calls if call.get("run_id") == run_id]
        for column in ("input_tokens", "output_tokens"):
            figures = [call[column] for call in own if call.get(column) is not None]
            logged = sum(figures) if figures and sum(figures) <= RUN_LOG_MAX else None
            if own and run.get(column) != logged:
                raise InvalidValueError(f"import: session {session['id']!r}: run {run_id!r} logs {column} "
                                        f"{run.get(column)!r}, its calls sum to {logged!r}")  # fmt: skip
