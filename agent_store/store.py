"""The Store: one engine (and its pool) plus the verbs an application calls."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from types import TracebackType
from typing import Any

from agent_framework import AgentSession
from sqlalchemy import delete
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from . import codec
from .codec import check_id
from .engine import check_schema, configure_sqlite, make_engine, migration_connection, migrations_dir
from .errors import ConfigurationError, translated
from .run import Run, load
from .tables import sessions_t


class Store:
    """Durable Agent Framework sessions in SQLite or PostgreSQL.

    Create one per process with :meth:`from_url` (or ``Store(engine)`` to share an existing
    ``AsyncEngine``) and close it with ``await store.close()`` or ``async with``.

    Args:
        engine: an async SQLAlchemy engine on ``sqlite+aiosqlite`` or ``postgresql+asyncpg``.
        app_id: the application whose ``app:`` state keys this store reads and writes.
        idle_ttl: sessions expire this long after their last run, unless they set their own ``ttl``.
        max_value_bytes: the largest state value or message (as JSON) a run may write.
        check_schema: verify once, before first use, that the database is at this code's schema.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        app_id: str = "default",
        idle_ttl: timedelta | None = None,
        max_value_bytes: int = codec.DEFAULT_MAX_VALUE_BYTES,
        check_schema: bool = True,
    ) -> None:
        if engine.dialect.name not in ("sqlite", "postgresql") or not engine.dialect.is_async:
            raise ConfigurationError(f"unsupported engine dialect {engine.dialect.name!r}: use aiosqlite or asyncpg")
        configure_sqlite(engine)
        self.engine = engine
        self.app_id = app_id
        self.idle_ttl_seconds = int(idle_ttl.total_seconds()) if idle_ttl else None
        self.max_value_bytes = max_value_bytes
        self._schema_ok = not check_schema

    @classmethod
    def from_url(cls, url: str | URL | None = None, **options: Any) -> Store:
        """Open a store on ``url``; without one, ``$AGENT_STORE_URL``, else ``sqlite+aiosqlite:///agent_store.db``.

        Keyword options go to :class:`Store` (``max_value_bytes``, ``check_schema``) or, for any other
        name, to ``create_async_engine`` (``pool_size``, ``echo``, ...). No connection is made here.

        Raises:
            ConfigurationError: malformed URL, a sync driver (``postgresql://``, ``sqlite://``), or in-memory SQLite.
        """
        store_options = {
            k: options.pop(k) for k in ("app_id", "idle_ttl", "max_value_bytes", "check_schema") if k in options
        }
        return cls(make_engine(url, **options), **store_options)

    @property
    def url(self) -> URL:
        return self.engine.url

    async def migrate(self, revision: str = "head") -> None:
        """Upgrade the schema to ``revision`` with the shipped migrations (same as ``alembic upgrade``)."""
        await self._alembic("upgrade", revision)

    async def downgrade(self, revision: str) -> None:
        """Downgrade the schema to ``revision`` (``"base"`` drops every agent_store table)."""
        await self._alembic("downgrade", revision)

    async def _alembic(self, verb: str, revision: str) -> None:
        from alembic import command
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(migrations_dir()))

        def run(sync_conn: Any) -> None:
            config.attributes["connection"] = sync_conn
            getattr(command, verb)(config, revision)

        with translated(self.url, f"schema {verb}"):
            async with migration_connection(self.engine) as conn:
                await conn.run_sync(run)
        self._schema_ok = False

    async def load(
        self,
        session_id: str,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        history_limit: int | None = None,
    ) -> Run:
        """Load a session for one run; commit it with ``await run.commit()``. See :meth:`session`."""
        return await load(self, session_id, user_id=user_id, agent_id=agent_id, history_limit=history_limit)

    @asynccontextmanager
    async def session(
        self,
        session_id: str,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        history_limit: int | None = None,
    ) -> AsyncIterator[AgentSession]:
        """Yield the stored session as an ``AgentSession``; commit what changed when the block exits.

        The session is created on first use. ``history_limit`` loads only the last N messages (the
        database keeps them all). If the block raises, nothing is written and the exception propagates.

        Raises:
            SessionNotFoundError: the id belongs to another user, or to another agent.
            ConflictError: on exit, another run changed the same state keys first.
            InvalidValueError: a state value or message cannot be stored.
            SchemaError: the database is not at this code's schema.
            StorageUnavailableError: the database cannot be reached.
        """
        run = await self.load(session_id, user_id=user_id, agent_id=agent_id, history_limit=history_limit)
        yield run.session
        await run.commit()

    async def delete(self, session_id: str, *, user_id: str | None = None) -> bool:
        """Delete a session with its messages, state and run log in one transaction; False if there was none."""
        check_id(session_id, "session_id", required=True)
        check_id(user_id, "user_id")
        async with self._transaction(write=True, doing="deleting a session") as db:
            done = await db.execute(
                delete(sessions_t).where(
                    sessions_t.c.id == session_id, sessions_t.c.user_id.is_not_distinct_from(user_id)
                )
            )
        return bool(done.rowcount)

    @asynccontextmanager
    async def _transaction(self, *, write: bool, doing: str) -> AsyncIterator[AsyncConnection]:
        """A short transaction: a consistent snapshot for reads, the SQLite write lock up front for writes."""
        with translated(self.url, doing):
            if not self._schema_ok:
                async with self.engine.connect() as conn:
                    await check_schema(conn, self.url)
                self._schema_ok = True
            async with self.engine.connect() as conn:
                if conn.dialect.name == "sqlite":
                    conn = await conn.execution_options(agent_store_begin="immediate" if write else "deferred")
                elif not write:
                    conn = await conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
                async with conn.begin():
                    yield conn

    async def close(self) -> None:
        """Close every pooled connection."""
        await self.engine.dispose()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
