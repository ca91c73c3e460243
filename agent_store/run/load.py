"""Step 1 of a run: read one session (row, state of every scope, pair-safe history) and rebuild its AgentSession.

One statement (load_statement.py), which is a consistent snapshot by itself; the connection goes back to the
pool before the agent runs. What is loaded becomes the run's Snapshot, which the commit (commit.py) diffs against.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from agent_framework import Message
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection

import agent_store.telemetry as telemetry
from agent_store.db import codec, message_decode, message_rows, sealing, tenancy
from agent_store.db.branch_deletes import delete_if_expired
from agent_store.db.database import Database
from agent_store.db.load_statement import MESSAGE, POSITION_STEP, SESSION, load_statement
from agent_store.errors import InvalidValueError, SessionExpiredError
from agent_store.run.commit import HISTORY_KEY, KEY_MAX, Run
from agent_store.run.delta import IdentifiedHistory, close_tool_pairs, pair_safe_tail
from agent_store.run.session_row import checked_session

SEQ_MAX = 2**31 - 1  # seq is a 32-bit integer column
MAX_REMEASURES = 3  # commits between a window's reads before it is read whole instead


@tenancy.for_user
async def load(
    db: Database, session_id: str, *, user_id: str | None, agent_id: str | None, history_limit: int | None,
    if_expired: str = "error", serialized: bool = False, run_id: str | None = None,
    answered: frozenset[str] = frozenset(), skip_excluded: bool = False,
) -> Run:  # fmt: skip
    """Read one session in one statement (its own snapshot) and rebuild its ``AgentSession``.

    An expired session raises :class:`SessionExpiredError`, or with ``if_expired="restart"`` is deleted and
    replaced by a fresh one; a closed session raises :class:`SessionClosedError`. A ``serialized`` run holds its
    session's lock (PostgreSQL advisory lock; SQLite write lock) and a connection from load to commit, so
    concurrent serialized runs on a session queue instead of conflicting. ``answered``: call ids whose results
    are in the request about to be made (a tool loop in progress), so their calls are not closed as interrupted.
    ``skip_excluded``: read only the messages a compaction left included (what a history provider with
    ``skip_excluded=True`` hands the model), in the framework's list order. A branch (0017) is read through its
    bases (run/points.py).
    """
    codec.check_id(session_id, "session_id", required=True)
    codec.check_id(user_id, "user_id")
    codec.check_id(agent_id, "agent_id")
    codec.check_id(run_id, "run_id")
    if run_id is not None and len(run_id) > KEY_MAX:
        raise InvalidValueError(f"run_id must be at most {KEY_MAX} characters")
    if history_limit is not None and (type(history_limit) is not int or history_limit < 0):
        raise InvalidValueError(f"history_limit must be a non-negative int or None, not {history_limit!r}")
    if history_limit is not None and history_limit >= SEQ_MAX:  # more than a session can hold: all of it
        history_limit = None
    if if_expired not in ("error", "restart"):
        raise InvalidValueError(f'if_expired must be "error" or "restart", not {if_expired!r}')
    read_at = datetime.now(UTC)  # before the read: an erasure from then on fences the run (not after decoding)
    with telemetry.operation("load", session_id=session_id):
        held = await db.hold(session_id) if serialized else None
        try:
            try:
                run = await _read(db, session_id, user_id, agent_id, history_limit, held, answered, skip_excluded)
            except SessionExpiredError:
                if if_expired == "error":
                    raise
                async with db.transaction(write=True, doing="restarting an expired session", held=held) as conn:
                    await delete_if_expired(conn, session_id, user_id, datetime.now(UTC))
                run = await _read(db, session_id, user_id, agent_id, history_limit, held, answered, skip_excluded)
        except BaseException:
            if held is not None:
                await db.release(held, commit=False)  # a rollback's failure is logged there, never raised
            raise
    run.held, run.idempotency_key, run.read_at = held, run_id, read_at
    if run.base_id is not None:  # a branch (0017): its history is read through its bases
        return await _branch_head(db, run, history_limit, serialized, skip_excluded)
    return run


async def _branch_head(
    db: Database, loaded: Run, history_limit: int | None, serialized: bool, skip_excluded: bool
) -> Run:  # fmt: skip
    import agent_store.run.points as points

    if serialized or skip_excluded:
        await loaded.discard()
        raise InvalidValueError("a branch of a conversation (a response's session) is loaded whole: serialized and "
                                "skip_excluded runs are not available on it")  # fmt: skip
    snap = loaded.snapshot
    head = points.Point(key=loaded.storage_id, session_id=loaded.storage_id, seq_end=snap.end // POSITION_STEP,
                        version=snap.version, recorded=False, is_head=False)
    run = await points.load_point(db, head, user_id=loaded.user_id, agent_id=loaded.agent_id,
                                  history_limit=history_limit)  # fmt: skip
    run.idempotency_key, run.read_at = loaded.idempotency_key, loaded.read_at  # read_at: the earlier read's
    # (the erasure fence)
    return run


async def _read(
    db: Database, session_id: str, user_id: str | None, agent_id: str | None, history_limit: int | None,
    held: AsyncConnection | None, answered: frozenset[str], included_only: bool,
) -> Run:  # fmt: skip
    cipher = await sealing.cipher_for(db, user_id)  # the user's keys, if the store has them (none is fetched later)
    start: int | None = None
    window = history_limit  # what the statement applies (None: the whole history, windowed below instead)
    basis: tuple[int, int] | None = None
    restarts = 0
    while True:  # once, unless the window must be widened past a second call (then re-read from there)
        statement, params = load_statement(session_id, user_id, db.settings.app_id, window, start, included_only)
        rows = await db.one_statement(statement, params, doing="loading a session", held=held)
        row = rows[0] if rows and rows[0].kind == SESSION else None
        found = [r for r in rows if r.kind == MESSAGE]
        if row is None or window is None:
            break
        if start is not None and (row.n1, row.n2) != basis:
            # A commit (a truncate, say) came in between the reads: the seq the re-read started from belongs to
            # the history before it. The window is measured again on the history as it is now; after a few
            # such commits in a row, in one read of the whole history (one snapshot), windowed in memory.
            start, restarts = None, restarts + 1
            window = None if restarts >= MAX_REMEASURES else window
            continue
        basis = (row.n1, row.n2)
        lowest = start if start is not None else max(row.n3 - window, 0)
        # Read again from the window's first message when widening to calls left it inside an earlier turn (it
        # starts with an assistant's call: the statement widens that start back to its user message), or when
        # a result in the widened part lacks its call. Each re-read starts lower: it ends. (Rows come in list
        # order; the window is by seq, so its start is the row of the lowest seq.)
        first = min(found, key=lambda r: int(r.n1)) if found else None
        mid_turn = first is not None and first.other != "user" and first.n1 > 0
        if not (first is not None and first.n1 < lowest and (mid_turn or _orphan_results(found, cipher))):
            break
        start = first.n1
    snap, session = checked_session(rows, session_id, user_id, agent_id, cipher)
    # Each row is let go as soon as its message is built: rows are namedtuples, which the collector never
    # untracks, so rows still held when a young collection runs mid-decode would be promoted to the old
    # generation, whose size decides when the next full collection (a whole-process pause) comes.
    del rows
    found.reverse()
    messages: list[Message] = []
    loaded: list[tuple[str, int, int, dict[str, Any] | None]] = []  # key, seq, position, marks as loaded
    while found:
        message = found.pop()
        messages.append(_message(message, cipher))
        # The message got copies of its marks (message_decode); a summary's links only if they were read.
        marks = (message_rows.with_links(message.marks, message.links) or {}) if message.marks else None
        loaded.append((message.key, message.n1, message.n3, marks))
    if window is None and history_limit is not None:  # the whole history was read: its pair-safe tail
        messages = pair_safe_tail(messages, history_limit) if history_limit else []
        loaded = loaded[len(loaded) - len(messages) :]
    snap.message_ids.update(key for key, _seq, _place, _marks in loaded)
    snap.windowed = history_limit is not None and bool(loaded) and min(seq for _key, seq, _p, _m in loaded) > 0
    snap.included_only = included_only
    for key, _seq, place, marks in loaded:  # where each message is in the list, and its marks as loaded
        snap.places[key] = place
        if marks is not None:
            snap.marks[key] = marks
    messages, synthetic = close_tool_pairs(messages, answered)
    snap.message_ids |= synthetic  # handed to the model, never stored
    history = session.state.get(HISTORY_KEY)
    # The loaded list as is: every message in it has its store id already (message_decode), so not the
    # IdentifiedHistory's own assignment, which is for the lists the framework sets later.
    session.state[HISTORY_KEY] = IdentifiedHistory({**(history if isinstance(history, dict) else {}),
                                                    "messages": messages})  # fmt: skip
    run = Run(db, session, snap, user_id=user_id, agent_id=agent_id)
    run.base_id, run.cipher = (row.author if row is not None else None), cipher
    return run


def _message(row: Row[Any], cipher: message_rows.MessageCipher | None) -> Message:
    marks = message_rows.with_links(row.marks, row.links)
    return message_decode.message_from_row(row.doc, cipher, identity=row.key, role=row.other, author_name=row.author,
                                         text=row.text, marks=marks)  # fmt: skip


def _orphan_results(rows: Sequence[Row[Any]], cipher: message_rows.MessageCipher | None) -> bool:
    calls: set[str] = set()
    for row in rows:
        for content in _message(row, cipher).contents:
            if content.type == "function_call":
                calls.add(content.call_id or "")
            elif content.type == "function_result" and content.call_id not in calls:
                return True
    return False
