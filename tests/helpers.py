"""Small helpers shared by the test modules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text

from agent_store import Store


async def rows(store: Store, sql: str, **params: object) -> list[tuple[Any, ...]]:
    """The rows of a plain SQL query, as tuples."""
    async with store.engine.connect() as conn:
        return [tuple(r) for r in (await conn.execute(text(sql), params)).all()]


def lose_the_reply(store: Store) -> None:
    """The next COMMIT reaches the database and commits; the caller is told the connection was lost."""
    dialect = store.engine.sync_engine.dialect
    real_commit = dialect.do_commit

    def commit_then_lose(dbapi_connection: object) -> None:
        real_commit(dbapi_connection)  # the database has the run ...
        dialect.do_commit = real_commit  # type: ignore[method-assign]
        raise dialect.loaded_dbapi.OperationalError("connection lost")  # ... but the caller never hears

    dialect.do_commit = commit_then_lose  # type: ignore[method-assign]


async def expire_now(store: Store, session_id: str) -> None:
    """Make a session's idle time-to-live run out now (SQLite keeps naive UTC text, PostgreSQL timestamptz)."""
    async with store.engine.begin() as conn:
        past = datetime.now(UTC) - timedelta(seconds=1)
        value = past.replace(tzinfo=None) if conn.dialect.name == "sqlite" else past
        await conn.execute(
            text("UPDATE agent_sessions SET expires_at = :t WHERE id = :s"), {"t": value, "s": session_id}
        )
