"""SQLite: the common commit as one transaction, run in one hop to the connection's thread.

aiosqlite runs every statement in its connection's own thread; each hop there and back costs about 50 us of
CPU on these machines, more than the statement. So the common case (the same as PostgreSQL's one-call commit,
commit_postgresql.py) is one Python function run in that thread: ``BEGIN IMMEDIATE``, the checks and writes
of commit.py's checked path in the same order, ``COMMIT``, with ``executemany`` for the rows. A run's first commit
creates the session row in the same hop (as PostgreSQL's call does since migration 0010).

Why it is correct: ``BEGIN IMMEDIATE`` takes SQLite's one write lock before the first read, so nothing another
writer does can land between a check below and the COMMIT. Whenever anything differs from the common case (the
session row moved, a shared key's stamp moved, the user was erased, a message id is stored already), it rolls
back and the caller takes the checked path, which names the precise error (or commits).
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime, timedelta
from typing import Any

import aiosqlite

import agent_store.run.compaction as compaction
from agent_store.db import ledger, runlog
from agent_store.db.codec import service_session_json
from agent_store.db.driver_path import DriverPath
from agent_store.db.erasures import user_key
from agent_store.db.scopes import APP_PREFIX, USER_PREFIX, scope_of
from agent_store.db.tables import UTCDateTime
from agent_store.errors import CheckedPathNeeded
from agent_store.run.one_call import OneCall, Outcome

_FENCE = "SELECT 1 FROM agent_erasures WHERE user_key = :user_key AND erased_at >= :since"
# The checked path's bump (statements.py) for a session this run loaded: the same life of the id, this user's
# and agent's, open, and no commit since the load (version unchanged; it also orders the session's own keys).
_BUMP = """UPDATE agent_sessions SET version = version + 1, next_seq = next_seq + :n, updated_at = :now,
    last_run_at = :now, expires_at = CASE WHEN ttl_seconds IS NULL THEN :default_expires
        ELSE datetime(:now_epoch + ttl_seconds, 'unixepoch') || :now_frac END{set_ssid}
WHERE id = :sid AND incarnation = :incarnation AND version = :version AND closed_at IS NULL
    AND user_id IS :uid AND (agent_id IS NULL OR agent_id = :agent){check_ssid}
RETURNING version, next_seq"""
# A run's first commit: the row as the checked path's create + bump leave it (no TTL of its own yet). A row
# already there (another run created it since this one loaded) is the checked path's to join.
_CREATE = """INSERT INTO agent_sessions (id, incarnation, user_id, agent_id, service_session_id, version, next_seq,
    created_at, updated_at, last_run_at, expires_at)
