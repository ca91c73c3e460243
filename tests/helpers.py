"""Small helpers shared by the test modules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import event, text

from agent_store import Store


async def rows(store: Store, sql: str, **params: object) -> list[tuple[Any, ...]]:
    """The rows of a plain SQL query, as tuples."""
    async with store.engine.connect() as conn:
        return [tuple(r) for r in (await conn.execute(text(sql), params)).all()]


def lose_the_reply(store: Store) -> None:
    """The next commit reaches the database and commits; the caller is told the connection was lost.

    A commit is a COMMIT (the checked path), or on PostgreSQL the one-round-trip ``agent_store_commit`` call,
    which is its own transaction: whichever comes first is "lost", once.
    """
    engine = store.engine.sync_engine
    dialect = engine.dialect
    real_commit = dialect.do_commit
    armed = [True]

    def lose() -> None:
        armed[0] = False
        dialect.do_commit = real_commit  # type: ignore[method-assign]
        raise dialect.loaded_dbapi.OperationalError("connection lost")  # ... but the caller never hears

    def commit_then_lose(dbapi_connection: object) -> None:
        real_commit(dbapi_connection)  # the database has the run ...
        lose()

    def call_then_lose(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if armed[0] and "agent_store_commit" in statement:
            lose()

    dialect.do_commit = commit_then_lose  # type: ignore[method-assign]
    event.listen(engine, "after_cursor_execute", call_then_lose)


async def expire_now(store: Store, session_id: str) -> None:
    """Make a session's idle time-to-live run out now (SQLite keeps naive UTC text, PostgreSQL timestamptz)."""
    async with store.engine.begin() as conn:
        past = datetime.now(UTC) - timedelta(seconds=1)
        value = past.replace(tzinfo=None) if conn.dialect.name == "sqlite" else past
        await conn.execute(
            text("UPDATE agent_sessions SET expires_at = :t WHERE id = :s"), {"t": value, "s": session_id}
        )
