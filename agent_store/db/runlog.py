"""The run log (``agent_runs``): what each commit records, and how a retried commit finds that it landed."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db.message_rows import EncodedMessage
from agent_store.db.tables import runs_t


async def record_run(db: AsyncConnection, row: dict[str, Any]) -> None:
    await db.execute(insert(runs_t), row)


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
