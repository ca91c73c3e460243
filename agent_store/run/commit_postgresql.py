"""PostgreSQL: the common commit in one round trip, a call of ``agent_store_commit(jsonb)`` (migrations 0005, 0010).

The common case is a run's first commit (no retry, no idempotency key to look up), outside a serialized run, of
a session it loaded, or of one it creates (none existed when it loaded). The call runs as one statement outside
any explicit transaction, so it is its own transaction: no BEGIN, no COMMIT, one round trip. The function takes the same
locks in the same order and makes the same checks as the checked path (commit.py ``_write``), and raises
``AS000`` (caught here as :class:`CheckedPathNeeded`) whenever anything differs from the common case, before
anything is kept: then the caller takes the checked path, which names the precise error (or commits).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text

import agent_store.run.compaction as compaction
from agent_store.db import codec, ledger, runlog, tenancy
from agent_store.db.erasures import user_key
from agent_store.db.scopes import APP_PREFIX, USER_PREFIX, scope_of
from agent_store.errors import CheckedPathNeeded, DatabaseError, StorageUnavailableError
from agent_store.run.one_call import OneCall, Outcome

# PostgreSQL caps one jsonb value at 256 MB: a run that large (characters; up to 4 bytes each) goes the checked way.
LARGEST_CALL = 32 * 1024 * 1024
CALL = text("SELECT agent_store_commit(CAST(:p AS jsonb))")
# A run with model calls: the same commit, then its usage-ledger rows and budget charges (migration 0014).
CALL_WITH_USAGE = text("SELECT agent_store_commit_usage(CAST(:p AS jsonb))")
# Under row-level security, the same calls naming the run's user first, in the same round trip (migration 0024).
CALL_AS = text("SELECT agent_store_commit_as(:u, :a, CAST(:p AS jsonb))")
CALL_WITH_USAGE_AS = text("SELECT agent_store_commit_usage_as(:u, :a, CAST(:p AS jsonb))")
UNIQUE_VIOLATION = "23505"


async def attempt(call: OneCall) -> Outcome:
    """((new version, messages, keys) if committed, whether the checked path must run as a retry).

    Not committed: the function refused (the server said so: nothing kept), or the connection was found dead
    (then the call may have landed, and the checked path, as a retry, finds it by its run id).
    """
    delta = call.delta
    if sum(len(r.columns["body"]) + len(r.columns["text"]) for r in delta.messages) > LARGEST_CALL:
        return None, False
    try:
        params, named = {"p": payload(call)}, call.db.row_security
        if named:
            params.update(u=tenancy.named()["user"], a=call.db.settings.app_id)
        statement = (CALL_WITH_USAGE_AS if named else CALL_WITH_USAGE) if delta.calls else (CALL_AS if named else CALL)
        rows = await call.db.one_statement(
            statement, params, doing="committing a run", committing=call.sent, names_itself=named
        )
    except CheckedPathNeeded:
        return None, False
    except DatabaseError as exc:
        if getattr(exc.__cause__, "sqlstate", None) != UNIQUE_VIOLATION:
            raise
        # A unique index refused a row: a message id stored already, or two ids of one MD5 (which only crafted
        # ids have). The statement failed whole, so nothing was kept; the checked path names it.
        return None, False
    except StorageUnavailableError as exc:
        if not exc.connection_lost:
            raise
        return None, True
    rewritten = delta.rewrites.rewritten({r.message_id for r in delta.messages})
    return (int(rows[0][0]), len(delta.messages), len(delta.changed_keys), rewritten), False


def _j(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def payload(call: OneCall) -> str:
    """The call's one argument, as JSON text: values and bodies are spliced in as the codec serialized them.

    Optional parts are present only when there is something to do: ``own`` / ``user`` / ``app`` (the changed
    keys of each scope: value, or ``del``; shared scopes with the stamp this run loaded), ``tools``, ``ssid``.
    """
    delta, snap, settings, now = call.delta, call.snapshot, call.db.settings, datetime.now(UTC)
    ttl = settings.idle_ttl_seconds
    by_scope: dict[str, list[str]] = {"own": [], "user": [], "app": []}
    for key in delta.changed_keys:
        scope = scope_of(key, call.scopes)
        value = delta.upserts.get(key)
        part = "user" if scope.prefix == USER_PREFIX else "app" if scope.prefix == APP_PREFIX else "own"
        by_scope[part].append(
            f'{{"key":{_j(scope.stored_key(key))},"del":{_j(value is None)},"loaded":{_j(snap.state_stamp.get(key))}'
            f',"value":{value if value is not None else "null"}}}'
        )
    messages, tools = [], []
    rewrites = delta.rewrites
    placed = compaction.give_places(rewrites, snap) if rewrites else {}
    for i, record in enumerate(delta.messages):
        c = record.columns
        marked = "".join(  # a compaction's columns (0013), only where there are some
            f',"{name}":{c[name] if name in ("marks", "summary_of") else _j(c[name])}'
            for name in ("marks", "excluded", "exclude_reason", "summarized_by", "summary_of")
            if c[name]
        ) + (f',"pos":{placed[record.message_id]}' if record.message_id in placed else "")
        messages.append(
            f'{{"i":{i},"message_id":{_j(record.message_id)},"role":{_j(c["role"])},'
            f'"author_name":{_j(c["author_name"])},"text":{_j(c["text"])},"body":{c["body"]}{marked}}}'
        )
        tools += [{"i": i, "call_id": call_id, "kind": kind, "tool_name": name} for call_id, kind, name in record.tools]
    log = runlog.run_log_row(call.log_ids, 0, delta.messages, len(delta.changed_keys), delta.usage, "")
    head: dict[str, Any] = {
        # What agent_store_commit() checks: a call of another shape takes the checked path. Format 2 (migration
        # 0010) creates the session; an older function refuses it and the checked path creates it instead.
        "format": 3 if delta.compacts and snap.exists else 1 if snap.exists else 2,
        "sid": call.session_id, "uid": call.user_id, "agent": call.agent_id, "app_id": settings.app_id,
        "incarnation": snap.incarnation if snap.exists else delta.incarnation, "version": snap.version,
        "stamp": delta.stamp, "run_id": delta.run_id,
        "now": now.isoformat(), "default_expires": (now + timedelta(seconds=ttl)).isoformat() if ttl else None,
        "ssid_changed": delta.service_session_id_changed,
        "log": {k: v.isoformat() if isinstance(v, datetime) else v for k, v in log.items()},
    }  # fmt: skip
    if tools:
        head["tools"] = tools
    if delta.calls:  # agent_store_commit_usage's part: the ledger rows, and the tokens to charge (db/ledger.py)
        head["calls"] = [_call(row) for row in ledger.call_rows(delta.calls, call.agent_id)]
        if tokens := min(sum(c.tokens for c in delta.calls), ledger.CHARGE_MAX):
            head["charge"] = {"tokens": tokens, **{k: v.isoformat() for k, v in ledger.period_starts(now).items()}}
    if not delta.deletes:  # the function (0012) then skips its delete statements; an older one ignores this
        head["no_deletes"] = True
    if not snap.exists:
        head["create"] = True
    if rewrites:  # a compaction's rewrites of stored messages (0013's function; an older one refuses format 3)
        new = {r.message_id for r in delta.messages}
        moves = [{"message_id": mid, "pos": place} for mid, place in rewrites.moved(new).items()]
        marks = [_rewrite(mid, columns) for mid, columns in rewrites.marks.items()]
        head.update(marks=marks, moves=moves, included_from=rewrites.included_from)
        head.update(included_exactly=rewrites.knows_every_included, rewritten=rewrites.rewritten(new))
    if by_scope["user"] or (not snap.exists and call.user_id is not None):  # the user's lock and the erasure fence
        head["user_key"], head["since"] = user_key(call.user_id or ""), call.since.isoformat()
    parts = [_j(head)[:-1], ',"messages":[', ",".join(messages), "]"]
    parts += [f',"{part}":[{",".join(items)}]' for part, items in by_scope.items() if items]
    if delta.service_session_id_changed:
        parts.append(f',"ssid":{codec.dumps(delta.service_session_id, where="service_session_id")}')
        if snap.service_session_id is not None:  # absent: SQL NULL, as the checked path binds it
            parts.append(f',"loaded_ssid":{codec.dumps(snap.service_session_id, where="service_session_id")}')
    return "".join(parts) + "}"


def _call(row: dict[str, Any]) -> dict[str, Any]:
    extra = row["extra"]
    return {**row, "called_at": row["called_at"].isoformat(), "extra": json.loads(extra) if extra else None}


AVAILABLE = True  # the function is in every schema since migration 0005


def _rewrite(message_id: str, columns: dict[str, Any]) -> dict[str, Any]:
    """One stored message's new mark columns, as the function reads them (JSON documents as JSON)."""
    json_columns = ("marks", "summary_of")
    return {
        "message_id": message_id,
        **{k: json.loads(v) if k in json_columns and v else v for k, v in columns.items()},
    }


def takes(call: OneCall) -> bool:
    """Whether the call can write the commit's compaction too: the places it needs are known without a read (a
    load that skipped stored messages needs their neighbours' places: the checked path reads them)."""
    rewrites, snap = call.delta.rewrites, call.snapshot
    return not rewrites or (snap.exists and snap.places_known and not (snap.gapped and rewrites.needs_places))