VALUES (:sid, :incarnation, :uid, :agent, :ssid, 1, :n, :now, :now, :now, :default_expires)
ON CONFLICT (id) DO NOTHING
RETURNING version, next_seq"""
_SSID = (
    ", service_session_id = :ssid",
    "\n    AND coalesce(service_session_id, 'null') = coalesce(:loaded_ssid, 'null')",  # JSON null: no conversation
)
_BUMPS = {False: _BUMP.format(set_ssid="", check_ssid=""), True: _BUMP.format(set_ssid=_SSID[0], check_ssid=_SSID[1])}
# Per scope: (table, owner column); its statements are made once, here, from these constants only. Keys arrive
# as one JSON array (json_each), whatever their number.
_SCOPES = {
    "own": ("agent_state", "session_id"), "user": ("agent_user_state", "user_id"), "app": ("agent_app_state", "app_id")
}  # fmt: skip
_STAMPS = "SELECT key, version FROM {table} WHERE {owner} = ? AND key IN (SELECT value FROM json_each(?))"
_DELETE = "DELETE FROM {table} WHERE {owner} = ? AND key IN (SELECT value FROM json_each(?))"
_UPSERT = """INSERT INTO {table} ({owner}, key, value, version, updated_at) VALUES (?, ?, ?, ?, ?)
ON CONFLICT ({owner}, key) DO UPDATE SET value = excluded.value, version = excluded.version,
    updated_at = excluded.updated_at"""
_SCOPE_SQL = {
    part: tuple(sql.format(table=table, owner=owner) for sql in (_STAMPS, _DELETE, _UPSERT))
    for part, (table, owner) in _SCOPES.items()
}
_MESSAGE = """INSERT INTO agent_messages (session_id, seq, message_id, run_id, role, author_name, text, created_at,
    body, pos, marks, excluded, exclude_reason, summarized_by, summary_of, excluded_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"""
# A compaction's rewrites of stored messages (run/compaction.py; the checked path's db/rewrites.py). The bump
# above already required that no commit came since the load, which is what they are computed against.
_MARKS = """UPDATE agent_messages SET marks = ?1, excluded = ?2, exclude_reason = ?3, summarized_by = ?4,
    summary_of = coalesce(?5, summary_of), excluded_at = CASE WHEN ?2 THEN coalesce(excluded_at, ?8) END
    WHERE session_id = ?6 AND message_id = ?7"""  # ?8: this commit's first seq, kept by what it excludes
_MOVE = "UPDATE agent_messages SET pos = ? WHERE session_id = ? AND message_id = ?"
_INCLUDED_FROM = (
    "UPDATE agent_sessions SET included_from = CASE WHEN included_from > ?1 THEN ?1 ELSE included_from END"
    " WHERE id = ?2",
    "UPDATE agent_sessions SET included_from = ?1 WHERE id = ?2",  # the run read every included message
)
_MARK_COLUMNS = ("marks", "excluded", "exclude_reason", "summarized_by", "summary_of")
# A result whose call was committed earlier (per-service-call saves) takes the name from that call's row.
_TOOL = """INSERT INTO agent_tool_calls (session_id, seq, call_id, kind, tool_name) VALUES (?1, ?2, ?3, ?4,
    coalesce(?5, (SELECT c.tool_name FROM agent_tool_calls c WHERE c.session_id = ?1 AND c.call_id = ?3
                  AND c.kind = 'call' LIMIT 1)))"""
_RUN = """INSERT INTO agent_runs (session_id, run_id, version, messages_written, state_keys_written, started_at,
    committed_at, agent_name, messages_in, messages_out, input_tokens, output_tokens, outcome, messages_rewritten)
VALUES (:session_id, :run_id, :version, :messages_written, :state_keys_written, :started_at, :committed_at,
    :agent_name, :messages_in, :messages_out, :input_tokens, :output_tokens, :outcome, :messages_rewritten)"""
_USAGE = """INSERT INTO agent_usage (session_id, run_id, call_no, user_id, agent_name, app_id, called_at, purpose,
    model, provider, input_tokens, output_tokens, total_tokens, cache_creation_input_tokens, cache_read_input_tokens,
    reasoning_output_tokens, extra, latency_ms, finish_reason, streamed, trace_id, span_id)
VALUES (:session_id, :run_id, :call_no, :user_id, :agent_name, :app_id, :called_at, :purpose, :model, :provider,
    :input_tokens, :output_tokens, :total_tokens, :cache_creation_input_tokens, :cache_read_input_tokens,
    :reasoning_output_tokens, :extra, :latency_ms, :finish_reason, :streamed, :trace_id, :span_id)"""
AVAILABLE = DriverPath.sqlite_thread_available(aiosqlite.Connection)  # else every commit takes the checked path
_time: Any = None  # UTCDateTime's SQLite bind conversion: the text form every stored timestamp has


async def attempt(call: OneCall) -> Outcome:
    """((new version, messages, keys, rewritten) if committed, False); None: the checked path must run.

    The second value (PostgreSQL's "connection lost, outcome unknown") is always False: a file does not drop.
    """
    global _time
    if _time is None:
        _time = UTCDateTime().bind_processor(call.db.engine.dialect)
    work, delta = _Commit(call), call.delta
    try:
        version = await call.db.in_sqlite_thread(work, doing="committing a run", committing=call.sent)
    except CheckedPathNeeded:
        return None, False
    return (version, len(delta.messages), len(delta.changed_keys), work.rewritten), False


def takes(call: OneCall) -> bool:
    """Whether this hop can write the call's compaction too: the places it needs are known without a read."""
    rewrites, snap = call.delta.rewrites, call.snapshot
    return not rewrites or (snap.exists and snap.places_known and not (snap.gapped and rewrites.needs_places))


class _Commit:
    """The transaction's parameters, built on the event loop; ``__call__`` runs in the connection's thread.

    The commit's time is read there, once the write lock is held (as the checked path reads it): a commit that
    waited for the lock is stamped, and its expiry pushed forward, from when it wrote.
    """

    def __init__(self, call: OneCall) -> None:
        delta, snap, sid = call.delta, call.snapshot, call.session_id
        self.ttl = call.db.settings.idle_ttl_seconds
        ssid, loaded_ssid = (service_session_json(v) for v in (delta.service_session_id, snap.service_session_id))
        self.bump = _BUMPS[delta.service_session_id_changed] if snap.exists else _CREATE
        self.bump_params = {
            "sid": sid, "uid": call.user_id, "agent": call.agent_id, "version": snap.version,
            "incarnation": snap.incarnation if snap.exists else delta.incarnation, "n": len(delta.messages),
            "ssid": ssid if delta.service_session_id_changed else None, "loaded_ssid": loaded_ssid,
        }  # fmt: skip
        # The erasure fence: for a run writing the user's keys, and (as the checked path) for one creating a session.
        self.fenced = call.user_id is not None and not snap.exists
        self.fence = {"user_key": user_key(call.user_id or ""), "since": _time(call.since)}
        # Per scope: (its statements, owner, the loaded stamps to check (shared scopes), deletes, upsert rows)
        self.scopes: dict[
            str, tuple[tuple[str, ...], str, dict[str, int | None], list[str], list[tuple[Any, ...]]]
        ] = {}
        for key in delta.changed_keys:
            scope = scope_of(key, call.scopes)
            part = "user" if scope.prefix == USER_PREFIX else "app" if scope.prefix == APP_PREFIX else "own"
            _, _, loaded, deletes, rows = self.scopes.setdefault(part, (_SCOPE_SQL[part], scope.owner, {}, [], []))
            stored = scope.stored_key(key)
            if part != "own":
                loaded[stored] = snap.state_stamp.get(key)
            if key in delta.upserts:
                rows.append((scope.owner, stored, delta.upserts[key], delta.stamp))
            else:
                deletes.append(stored)
        placed = compaction.give_places(delta.rewrites, snap) if delta.rewrites else {}
        self.messages = [
            (sid, r.message_id, delta.run_id, r.columns["role"], r.columns["author_name"], r.columns["text"],
             r.columns["body"], placed.get(r.message_id), *(r.columns[c] for c in _MARK_COLUMNS))
            for r in delta.messages
        ]  # fmt: skip
        new = {r.message_id for r in delta.messages}
        self.marks = [(*(c[name] for name in _MARK_COLUMNS), sid, mid) for mid, c in delta.rewrites.marks.items()]
        self.moves = [(place, sid, mid) for mid, place in delta.rewrites.moved(new).items()]
        self.included_from = (
            (_INCLUDED_FROM[delta.rewrites.knows_every_included], (delta.rewrites.included_from, sid))
            if delta.rewrites else None
        )  # fmt: skip
        self.rewritten = delta.rewrites.rewritten(new)
        self.tools = [(sid, i, *tool) for i, r in enumerate(delta.messages) for tool in r.tools]
        self.log = runlog.run_log_row(
            call.log_ids, 0, delta.messages, len(delta.changed_keys), delta.usage, "committed"
        )
        self.user_id, self.app_id = call.user_id, call.db.settings.app_id
        owner = {"session_id": sid, "run_id": delta.run_id, "user_id": call.user_id, "app_id": self.app_id}
        self.calls = [{**owner, **row} for row in ledger.call_rows(delta.calls, call.agent_id)]
        self.tokens = sum(c.tokens for c in delta.calls)

    def __call__(self, conn: sqlite3.Connection) -> int:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = self._write(conn, datetime.now(UTC))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return version

    def _write(self, conn: sqlite3.Connection, now: datetime) -> int:
        when = _time(now)
        if ("user" in self.scopes or self.fenced) and conn.execute(_FENCE, self.fence).fetchone() is not None:
            raise CheckedPathNeeded("the user was erased since the run loaded")
        bumped = conn.execute(self.bump, {
            **self.bump_params, "now": when, "now_epoch": int(now.timestamp()), "now_frac": f".{now.microsecond:06d}",
            "default_expires": _time(now + timedelta(seconds=self.ttl)) if self.ttl else None,
        }).fetchone()  # fmt: skip
        if bumped is None:
            raise CheckedPathNeeded("the session row moved on (or was created) since the run loaded")
        version, next_seq = bumped
        for (stamps, delete, upsert), owner, loaded, deletes, rows in self.scopes.values():
            if loaded:
                stored = dict(conn.execute(stamps, (owner, _json_list(list(loaded)))).fetchall())
                if any(stored.get(k) != stamp for k, stamp in loaded.items()):
                    raise CheckedPathNeeded("a shared key was written since the run loaded")
            if deletes:
                conn.execute(delete, (owner, _json_list(deletes)))
            if rows:
                conn.executemany(upsert, [(*row, when) for row in rows])
        first = next_seq - len(self.messages)
        if self.included_from is not None:  # a compaction's (never in a plain turn's commit)
            conn.executemany(_MARKS, [(*m, first) for m in self.marks])
            conn.executemany(_MOVE, self.moves)
            conn.execute(*self.included_from)
        try:
            # m[9]: excluded (a message this commit inserts excluded keeps this commit's first seq)
            rows = [
                (m[0], first + i, *m[1:6], when, *m[6:], first if m[9] else None) for i, m in enumerate(self.messages)
            ]
            conn.executemany(_MESSAGE, rows)
            conn.executemany(_TOOL, [(t[0], first + t[1], *t[2:]) for t in self.tools])
        except sqlite3.IntegrityError as exc:  # a message id stored already: the checked path says which
            raise CheckedPathNeeded("a message id is stored already") from exc
        log = {**self.log, "committed_at": now, "version": version, "messages_rewritten": self.rewritten}
        conn.execute(_RUN, {k: _time(v) if isinstance(v, datetime) else v for k, v in log.items()})
        if self.calls:  # the run's model calls, and their tokens charged to the budgets (db/ledger.py)
            conn.executemany(_USAGE, [{**row, "called_at": _time(row["called_at"])} for row in self.calls])
            for params in ledger.charges(self.tokens, self.log["run_id"], self.user_id, self.app_id, now):
                conn.execute(ledger.CHARGE, {k: _time(v) if isinstance(v, datetime) else v for k, v in params.items()})
        return int(version)


def _json_list(items: list[str]) -> str:
    return json.dumps(items, ensure_ascii=False)
