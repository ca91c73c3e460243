"""The Store: one engine (and its pool) plus the verbs an application calls."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from datetime import timedelta
from types import TracebackType
from typing import Any

from agent_framework import AgentSession
from sqlalchemy import delete, func, select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from . import codec, lifecycle, transfer
from .codec import check_id
from .engine import check_schema, configure_sqlite, make_engine, migration_connection, migrations_dir
from .errors import ConfigurationError, InvalidValueError, translated
from .models import ErasureReport, MessageRecord, SessionInfo, SessionPage, TransferReport
from .run import Run, load
from .statements import owner_is
from .tables import sessions_t

SESSION_LOCK_CLASS = 1  # pg_advisory_xact_lock(class, key) namespace of serialized runs (see statements.py)


async def _release(conn: AsyncConnection, *, commit: bool) -> None:
    try:
        await (conn.commit() if commit else conn.rollback())
    finally:
        await conn.close()


class Store:
    """Durable Agent Framework sessions in SQLite or PostgreSQL.

    Create one per process with :meth:`from_url` (or ``Store(engine)`` to share an existing
    ``AsyncEngine``) and close it with ``await store.close()`` or ``async with``.

    Args:
        engine: an async SQLAlchemy engine on ``sqlite+aiosqlite`` or ``postgresql+asyncpg``.
        app_id: the application whose ``app:`` state keys this store reads and writes.
        idle_ttl: sessions expire this long after their last run, unless they set their own ``ttl``.
        max_value_bytes: the largest state value or message (as JSON) a run may write.
        message_cipher: encrypts message content at rest (``encrypt(str) -> str``, ``decrypt(str) -> str``).
        check_schema: verify once, before first use, that the database is at this code's schema.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        app_id: str = "default",
        idle_ttl: timedelta | None = None,
        max_value_bytes: int = codec.DEFAULT_MAX_VALUE_BYTES,
        message_cipher: codec.MessageCipher | None = None,
        check_schema: bool = True,
    ) -> None:
        if engine.dialect.name not in ("sqlite", "postgresql") or not engine.dialect.is_async:
            raise ConfigurationError(f"unsupported engine dialect {engine.dialect.name!r}: use aiosqlite or asyncpg")
        configure_sqlite(engine)
        self.engine = engine
        # Two views of one pool: reads see one consistent snapshot; SQLite writes take the write lock up front.
        if engine.dialect.name == "sqlite":
            self._reader = engine.execution_options(agent_store_begin="deferred")
            self._writer = engine.execution_options(agent_store_begin="immediate")
        else:
            self._reader = engine.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
            self._writer = engine
        self.app_id = app_id
        self._replica: AsyncEngine | None = None
        self.message_cipher = message_cipher
        self.idle_ttl_seconds = int(idle_ttl.total_seconds()) if idle_ttl else None
        self.max_value_bytes = max_value_bytes
        self._schema_ok = not check_schema

    @classmethod
    def from_url(cls, url: str | URL | None = None, **options: Any) -> Store:
        """Open a store on ``url``; without one, ``$AGENT_STORE_URL``, else ``sqlite+aiosqlite:///agent_store.db``.

        Keyword options go to :class:`Store` (``app_id``, ``idle_ttl``, ``max_value_bytes``, ``message_cipher``,
        ``check_schema``) or, for any other name, to ``create_async_engine`` (``pool_size``, ``echo``, ...).
        ``replica_url`` sends listings, transcript pages, exports and stats to a read replica (runs always
        load and commit on the primary). No connection is made here.

        Raises:
            ConfigurationError: malformed URL, a sync driver (``postgresql://``, ``sqlite://``), or in-memory SQLite.
        """
        store_options = {
            k: options.pop(k)
            for k in ("app_id", "idle_ttl", "max_value_bytes", "message_cipher", "check_schema")
            if k in options
        }
        replica_url = options.pop("replica_url", None)
        store = cls(make_engine(url, **options), **store_options)
        if replica_url is not None:
            replica = make_engine(replica_url, **options)
            if replica.dialect.name == "postgresql":
                store._replica = replica.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
            else:
                store._replica = replica.execution_options(agent_store_begin="deferred")
        return store

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
        if_expired: str = "error",
        serialized: bool = False,
    ) -> Run:
        """Load a session for one run: ``await run.commit()`` it (or ``run.discard()``). See :meth:`session`."""
        return await load(
            self,
            session_id,
            user_id=user_id,
            agent_id=agent_id,
            history_limit=history_limit,
            if_expired=if_expired,
            serialized=serialized,
        )

    @asynccontextmanager
    async def session(
        self,
        session_id: str,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        history_limit: int | None = None,
        if_expired: str = "error",
        serialized: bool = False,
    ) -> AsyncIterator[AgentSession]:
        """Yield the stored session as an ``AgentSession``; commit what changed when the block exits.

        The session is created on first use. ``history_limit`` loads only the last N messages (the
        database keeps them all). If the block raises, nothing is written and the exception propagates.
        An expired session raises ``SessionExpiredError``, or with ``if_expired="restart"`` starts afresh.
        ``serialized=True`` queues overlapping runs on this session instead of letting them conflict: the run
        holds the session's lock and one pooled connection from load to commit (PostgreSQL advisory lock;
        on SQLite the database write lock, which queues every writer).

        Raises:
            SessionNotFoundError: the id belongs to another user, or to another agent.
            SessionClosedError / SessionExpiredError: the session was closed / outlived its time-to-live.
            ConflictError: on exit, another run changed the same state keys first.
            InvalidValueError: a state value or message cannot be stored.
            SchemaError: the database is not at this code's schema.
            StorageUnavailableError: the database cannot be reached.
        """
        run = await self.load(
            session_id,
            user_id=user_id,
            agent_id=agent_id,
            history_limit=history_limit,
            if_expired=if_expired,
            serialized=serialized,
        )
        try:
            yield run.session
        except BaseException:
            await run.discard()
            raise
        await run.commit()

    # ---- lifecycle: see lifecycle.py and transfer.py --------------------------------------------------

    async def list_sessions(
        self,
        *,
        user_id: str | None = None,
        all_users: bool = False,
        agent_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> SessionPage:
        """A page of ``user_id``'s sessions (every user's with ``all_users=True``), most recently active first.

        ``metadata`` keeps sessions whose metadata has those key/value pairs. Pass the page's ``next_cursor``
        back as ``cursor`` for the next page (keyset pagination: stable and index-served at any depth).
        """
        return await lifecycle.list_sessions(
            self, user_id=user_id, all_users=all_users, agent_id=agent_id, metadata=metadata, limit=limit, cursor=cursor
        )

    async def get(self, session_id: str, *, user_id: str | None = None) -> SessionInfo:
        """One session's summary. Raises ``SessionNotFoundError`` (also for another user's session)."""
        return await lifecycle.get(self, session_id, user_id)

    async def messages(
        self, session_id: str, *, user_id: str | None = None, after_seq: int = -1, limit: int = 100
    ) -> list[MessageRecord]:
        """Up to ``limit`` stored messages with ``seq > after_seq``, in order: page through a transcript."""
        return await lifecycle.messages(self, session_id, user_id, after_seq, limit)

    async def update(self, session_id: str, *, user_id: str | None = None, **changes: Any) -> None:
        """Set a session's ``title`` (str or None), ``metadata`` (a JSON dict) or idle ``ttl`` (a timedelta)."""
        if unknown := set(changes) - {"title", "metadata", "ttl"}:
            raise InvalidValueError(f"update() takes title, metadata and ttl, not {sorted(unknown)}")
        await lifecycle.update_info(self, session_id, user_id, changes)

    async def close_session(self, session_id: str, *, user_id: str | None = None) -> None:
        """Make a session read-only: later runs raise ``SessionClosedError``; the transcript stays readable."""
        await lifecycle.close(self, session_id, user_id)

    async def clear(self, session_id: str, *, user_id: str | None = None) -> int:
        """Delete a session's messages, keeping the session and its state; returns how many were deleted."""
        return await lifecycle.clear(self, session_id, user_id)

    async def purge_expired(self, *, batch_size: int = 500, progress: Callable[[int], None] | None = None) -> int:
        """Delete every expired session, in batches of short transactions; returns how many were deleted."""
        return await lifecycle.purge_expired(self, batch_size, progress)

    async def erase_user(self, user_id: str) -> ErasureReport:
        """Delete every session, message and state row of a user, user-scoped memory included."""
        return await lifecycle.erase_user(self, user_id)

    async def fork(
        self, session_id: str, *, user_id: str | None = None, at_seq: int | None = None, new_id: str | None = None
    ) -> str:
        """Copy a session's history (up to ``at_seq``) and state into a new session; returns its id."""
        return await lifecycle.fork(self, session_id, user_id, at_seq, new_id or uuid.uuid4().hex)

    async def truncate(self, session_id: str, after_seq: int, *, user_id: str | None = None) -> int:
        """Drop the messages after ``after_seq`` (a rewind; tool calls stay with their results)."""
        return await lifecycle.truncate(self, session_id, user_id, after_seq)

    def export(self, *, user_id: str | None = None, session_id: str | None = None) -> AsyncIterator[str]:
        """JSON Lines of one session of ``user_id``, or of all of that user's sessions and shared state."""
        return transfer.export(self, user_id=user_id, session_id=session_id)

    async def import_lines(
        self, lines: Iterable[str], *, progress: Callable[[int], None] | None = None
    ) -> TransferReport:
        """Recreate the sessions of an export; a session that exists already is skipped, never duplicated."""
        return await transfer.import_lines(self, lines, progress)

    async def stats(self) -> dict[str, Any]:
        """Row counts, the busiest sessions, and sizes on disk."""
        return await lifecycle.stats(self)

    async def delete(self, session_id: str, *, user_id: str | None = None) -> bool:
        """Delete a session with its messages, state and run log in one transaction; False if there was none."""
        check_id(session_id, "session_id", required=True)
        check_id(user_id, "user_id")
        async with self._transaction(write=True, doing="deleting a session") as db:
            done = await db.execute(
                delete(sessions_t).where(sessions_t.c.id == session_id, owner_is(sessions_t.c.user_id, user_id))
            )
        return bool(done.rowcount)

    @asynccontextmanager
    async def _transaction(
        self,
        *,
        write: bool,
        doing: str,
        held: AsyncConnection | None = None,
        finish: bool = False,
        replica: bool = False,
    ) -> AsyncIterator[AsyncConnection]:
        """A short transaction: a consistent snapshot for reads, the SQLite write lock up front for writes.

        ``held`` is a serialized run's connection, whose transaction spans load to commit: it is used as it
        is, and ended (committed, or rolled back on error, then closed) only when ``finish`` is set.
        ``replica`` reads (listings, transcripts, exports) go to the replica engine when there is one.
        """
        with translated(self.url, doing):
            if held is not None:
                try:
                    yield held
                except BaseException:
                    if finish:
                        await _release(held, commit=False)
                    raise
                if finish:
                    await _release(held, commit=True)
                return
            await self._check_schema()
            source = self._writer if write else self._replica if replica and self._replica else self._reader
            async with source.connect() as conn, conn.begin():
                yield conn

    async def _hold(self, session_id: str) -> AsyncConnection:
        """Open a serialized run's transaction and take its session's lock (SQLite: the database write lock)."""
        with translated(self.url, "locking a session"):
            await self._check_schema()
            conn = await self._writer.connect()
            try:
                await conn.begin()
                if conn.dialect.name == "postgresql":
                    await conn.execute(
                        select(func.pg_advisory_xact_lock(SESSION_LOCK_CLASS, func.hashtext(session_id)))
                    )
            except BaseException:
                await conn.close()
                raise
            return conn

    async def _check_schema(self) -> None:
        if not self._schema_ok:
            async with self.engine.connect() as conn:
                await check_schema(conn, self.url)
            self._schema_ok = True

    async def close(self) -> None:
        """Close every pooled connection."""
        await self.engine.dispose()
        if self._replica is not None:
            await self._replica.dispose()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
