"""A run's commit as one checked transaction: every lock, every check, every error named (commit.py's fallback).

The common case goes in one call per backend (commit_postgresql.py, commit_sqlite.py); anything else comes here
in a transaction that commit.py opens: a retry, a serialized run, an idempotency key, a session the run did not
load, or whatever the one call refused. Locks in one order, always: the user's, then the session row (and the
app scope's); a commit's every check runs after the lock it depends on.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from agent_framework import Message
from sqlalchemy.engine import Row
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

import agent_store.run.compaction as compaction
import agent_store.run.replays as replays
import agent_store.run.responses as responses
from agent_store.db import codec, erasures, ledger, message_rows, rewrites, runlog
from agent_store.db import statements as sql
from agent_store.db.load_statement import POSITION_STEP
from agent_store.db.scopes import APP_PREFIX, USER_PREFIX, scope_of
from agent_store.db.stored_twice import StoredTwice
from agent_store.errors import ConflictError
from agent_store.run.one_call import OneCall

__all__ = ["HeadMoved", "Landed", "ResponseToRecord", "write"]


class HeadMoved(Exception):
    """A response's commit found its session moved past the point the run continues from (0017): it writes nothing
    there; the caller starts a branch at that point (run/points.py) and commits the run into it."""


@dataclass(frozen=True)
class ResponseToRecord:
    """A key to record with the commit, naming the point it makes (0017), and the point it continued from;
    ``moves``: the key names the session's head from now on, wherever it goes (0018)."""

    key: str
    parent: str | None
    moves: bool = False
    claims: str | None = None  # a moving key taken with it (a conversation's first turn); another's: a conflict


class Landed(Exception):
    """Raised inside a retried commit that finds its first attempt committed: roll back, report that one."""

    def __init__(self, row: Row[Any], incarnation: int) -> None:
        self.row, self.incarnation = row, incarnation


async def write(
    db: AsyncConnection, call: OneCall, *, check_landed: bool, maybe_landed: bool, history: list[Message] | None
) -> tuple[int, Any, bool]:
    """Write ``call.delta`` in the transaction ``db``: (incarnation, (version, messages, keys), maybe_landed).

    ``maybe_landed``: an earlier attempt of this delta may have committed (it comes back False once the log
    shows it did not); ``history``: for a provider's save, the messages whose replays are skipped.
    Raises :class:`Landed` when an earlier attempt did commit: roll back and report that one.
    """
    delta, sid, now, snap, settings = call.delta, call.session_id, datetime.now(UTC), call.snapshot, call.db.settings
    writes_user_keys = any(k.startswith(USER_PREFIX) for k in delta.changed_keys)
    # A first commit whose outcome is unknown (its connection was lost) may still be running on the server: the
    # client was cut, the server was not. Its creation holds the user's lock (shared) from before its insert to
    # its COMMIT, so this retry takes that lock exclusively, and waits it out: what it reads next is that
    # attempt's final outcome, not a moment in its middle (issue 37). Without a user, an insert probe waits.
    settling = not snap.exists and maybe_landed
    if call.user_id is not None and (writes_user_keys or not snap.exists):
        await sql.lock_user(db, call.user_id, exclusive=writes_user_keys or settling)  # before the row lock, always
        if await erasures.erased_since(db, call.user_id, call.since):
            raise sql.not_found(sid, call.user_id)  # the user was erased after this run loaded
    elif settling:
        await sql.wait_for_creation(db, sid, delta.incarnation)
    if settling:
        # That attempt created the session or joined one another run created first: its run id is in the log
        # of the session there now, looked up under the row's lock. A session without it was made by someone
        # else, since or instead (it cannot tell which: ConflictError, reload); no session at all: not found,
        # the delta kept (that attempt may still arrive; the next commit() looks again).
        if (there := await sql.lock_session(db, sid)) is None:
            raise sql.creation_not_found(sid, call.user_id)
        if (landed := await runlog.run_recorded(db, sid, delta.run_id)) is not None:
            raise Landed(landed, there)
        raise ConflictError(sid, [], reason="this run's first commit, whose outcome is unknown, would have created "
                                            "the session; the one there now was made by another run")  # fmt: skip
    # A retry of a run that found no session, whose first COMMIT may have landed, and no session is there: it
    # never re-creates one (it may have been deleted or erased since), bound to the incarnation it drew.
    bound = snap.incarnation if snap.exists else delta.incarnation if maybe_landed else None
    joined = False  # a session this run found absent, there now: made by another run since (or never read)
    if not snap.exists and not maybe_landed:
        row = {"id": sid, "user_id": call.user_id, "agent_id": call.agent_id, "incarnation": delta.incarnation,
               "version": 0, "next_seq": 0, "created_at": now, "updated_at": now}  # fmt: skip
        joined = not await sql.create_session(db, row)
    ttl = settings.idle_ttl_seconds
    incarnation, version, next_seq = await sql.bump_session(
        db, session_id=sid, user_id=call.user_id, agent_id=call.agent_id,
        incarnation=bound, n_messages=len(delta.messages), now=now,
        default_expires=now + timedelta(seconds=ttl) if ttl else None,
        move_service_session_id=delta.service_session_id_changed,
        service_session_id=codec.service_session_json(delta.service_session_id),
        loaded_service_session_id=codec.service_session_json(snap.service_session_id),
        retrying_creation=not snap.exists and maybe_landed,
    )  # fmt: skip
    if check_landed and (landed := await runlog.run_recorded(db, sid, delta.run_id)) is not None:
        raise Landed(landed, incarnation)  # under the row lock: an attempt still in flight has finished by now
    if call.response is not None:  # before any state write: from here on the session keeps its history
        if (snap.exists and version != snap.version + 1) or joined:
            # The point this run continues from is not the session's head any more; or the run began from no
            # history (a get() that found nothing) and the id has one now: a response's history is what its
            # model saw, never another run's turns before it.
            raise HeadMoved()
        await responses.before_writes(db, call, version, next_seq - len(delta.messages), now)
    for scope in call.scopes:
        keys = [k for k in delta.changed_keys if scope_of(k, call.scopes) is scope]
        if not keys:
            continue
        if scope.prefix == APP_PREFIX:
            await sql.lock_app_scope(db, scope.owner)
        # Every write of a session's own keys bumps its version in this incarnation: if ours is the only
        # bump since the load, nobody else wrote them, and the stamp check is skipped.
        if scope.prefix or not snap.exists or snap.verify_new_ids or version != snap.version + 1:
            stored = await sql.stored_stamps(db, scope, [scope.stored_key(k) for k in keys])
            if lost := sorted(k for k in keys if stored.get(k) != snap.state_stamp.get(k)):
                raise ConflictError(sid, lost)
        upserts = {k: v for k, v in delta.upserts.items() if k in keys}
        await sql.write_state(db, scope, upserts, [k for k in delta.deletes if k in keys], delta.stamp, now)
    rewritten = await _rewrite(db, call, version) if delta.rewrites else 0
    records, first_seq = delta.messages, next_seq - len(delta.messages)
    if records and snap.verify_new_ids:
        # Skip any message this run carries that is stored already (a retried save of a session it did not load),
        # and for a provider's save, what replays the stored tail (replays.py); their seqs are given back.
        keep = records
        if stored_ids := await sql.already_stored(db, sid, [r.message_id for r in records]):
            keep = [r for r in records if r.message_id not in stored_ids]
        if keep and history is not None:
            by_id = {message_rows.store_id(m): m for m in history}
            keep = await replays.not_replayed(db, sid, keep, by_id, first_seq, call.cipher)
        if len(keep) != len(records):
            await sql.give_back_seq(db, sid, len(records) - len(keep))
            records = keep
    try:
        await sql.insert_messages(db, sid, records, first_seq, delta.run_id, now)
    except IntegrityError as exc:  # (session_id, message_id) is unique: an old message added to the history
        raise StoredTwice(sid, [r.message_id for r in records]) from exc
    if call.response is not None:
        await responses.record(db, call, version, first_seq + len(records), now)
    log = runlog.run_log_row(call.log_ids, version, records, len(delta.changed_keys), delta.usage, "committed")
    await runlog.record_run(db, {**log, "messages_rewritten": rewritten})
    await ledger.record(db, log, delta.calls, user_id=call.user_id, agent_id=call.agent_id, app_id=settings.app_id,
                        now=now)  # fmt: skip
    return incarnation, (version, len(records), len(delta.changed_keys), rewritten), maybe_landed


