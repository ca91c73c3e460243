"""A new connection's first commits, made by ``Store.warm_up`` before a run needs them (PostgreSQL).

PostgreSQL compiles a PL/pgSQL function, and plans each statement in it, on a connection's first call: a new
connection's first commit took 19-21 ms against 4-5 ms for the next ones (``bench/studies/first_commit.py``). A burst of
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
from agent_store.db import tenancy
from agent_store.db.database import Database
from agent_store.db.translation import translated
from agent_store.db.warm_up import WARM_UP_ID
from agent_store.errors import (
    CheckedPathNeeded,
    ConfigurationError,
    DatabaseError,
    StorageUnavailableError,
)
from agent_store.run.commit import Run
from agent_store.run.snapshot import Snapshot
from agent_store.run.stored_session import StoredSession

logger = logging.getLogger("agent_store")
READ_ONLY, NO_PRIVILEGE = "25006", "42501"  # a read-only transaction (a standby, default_transaction_read_only)
NO_TOKENS = {"input_token_count": 0, "output_token_count": 0, "total_token_count": 0}


async def prime_commits(db: Database, conn: AsyncConnection) -> None:
    """The commit function's two common calls on ``conn``, rolled back (nothing on SQLite: no function to plan)."""
    if db.dialect != "postgresql":
        return
    who = f"{WARM_UP_ID} {uuid.uuid4().hex}"
    payloads = _payloads(db, who)  # before BEGIN: a slow cipher never holds the transaction open
    await conn.execute(text("SELECT 1"))  # BEGIN: the driver's calls below are inside it
    try:
        if db.row_security:  # the warm-up's own user, named as a run's commit names its user (db/tenancy.py)
            await conn.execute(tenancy.NAME, {"user": who, "app": db.settings.app_id})
        for turn, payload in enumerate(payloads, start=1):
            try:
                with translated(db.url, "warming up a connection's commits"):
                    rows = await db.driver.fetch(conn, commit_postgresql.CALL_WITH_USAGE, {"p": payload},
                                                 lost=db.lost("warming up a connection's commits"))  # fmt: skip
            except CheckedPathNeeded as exc:  # a run would take the checked path; a warm-up's call must not
                raise DatabaseError(f"the commit function refused the warm-up's commit {turn}: {exc}") from exc
            except (ConfigurationError, StorageUnavailableError) as exc:
                state = getattr(exc.__cause__, "sqlstate", None)
                if state not in (READ_ONLY, NO_PRIVILEGE):
                    raise
                # A standby or a read-only session (`agent-store ui` on one, say) only reads: that is said at
                # INFO. A role without a privilege the commit needs will fail its runs' commits: a warning.
                level = logging.INFO if state == READ_ONLY else logging.WARNING
                logger.log(level, "warm-up: the connection may not write (%s); its commits are not primed", exc)
                return
            if int(rows[0][0]) != turn:  # the new version: the call went all the way through
                raise DatabaseError(f"the warm-up's commit {turn} returned version {rows[0][0]}")
    finally:
        await conn.rollback()


def _payloads(db: Database, who: str) -> list[str]:
    """The calls of a new session's first run and of its second run, as commit_postgresql sends them."""
    snapshot, payloads = Snapshot(), []
    for turn in (1, 2):
        run = Run(db, StoredSession(session_id=who), snapshot, user_id=who, agent_id=None)
        run.history.extend([Message(role="user", contents=["warm-up"]), Message(role="assistant", contents=["ok"])])
        run.add_usage(NO_TOKENS)
        run.session.state[f"turn {turn}"] = turn
        run.session.state[f"user:turn {turn}"] = turn
        delta = run.next_delta()
        payloads.append(commit_postgresql.payload(run.call_for(delta)))
        snapshot = Snapshot(exists=True, incarnation=delta.incarnation, version=turn)
    return payloads
