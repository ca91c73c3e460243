"""Small helpers shared by the test modules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import make_url, text

from agent_store import StorageUnavailableError, Store


async def rows(store: Store, sql: str, **params: object) -> list[tuple[Any, ...]]:
    """The rows of a plain SQL query, as tuples."""
    async with store.engine.connect() as conn:
        return [tuple(r) for r in (await conn.execute(text(sql), params)).all()]


def lose_the_reply(store: Store) -> None:
    """The next commit reaches the database and commits; the caller is told it failed (outcome unknown).

    A commit is a COMMIT (the checked path), or the one-call commit of the common case (PostgreSQL: the
    ``agent_store_commit`` call on the driver; SQLite: one hop to the connection's thread): whichever comes
    first is "lost", once.
    """
    dialect = store.engine.sync_engine.dialect
    real_commit = dialect.do_commit
    db = store.db
    real_fetch, real_hop = db.driver.fetch, db.in_sqlite_thread

    def disarm() -> None:
        dialect.do_commit = real_commit  # type: ignore[method-assign]
        db.driver.fetch, db.in_sqlite_thread = real_fetch, real_hop  # type: ignore[method-assign]

    def commit_then_lose(dbapi_connection: object) -> None:
        real_commit(dbapi_connection)  # the database has the run ...
        disarm()
        raise dialect.loaded_dbapi.OperationalError("connection lost")  # ... but the caller never hears

    async def call_then_lose(conn: Any, statement: Any, params: Any, *, lost: str) -> Any:
        result = await real_fetch(conn, statement, params, lost=lost)
        if "agent_store_commit" in str(statement):
            disarm()
            raise StorageUnavailableError(f"{lost}: the reply was lost (connection lost)")
        return result

    async def hop_then_lose(work: Any, *, doing: str, committing: Any) -> Any:
        await real_hop(work, doing=doing, committing=committing)
        disarm()
        raise StorageUnavailableError(f"{doing} failed: the reply was lost (connection lost)")

    dialect.do_commit = commit_then_lose  # type: ignore[method-assign]
    db.driver.fetch, db.in_sqlite_thread = call_then_lose, hop_then_lose  # type: ignore[method-assign]


async def expire_now(store: Store, session_id: str) -> None:
    """Make a session's idle time-to-live run out now (SQLite keeps naive UTC text, PostgreSQL timestamptz)."""
    async with store.engine.begin() as conn:
        past = datetime.now(UTC) - timedelta(seconds=1)
        value = past.replace(tzinfo=None) if conn.dialect.name == "sqlite" else past
        await conn.execute(
            text("UPDATE agent_sessions SET expires_at = :t WHERE id = :s"), {"t": value, "s": session_id}
        )


def plain_dsn(sa_url: str) -> str:
    """The libpq URL of a ``postgresql+asyncpg://`` one, for a raw asyncpg connection (the query dropped)."""
    return make_url(sa_url).set(drivername="postgresql", query={}).render_as_string(hide_password=False)
