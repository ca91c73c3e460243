"""Readiness and the figures an operator alerts on (``store.ready()``, ``agent-store check``).

Ready means what a run needs: the database answers, takes writes, and its schema runs this code (at its revision,
or a newer one that keeps it working, compat.py). ``figures=True`` adds what the alerts in docs/operations.md read:

- ``purge_lag_s``: how long the oldest expired session has waited for the purge (0: none waits), and how many
  wait (``expired_waiting``): a purge schedule that stopped shows here first. Index-served (``expires_at``).
- ``runs_last_hour`` / ``conflicts_last_hour``: committed runs and runs refused by a conflict, from the run log
  (``agent_runs``, read whole for the hour: call it every few minutes, not as a probe every second).
- ``stuck_runs``: journaled runs still ``in_progress`` whose worker's lease ran out (a reader or a restarted
  worker ends them; many mean workers die). Index-served.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import false, func, select, text, update

from agent_store.db.database import Database
from agent_store.db.journal_tables import streams_t
from agent_store.db.tables import runs_t, sessions_t

__all__ = ["ready"]


async def ready(db: Database, *, figures: bool = False) -> dict[str, Any]:
    """``{"ok": True, "revision", "latency_ms"}`` (and the figures), or the error a run would meet: a database
    that cannot take a run's commit (a read-only file or URL, a standby) is not ready either."""
    started = time.perf_counter()
    await db.check_schema()
    async with db.transaction(write=True, doing="checking that the database takes writes") as conn:
        # A write that changes nothing, refused as any commit would be (SQLite: "readonly database"; PostgreSQL:
        # a read-only transaction); a row of agent_sessions, which the application's role may update.
        await conn.execute(update(sessions_t).where(false()).values(version=sessions_t.c.version))
    async with db.transaction(write=False, doing="checking readiness") as conn:
        revision = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar()
        found: dict[str, Any] = {"ok": True, "revision": revision}
        if figures:
            now = datetime.now(UTC)
            S, R, J = sessions_t.c, runs_t.c, streams_t.c
            waiting, oldest = (await conn.execute(
                select(func.count(), func.min(S.expires_at)).where(S.expires_at <= now)
            )).one()  # fmt: skip
            hour = (await conn.execute(select(func.count(), func.count().filter(R.outcome == "conflict"))
                                       .where(R.committed_at >= now - timedelta(hours=1)))).one()  # fmt: skip
            stuck = (await conn.execute(
                select(func.count()).where(J.status == "in_progress", J.lease_until < now)
            )).scalar_one()  # fmt: skip
            found |= {"expired_waiting": int(waiting),
                      "purge_lag_s": round((now - oldest).total_seconds()) if oldest is not None else 0,
                      "runs_last_hour": int(hour[0]), "conflicts_last_hour": int(hour[1]),
                      "stuck_runs": int(stuck)}  # fmt: skip
    found["latency_ms"] = round((time.perf_counter() - started) * 1000, 1)
    return found
