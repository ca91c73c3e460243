"""Points of a conversation (migration 0017): what a response id names, how a point is read back, how a branch starts.

A point is a session's history up to ``seq_end`` and its own state at ``version``. A response id names one
(``agent_responses``); a session id names its head. Reading a point that is a session's head is an ordinary load.
Reading an earlier one, or one in a branch, reads the chain of bases (messages are never copied), each message
with the compaction columns it had at that point (0016's ``agent_message_marks``, a branch's own
``agent_branch_marks``), and the session's own keys as they were at ``version`` (``agent_state_history``).

A run that continues from a point the session has moved past cannot be appended to that session: it gets a
branch, a session of its own whose ``base_id`` / ``base_seq`` point at the history it continues (O(1) rows:
the branch's row and its own keys, never the history), and its commit goes there.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, literal, select, union_all, update
from sqlalchemy.ext.asyncio import AsyncConnection

import agent_store.run.point_reads as reads
from agent_store.db import chains, codec, erasures, message_decode, message_rows, sealing, tenancy
from agent_store.db import statements as sql
from agent_store.db.cut_points import GONE, forget_point
from agent_store.db.database import Database
from agent_store.db.history_tables import insert_row, key_hash, key_is
from agent_store.db.load_statement import POSITION_STEP
from agent_store.db.scopes import APP_PREFIX, USER_PREFIX, scopes
from agent_store.db.tables import (
    messages_t,
    responses_t,
    sessions_t,
    state_t,
)
from agent_store.errors import ConflictError
from agent_store.run.commit import HISTORY_KEY, Run, StoredSession
from agent_store.run.delta import IdentifiedHistory, close_tool_pairs, pair_safe_tail
from agent_store.run.session_row import checked_session

__all__ = ["Branched", "Point", "adopt", "branch", "forget", "load_point", "pin", "resolve"]
_S, _M = sessions_t.c, messages_t.c


@dataclass(frozen=True, kw_only=True)
class Point:
    """``key`` names ``session_id``'s history before ``seq_end`` and its own state at ``version``."""

    key: str
    session_id: str
    seq_end: int
    version: int
    recorded: bool  # a response row (it never moves); False: a session's head, read when resolved
    is_head: bool  # the session is still there, no branch (an ordinary load reads it)
    moves: bool = False  # a key naming the session's head wherever it goes (0018): a turn from it never branches


@tenancy.for_user
async def resolve(db: Database, key: str, user_id: str | None) -> Point | None:
    """The point ``key`` names for ``user_id``: a response of theirs, or a branch of theirs by its own id (its
    head: read through its bases, with no second lookup), else None (keys are per user: another user's is not
    seen)."""
    codec.check_id(key, "response id", required=True)  # every key's lookup comes here: checked as ids are
    query = _RESOLVE_NONE if user_id is None else _RESOLVE
    rows = await db.one_statement(query, {"key": key, "key_hash": key_hash(key), "user": user_id},
                                  doing="resolving a response id")  # one trip
    found = rows[0] if rows else None
    if found is None or found.user_id != user_id:
        return None
    if found.seq_end == GONE and not found.by_id:  # a frozen own id whose history was cut: it names nothing
        return Point(key=key, session_id=found.session_id, seq_end=GONE, version=GONE, recorded=True, is_head=False)
    if found.by_id:  # a branch's own id: its head
        return Point(key=key, session_id=key, seq_end=int(found.next_seq), version=int(found.head), recorded=False,
                     is_head=False)
    if found.moves:  # the session's head, as it is now
        return Point(key=key, session_id=found.session_id, seq_end=int(found.next_seq), version=int(found.head),
                     recorded=False, is_head=found.base_id is None, moves=True)
    is_head = found.head == found.version and found.base_id is None
    return Point(key=key, session_id=found.session_id, seq_end=int(found.seq_end), version=int(found.version),
                 recorded=True, is_head=is_head)


def _resolving(with_user: bool) -> Any:
    """A key's row and its session's head, for a user (a key is its user's since 0018: two users may each have a
    conversation "conv_1"), or for no user; else a branch session of theirs named by its own id: built once,
    bound per call (the driver path caches by statement)."""
    r = responses_t.c
    keyed = select(literal(False).label("by_id"), r.session_id, r.seq_end, r.version, r.user_id, r.moves,
                   _S.version.label("head"), _S.next_seq, _S.base_id).join(sessions_t, _S.id == r.session_id)
    keyed = keyed.where(key_is(r, bindparam("key"), bindparam("key_hash")),
                        r.user_id == bindparam("user") if with_user else r.user_id.is_(None))
    branch = select(literal(True), _S.id, _S.next_seq, _S.version, _S.user_id, literal(False), _S.version,
                    _S.next_seq, _S.base_id).where(_S.id == bindparam("key"), _S.base_id.is_not(None),
                                                   _S.user_id == bindparam("user") if with_user
                                                   else _S.user_id.is_(None))  # fmt: skip
    union = union_all(keyed, branch)
    return union.order_by(union.selected_columns.by_id)


