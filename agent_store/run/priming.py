"""A new connection's first commits, made by ``Store.warm_up`` before a run needs them (PostgreSQL).

PostgreSQL compiles a PL/pgSQL function, and plans each statement in it, on a connection's first call: a new
connection's first commit took 19-21 ms against 4-5 ms for the next ones (``bench/first_commit.py``). A burst of
runs on a pool of new connections paid it all at once (S2's first second in bench/README.md).

So each connection makes the two commits a run makes most: a new session's, then a second run on it. They carry two
messages, a model call, and a key of the session and of the user, as a turn does. They go through the real payload
code (commit_postgresql.payload), so they stay the calls a run sends. Both run in one transaction that is rolled
back: nothing is kept. Each connection uses a session and user id of its own, so parallel primings never wait on
each other. The call records no tokens, so no budget row is locked.
"""

from __future__ import annotations

import logging
import uuid

from agent_framework import Message
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

import agent_store.run.commit_postgresql as commit_postgresql
from agent_store.db.database import WARM_UP_ID, Database
from agent_store.errors import (
    CheckedPathNeeded,
    ConfigurationError,
    DatabaseError,
    StorageUnavailableError,
    translated,
)
from agent_store.run.commit import Run
from agent_store.run.snapshot import Snapshot
from agent_store.run.stored_session import StoredSession

logger = logging.getLogger("agent_store")
CANNOT_WRITE = {"25006", "42501"}  # a read-only transaction (a standby, default_transaction_read_only); no privilege
NO_TOKENS = {"input_token_count": 0, "output_token_count": 0, "total_token_count": 0}


async def prime_commits(db: Database, conn: AsyncConnection) -> None:
    """The commit function's two common calls on ``conn``, rolled back (nothing on SQLite: no function to plan)."""
    if db.dialect != "postgresql":
        return
    who = f"{WARM_UP_ID} {uuid.uuid4().hex}"
    snapshot = Snapshot()
    await conn.execute(text("SELECT 1"))  # BEGIN: the driver's calls below are inside it
    try:
        for turn in (1, 2):  # a new session, then a second run on it
            run = Run(db, StoredSession(session_id=who), snapshot, user_id=who, agent_id=None)
            run.history.extend([Message(role="user", contents=["warm-up"]), Message(role="assistant", contents=["ok"])])
            run.add_usage(NO_TOKENS)
            run.session.state[f"turn {turn}"] = turn
            run.session.state[f"user:turn {turn}"] = turn
            delta = run._delta()
            call = run._one_call(delta)
            statement, params = commit_postgresql.CALL_WITH_USAGE, {"p": commit_postgresql.payload(call)}
            try:
                with translated(db.url, "warming up a connection's commits"):
                    rows = await db.driver.fetch(conn, statement, params, lost="warming up a connection")  # as sent
            except CheckedPathNeeded as exc:  # a run would take the checked path; a warm-up's call must not
                raise DatabaseError(f"the commit function refused the warm-up's commit {turn}: {exc}") from exc
            except (ConfigurationError, StorageUnavailableError) as exc:
                if getattr(exc.__cause__, "sqlstate", None) not in CANNOT_WRITE:
                    raise
                # A standby or a role that may only read (`agent-store ui` on one, say): its warm-up only reads.
                logger.info("warm-up: the connection may not write (%s); its commits are not primed", exc)
                return
            if int(rows[0][0]) != turn:  # the new version: the call went all the way through
                raise DatabaseError(f"the warm-up's commit {turn} returned version {rows[0][0]}")
            snapshot = Snapshot(exists=True, incarnation=delta.incarnation, version=turn)
    finally:
        await conn.rollback()
