"""The run log (``agent_runs``): what each commit records, and how a retried commit finds that it landed."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db import erasures, ledger
from agent_store.db.database import Database
from agent_store.db.ledger import ModelCall, totals
from agent_store.db.message_rows import EncodedMessage
from agent_store.db.tables import runs_t, sessions_t
from agent_store.errors import AgentStoreError

logger = logging.getLogger("agent_store")


async def record_run(db: AsyncConnection, row: dict[str, Any]) -> None:
    await db.execute(insert(runs_t), row)


async def record_unwritten(
    database: Database, row: dict[str, Any], calls: Sequence[ledger.ModelCall], *, user_id: str | None,
    agent_id: str | None, incarnation: int | None, since: datetime,
) -> None:  # fmt: skip
    """A run that wrote nothing (a conflict, a failure) and its model calls, in a transaction of its own. A
    failure to log it is logged, never raised: the run's own refusal is what its caller must see.

    Only into the session the run loaded: the same life of its id (``incarnation``; None: the run found none, so
    whoever created it since), of the run's user, who was not erased after ``since`` (the run's load). A session
    deleted, re-created or taken by another user since gets no row of this run; the budgets are charged all the
    same (the tokens were spent)."""
    app_id, now = database.settings.app_id, row["committed_at"]
    try:
        async with database.transaction(write=True, doing=f"logging a {row['outcome']} run") as db:
            s = sessions_t.c
            found = await db.execute(
                select(s.user_id, s.incarnation).where(s.id == row["session_id"]).with_for_update()
            )
            owner = found.first()
            ours = (
                owner is not None
                and owner.user_id == user_id
                and incarnation in (None, owner.incarnation)
                and not (user_id is not None and await erasures.erased_since(db, user_id, since))
            )
            if ours:
                await record_run(db, row)
                await ledger.record(db, row, calls, user_id=user_id, agent_id=agent_id, app_id=app_id, now=now)
            else:
                await ledger.charge(db, calls, row["run_id"], user_id=user_id, app_id=app_id, now=now)
    except AgentStoreError:
        logger.warning("could not log the %s run %s", row["outcome"], row["run_id"], exc_info=True)


async def run_recorded(db: AsyncConnection, session_id: str, run_id: str) -> Any:
    """The log row of a committed run (version, messages_written, state_keys_written, messages_rewritten)."""
    c = runs_t.c
    found = await db.execute(
        select(c.version, c.messages_written, c.state_keys_written, c.messages_rewritten).where(
            c.session_id == session_id, c.run_id == run_id, c.outcome == "committed"
        )
    )
    return found.first()


def run_log_row(
    ids: dict[str, Any], version: int, records: Sequence[EncodedMessage], keys: int, usage: dict[str, int], outcome: str
) -> dict[str, Any]:
    """The agent_runs row for one commit (or refused commit): who ran, what went in and out, tokens."""
    roles = [r.columns["role"] for r in records]
    authors = [
        r.columns["author_name"] for r in records if r.columns["role"] == "assistant" and r.columns["author_name"]
    ]
    return {
        **ids,
        "version": version,
        "messages_written": len(records),
        "state_keys_written": keys,
        "committed_at": datetime.now(UTC),
        "agent_name": authors[-1] if authors else None,
        "messages_in": sum(role in ("user", "tool") for role in roles),
        "messages_out": roles.count("assistant"),
        "input_tokens": usage.get("input_token_count"),
        "output_tokens": usage.get("output_token_count"),
        "outcome": outcome,
    }


async def log_unwritten(
    db: Database, outcome: str, calls: list[ModelCall], ids: dict[str, Any], version: int, incarnation: int | None,
    *, user_id: str | None, agent_id: str | None, since: datetime,
) -> None:  # fmt: skip
    """A run that wrote nothing ("conflict", "failed"), with its model calls, in a transaction of its own (a run's
    ``log_unwritten``). ``calls`` is cleared in place (recorders hold the list): spent, whatever becomes of the
    run. ``incarnation``: the one it loaded, None if it created none (whoever made it since)."""
    if outcome != "conflict" and not calls:
        return
    spent = calls[:]
    calls.clear()
    row = run_log_row(ids, version, [], 0, totals(spent), outcome)
    await record_unwritten(db, row, spent, user_id=user_id, agent_id=agent_id, incarnation=incarnation, since=since)