_RESOLVE, _RESOLVE_NONE = _resolving(True), _resolving(False)


@tenancy.for_user
async def load_point(
    db: Database, point: Point, *, user_id: str | None, agent_id: str | None, history_limit: int | None
) -> Run:  # fmt: skip
    """A run on the history ``point`` names, as it was then, in one statement (point_reads.py): the session's row
    (ownership, expiry, closure and budgets checked as on a load) and shared keys, the messages through the chain
    of bases, each with the compaction columns it had at the point, and the session's own keys at its version.
    Its commit must branch (``Run.point`` says from where), unless the point is still the session's head."""
    read_at = datetime.now(UTC)  # before the read: an erasure from then on fences the run (as a load's)
    view = await reads.read_view(db, point, user_id)
    cipher = await sealing.cipher_for(db, user_id)
    snap, shared = checked_session(view.loaded, point.session_id, user_id, agent_id, cipher)
    if not snap.exists:
        raise sql.not_found(point.session_id, user_id)
    segments = reads.segments(view.chain, point)
    conversation = view.chain[-1].key if view.chain else point.session_id
    session = StoredSession(session_id=conversation, service_session_id=snap.service_session_id)
    session.state.update(shared.state)  # user: and app: keys (shared across sessions: a point does not freeze them)
    for key, (value, text, stamp) in view.own.items():
        value, opened = sealing.open_state(cipher, key, value)
        snap.state_text[key], snap.state_stamp[key] = opened or text, stamp
        session.state[key] = codec.decode_state(value, key=key)
    owner = {sid: i for i, (sid, _, _, _) in enumerate(segments)}
    decoded = []
    for row in view.messages:
        columns = reads.mark_columns(row)
        columns.update(view.at_cut.get((row.sid, row.key), {}))
        for level in range(owner[row.sid]):  # a branch nearer the point overrides its base's columns
            if (found := view.overrides.get((segments[level][0], row.key))) is not None:
                columns.update(found)
                break
        position = columns["pos"] if columns["pos"] is not None else int(row.n1) * POSITION_STEP
        decoded.append((position, row, columns))
    decoded.sort(key=lambda item: item[0])
    messages = []
    for position, row, columns in decoded:
        marks = message_rows.with_links(columns["marks"], row.links)
        messages.append(message_decode.message_from_row(row.doc, cipher, identity=row.key, role=row.other,
                                                        author_name=row.author, text=row.text, marks=marks))
        snap.message_ids.add(row.key)
        snap.places[row.key] = position
        if marks:
            snap.marks[row.key] = marks
    if history_limit is not None:
        messages = pair_safe_tail(messages, history_limit) if history_limit else []
        snap.windowed = len(messages) < len(decoded)
    snap.version, snap.end = point.version, point.seq_end * POSITION_STEP
    messages, synthetic = close_tool_pairs(messages, frozenset())
    snap.message_ids |= synthetic
    history = session.state.get(HISTORY_KEY)
    session.state[HISTORY_KEY] = IdentifiedHistory({**(history if isinstance(history, dict) else {}),
                                                    "messages": messages})  # fmt: skip
    viewed = Run(db, session, snap, user_id=user_id, agent_id=agent_id)
    viewed.storage_id = point.session_id
    viewed.base_id = view.chain[0].author if view.chain else None  # a branch: its compaction of its base's is its own
    viewed.key_scopes = scopes(point.session_id, user_id, db.settings.app_id)
    viewed.read_at, viewed.cipher = read_at, cipher
    # A session's head by its own id (a branch's) is no point: a commit under that id moves the head.
    viewed.point = point if point.recorded or point.moves or point.key != point.session_id else None
    return viewed


def _shared(key: str) -> bool:
    return key.startswith((USER_PREFIX, APP_PREFIX))


async def forget(db: Database, point: Point) -> None:
    """Delete a response's key (the history it named stays: other points and branches share it)."""
    async with db.transaction(write=True, doing="deleting a response") as conn:
        await forget_point(conn, point.session_id, point.key)


async def pin(db: Database, key: str, session_id: str, user_id: str | None, version: int, *, written: bool) -> None:
    """``key``, set as a session's own id, names the point the commit of ``version`` made in ``session_id`` (that
    session, or a branch its turn went to) rather than a head wherever it goes: a later truncate past it leaves it
    naming nothing, a later commit into the head leaves it where it is. Only while the head is still that
    commit's (a continuation since froze it there already; a cut since took it). A deleted key stays deleted
    unless this set ``written`` a turn under it (as the framework's store keeps what is set after a delete)."""
    async with db.transaction(write=True, doing="pinning a response id") as conn:
        head = select(_S.version, _S.next_seq).where(_S.id == session_id)
        if conn.dialect.name == "postgresql":  # a commit into the session waits, and a continuation's freeze
            head = head.with_for_update()
        found = (await conn.execute(head)).first()
        if found is None or found.version != version:
            return
        r = responses_t.c
        own = (r.session_id == key, r.response_id == key)
        pinned = (await conn.execute(select(r.seq_end).where(*own))).first()
        if pinned is None:
            await insert_row(conn, {"session_id": session_id, "response_id": key, "user_id": user_id,
                                    "version": version, "seq_end": found.next_seq, "created_at": datetime.now(UTC)},
                             None)  # fmt: skip
        elif pinned.seq_end != GONE or written:  # (an empty session set under a deleted key revives nothing)
            await conn.execute(update(responses_t).where(*own).values(session_id=session_id, seq_end=found.next_seq,
                                                                      version=version))  # fmt: skip