async def _rewrite(db: AsyncConnection, call: OneCall, version: int) -> int:
    """A compaction's changes to the stored history (run/compaction.py), on the history as the run loaded it.

    They are computed against the loaded list, so they hold only if no other commit came between: otherwise
    :class:`ConflictError` and nothing is written (``retry_on_conflict`` runs the turn again on the new history).
    New messages placed in the middle get their ``pos`` here (their rows are inserted next).
    """
    delta, sid, snap = call.delta, call.session_id, call.snapshot
    if not snap.exists or not snap.places_known or version != snap.version + 1:
        raise ConflictError(sid, [], reason="this run compacted the history, and another run committed to the "
                                            "session after this run loaded it")  # fmt: skip
    order, lows = delta.rewrites.order, None
    if snap.gapped and delta.rewrites.needs_places:
        lows = {}  # stored messages may lie between loaded ones: each run goes right before what follows it
        for i, (_, place) in enumerate(order):
            if place is None and (i + 1 == len(order) or order[i + 1][1] is not None):
                hi = snap.end if i + 1 == len(order) else order[i + 1][1]
                assert hi is not None
                below = await rewrites.place_below(db, sid, hi)
                lows[hi] = hi - POSITION_STEP if below is None else below
    placed = compaction.give_places(delta.rewrites, snap, lows)
    new_ids = {r.message_id for r in delta.messages}
    for record in delta.messages:
        record.columns["pos"] = placed.get(record.message_id)
    moved = delta.rewrites.moved(new_ids)
    marks = delta.rewrites.marks
    if call.base_seq is not None:  # a branch: its base's messages are shared, their new columns are its own rows
        marks, moved = await responses.branch_rewrites(db, call, marks, moved, horizon=snap.end // POSITION_STEP,
                                                       version=version)  # fmt: skip
    await rewrites.rewrite_marks(db, sid, marks, horizon=snap.end // POSITION_STEP)
    await rewrites.move(db, sid, moved)
    exactly = delta.rewrites.knows_every_included
    await rewrites.lower_included_from(db, sid, delta.rewrites.included_from, exactly=exactly)
    return delta.rewrites.rewritten(new_ids)
