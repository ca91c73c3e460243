"""``Store.warm_up``: open a pool's connections at once and ready each for its first runs.

A pool opens connections as they are first needed; a service calls this at start-up so its first burst of runs does
not wait on connection set-up, and so a wrong URL or a down server fails there, not later. PostgreSQL parses and plans
a statement per connection: each connection runs a load's statements once (for an id no run uses: they only read),
then the run layer's ``commits`` (run/priming.py: a run's commits, rolled back). The first load on a cold connection
took 26-47 ms against 2-9 ms after; without this, a burst of runs on new connections pays it all at once (S2's first
second, bench/README.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db import tenancy
from agent_store.db.connections import checkout, quietly
from agent_store.db.database import Database
from agent_store.db.load_statement import load_statement
from agent_store.db.translation import translated
from agent_store.errors import InvalidValueError

logger = logging.getLogger("agent_store")
WARM_UP_ID = "agent_store warm-up"  # the session and user id a warm-up's loads read (and never write)
Primer = Callable[[AsyncConnection], Awaitable[None]]


async def open_and_ready(db: Database, connections: int | None, commits: Primer | None) -> int:
    """Check the schema, then open ``connections`` pooled connections at once (default: all the pool keeps) and
    ready each; every one goes back to the pool, also when the warm-up fails or is cancelled half-way."""
    size = getattr(db.engine.pool, "size", None)
    keeps = size() if callable(size) else 1  # a pool without a size (NullPool) keeps nothing: open one
    wanted = (keeps or 1) if connections is None else connections
    if type(wanted) is not int or wanted < 1 or (keeps and wanted > keeps):  # pool_size=0: no limit
        raise InvalidValueError(f"connections must be an int from 1 to the pool's size ({keeps}), not {wanted!r}")
    await db.check_schema()
    with translated(db.url, "opening the pool's connections"):
        opening = [asyncio.ensure_future(checkout(db.engine)) for _ in range(wanted)]
        try:
            opened = await asyncio.gather(*opening, return_exceptions=True)
            ready = [c for c in opened if isinstance(c, AsyncConnection)]
            primed = await asyncio.gather(*(_ready(db, c, commits) for c in ready), return_exceptions=True)
        finally:  # all back to the pool before any failure is raised, cancelled or not (none left stranded)
            for task in opening:
                task.cancel()  # if still opening: checkout() hands a connection it opens late back itself
            ready = [t.result() for t in opening if t.done() and not t.cancelled() and t.exception() is None]
            await asyncio.shield(_give_back(ready))  # a cancel meanwhile does not stop it half-way
        failures = [f for f in [*opened, *primed] if isinstance(f, BaseException)]
        for other in failures[1:]:  # one is raised; the others are said, not dropped
            logger.warning("warm-up: another connection failed too: %s: %s", type(other).__name__, other)
        if failures:
            raise failures[0]
    return wanted


async def _ready(db: Database, conn: AsyncConnection, commits: Primer | None) -> None:
    await tenancy.learn(db, conn)  # the primed commits name their user under row-level security
    for with_user, limit in ((False, None), (True, None), (False, 20), (True, 20)):
        statement, params = load_statement(WARM_UP_ID, WARM_UP_ID if with_user else None, db.settings.app_id, limit)
        await db.driver.fetch(conn, statement, params, lost=db.lost("warming up a connection"))
    if commits is not None:
        await commits(conn)


async def _give_back(connections: list[AsyncConnection]) -> None:
    for conn in connections:
        await quietly(conn.close, "returning a connection")