@dataclass(frozen=True)
class Branched:
    """A branch made in a transaction, for :func:`adopt` once that transaction has committed."""

    session_id: str
    base_id: str
    incarnation: int
    stamp: int
    own_keys: tuple[str, ...]


async def branch(conn: AsyncConnection, run: Run, point: Point, now: datetime | None = None) -> Branched:
    """Start a branch at ``point`` for ``run``: a session of its own whose history before ``point.seq_end`` is
    the base's, with the run's loaded own keys as its state (fresh stamps). Nothing of ``run`` changes here: its
    transaction may still fail; :func:`adopt` it after the commit, and the run commits there next."""
    now = now or datetime.now(UTC)
    if run.user_id is not None:  # creates one of the user's sessions: as a fork does, never beside an erasure
        await sql.lock_user(conn, run.user_id, exclusive=False)
        if await erasures.erased_since(conn, run.user_id, run.fence_since()):
            raise sql.not_found(point.session_id, run.user_id)
    query = select(sessions_t).where(_S.id == point.session_id)
    if conn.dialect.name == "postgresql":  # FOR SHARE: a purge skips the base until the branch is in, a cut waits
        query = query.with_for_update(read=True)
    base = (await conn.execute(query)).first()
    if base is None or base.user_id != run.user_id:
        raise sql.not_found(point.session_id, run.user_id)
    await _still_there(conn, run, point, base)
    new_id = f"{point.key[:200]}~{sql.new_stamp():x}"
    row = chains.branch_row(base, new_id, point.seq_end, point.version, sql.new_stamp(), now, _expiry(run, base, now))
    await conn.execute(sessions_t.insert(), row)
    stamp = sql.new_stamp()
    own = {k: v for k, v in run.snapshot.state_text.items() if not _shared(k)}
    if own:
        await conn.execute(state_t.insert(), [{"session_id": new_id, "key": k, "value": v, "version": stamp,
                                               "updated_at": now} for k, v in own.items()])  # fmt: skip
    # Its history is kept from now on (its first keys are not changes: no history row of version 0)
    await conn.execute(update(sessions_t).where(_S.id == new_id).values(keeps_history=True))
    return Branched(new_id, base.id, row["incarnation"], stamp, tuple(own))


def _expiry(run: Run, base: Any, now: datetime) -> datetime | None:
    """A new branch is activity now: it expires as a commit now would set it (statements.py, ``_expires``)."""
    ttl = base.ttl_seconds or run.db.settings.idle_ttl_seconds
    return now + timedelta(seconds=ttl) if ttl else None


async def _still_there(conn: AsyncConnection, run: Run, point: Point, base: Any) -> None:
    """The history ``point`` names is still the base's (under its lock): a truncate or a clear since the run
    loaded it cut it away, and a branch must never read other messages under the same seqs. Its key may have been
    deleted meanwhile: that takes the key, not the history, and a turn already continuing from it lands (as in the
    framework's in-memory store, where a request holds its own copy)."""
    gone = point.seq_end > base.next_seq
    if not gone and point.seq_end > (base.base_seq or 0):  # it reads some of the base: the session the run loaded
        # (found by an outside review: a delete and a new session of the id between the run's commit and this)
        gone = base.incarnation != run.snapshot.incarnation
    if not gone and point.seq_end > (base.base_seq or 0):  # its last message is still the one the run loaded
        last = (await conn.execute(select(_M.message_id).where(_M.session_id == point.session_id,
                                                               _M.seq == point.seq_end - 1))).scalar()  # fmt: skip
        gone = last is None or last not in run.snapshot.message_ids
    if gone:
        raise ConflictError(point.session_id, [], reason=f"the history {point.key!r} named was cut (truncate or "
                                                         "clear) after this run loaded it: load it again")  # fmt: skip


def adopt(run: Run, branched: Branched) -> None:
    """The run commits into the branch from now on (after the branch's transaction committed)."""
    snap = run.snapshot
    for key in branched.own_keys:
        snap.state_stamp[key] = branched.stamp
    snap.exists, snap.incarnation, snap.version = True, branched.incarnation, 0
    run.storage_id, run.base_id = branched.session_id, branched.base_id
    run.key_scopes = scopes(branched.session_id, run.user_id, run.db.settings.app_id)
