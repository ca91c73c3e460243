"""A load's session row, state and budget rows (load_statement.py), checked and turned into a Snapshot and an
AgentSession without history: run/load.py for a session, run/points.py for a point of one."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from agent_store.db import codec, ledger, sealing
from agent_store.db import statements as sql
from agent_store.db.load_statement import BUDGET, POSITION_STEP, SESSION, STATE
from agent_store.errors import SessionClosedError, SessionExpiredError
from agent_store.run.commit import StoredSession
from agent_store.run.snapshot import Snapshot

__all__ = ["checked_session"]


def checked_session(
    rows: Sequence[Any], session_id: str, user_id: str | None, agent_id: str | None, cipher: Any = None
) -> tuple[Snapshot, StoredSession]:  # fmt: skip
    """The session row, state and budget rows of a load (load_statement.py), checked (another user's or agent's
    session is not found, an expired or closed one refused, a spent budget refuses the run), as a Snapshot and
    an AgentSession without history (run/point_reads.py reads a point's with the same rows). ``cipher``: the
    user's keys, which open sealed state values (db/sealing.py)."""
    row = rows[0] if rows and rows[0].kind == SESSION else None
    if row is not None:
        if row.key != user_id or row.other not in (None, agent_id):
            raise sql.not_found(session_id, user_id, starting=True)  # the same answer as for an unused id
        if row.t2 is not None and row.t2 <= datetime.now(UTC):  # first: if_expired="restart" also replaces a
            raise SessionExpiredError(f"session {session_id!r} expired at {row.t2.isoformat()}")  # half-purged one
        if row.t1 is not None:
            raise SessionClosedError(f"session {session_id!r} was closed at {row.t1.isoformat()}")
    budgets = [r for r in rows if r.kind == BUDGET]
    ledger.refuse_if_spent(budgets, datetime.now(UTC))
    snap = Snapshot(budgeted=bool(budgets))
    session = StoredSession(session_id=session_id)
    for state in (r for r in rows if r.kind == STATE):
        full_key = state.other + state.key
        doc, text = sealing.open_state(cipher, full_key, state.doc)
        snap.state_text[full_key] = text or codec.dumps(doc, where=f"state[{full_key!r}]", max_bytes=2**62)
        snap.state_stamp[full_key] = state.n1
        session.state[full_key] = codec.decode_state(doc, key=full_key)
    if row is not None:
        snap.exists, snap.incarnation, snap.version = True, row.n1, row.n2
        snap.service_session_id = session.service_session_id = row.doc
        snap.end = row.n3 * POSITION_STEP
    return snap, session
