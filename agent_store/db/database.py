"""The Database: connections, transactions, the serialized-run hold, the replica, migrations, the error boundary.

Everything that touches a connection goes through one of its methods, so every failure of the driver, the
pool or Alembic leaves as a documented :class:`~agent_store.errors.AgentStoreError` (see errors.py), and
cleanup after a failure never replaces the caller's exception with its own.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import func, select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_store.db import codec, message_rows, tenancy
from agent_store.db.connections import checkout, once_more_if_dropped, quietly
from agent_store.db.driver_path import DriverPath
from agent_store.db.engine import (
    NO_TRANSACTION,
    check_schema,
    configure_engine,
    foreign_revision,
    migration_connection,
    migrations_dir,
    no_sqlite_file,
)
from agent_store.db.translation import translated
from agent_store.errors import (
    ConfigurationError,
    InvalidValueError,
    SchemaError,
    SchemaTooNewError,
    redact,
)
from agent_store.keys import KeyProvider

logger = logging.getLogger("agent_store")
T = TypeVar("T")
AUTOCOMMIT = "AUTOCOMMIT"
# pg_advisory_xact_lock(class, key) namespaces: 1 serialized sessions, 2 users, 3 apps.
SESSION_LOCK, USER_LOCK, APP_LOCK = 1, 2, 3


@dataclass(frozen=True)
class Settings:
    """What a run needs to know besides the connection: the store's options."""

    app_id: str = "default"
    idle_ttl_seconds: int | None = None
    max_value_bytes: int = codec.DEFAULT_MAX_VALUE_BYTES
    message_cipher: message_rows.MessageCipher | None = None
    operator: bool = False  # cross-user work under row-level security: its role must bypass it (tenancy.py)
    keys: Any = None  # per-user data keys, a keys.KeyProvider (sealing.py)

    def __post_init__(self) -> None:
        if self.keys is not None and (self.message_cipher is not None or not isinstance(self.keys, KeyProvider)):
            raise ConfigurationError("keys must be a KeyProvider (agent_store.KeyFile), and not with a message_cipher")


class Database:
    """One engine (its pool), an optional read replica, and the only ways agent_store uses them."""

    def __init__(self, engine: AsyncEngine, settings: Settings, *, check_schema: bool = True) -> None:
        if engine.dialect.name not in ("sqlite", "postgresql") or not engine.dialect.is_async:
            raise ConfigurationError(f"unsupported engine dialect {engine.dialect.name!r}: use aiosqlite or asyncpg")
        # An engine's execution option, or create_engine(isolation_level=...) (set on each new connection):
        if AUTOCOMMIT in (engine.get_execution_options().get("isolation_level"),
                          getattr(engine.sync_engine.dialect, "_on_connect_isolation_level", None)):  # fmt: skip
            raise ConfigurationError(
                'an engine with isolation_level="AUTOCOMMIT": agent_store\'s writes need transactions (it sends '
                "single statements without one by itself); leave the isolation level at its default"
            )
        configure_engine(engine)
        engine.sync_engine.hide_parameters = True  # a failed statement's parameters are message text
        self.engine, self.settings = engine, settings
        self.dialect: str = engine.dialect.name
        # Two views of one pool: reads see one consistent snapshot; SQLite writes take the write lock up front.
        # A single statement sees one snapshot by itself: no BEGIN/COMMIT around it (a run's load).
        if self.dialect == "sqlite":
            self._reader = engine.execution_options(agent_store_begin="deferred")
            self._writer = engine.execution_options(agent_store_begin="immediate")
            self._single = engine.execution_options(agent_store_begin="none")
        else:
            self._reader = engine.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
            self._writer = engine
            self._single = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._replica: AsyncEngine | None = None
        self.row_security, self.tenancy_epoch = False, 1  # learned per connection (tenancy.learn)
        self._check = check_schema
        self._schema_ok = self._replica_schema_ok = not check_schema
        self.driver = DriverPath(engine.dialect)  # a run's load and commit, straight on the driver
        self._where = redact(engine.url)  # for messages; rendered once (it was 30 us of every statement's CPU)

    def use_replica(self, replica: AsyncEngine) -> None:
        configure_engine(replica)
        replica.sync_engine.hide_parameters = True
        if replica.dialect.name == "postgresql":
            self._replica = replica.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
        else:
            self._replica = replica.execution_options(agent_store_begin="deferred")

    @property
    def url(self) -> URL:
        return self.engine.url

    def lost(self, doing: str) -> str:
        """The message of a connection found dead while ``doing``: it names the server (never its password)."""
        return f"{doing} failed on {self._where}"

    @asynccontextmanager
    async def transaction(
        self, *, write: bool, doing: str, held: AsyncConnection | None = None, finish: bool = False,
        replica: bool = False, committing: Callable[[], None] | None = None,
    ) -> AsyncIterator[AsyncConnection]:  # fmt: skip
        """A short transaction: a consistent snapshot for reads, the SQLite write lock up front for writes.

        ``held`` is a serialized run's connection, whose transaction spans load to commit: it is used as it
        is, and ended (committed, or rolled back on error, then closed) only when ``finish`` is set.
        ``replica`` reads (listings, transcripts, exports, stats) go to the replica when there is one.
        ``committing`` is called just before COMMIT is sent: from then on, a failure leaves the outcome unknown.
        """
        on_replica = replica and not write and self._replica is not None
        # An error names the server it came from: the replica's URL for a replica read.
        with translated(self._replica.url if on_replica and self._replica else self.url, doing):
            if held is not None:
                try:
                    yield held
                except BaseException:
                    if finish:
                        await self.release(held, commit=False)
                    raise
                if finish:
                    if committing is not None:
                        committing()
                    await self.release(held, commit=True)
                return
            await self.check_schema(
                replica=on_replica
            )  # a replica read needs only the replica (the primary may be down)
            source = self._replica if on_replica and self._replica else self._writer if write else self._reader
            conn = await checkout(source)
            try:
                await conn.begin()
                await self._name_user(conn)  # on this connection: a replica's for a replica read
                yield conn
                if committing is not None:
                    committing()
                await conn.commit()
            except BaseException as exc:
                self.tenancy_epoch += tenancy.refused_by_policy(exc)  # the switch changed: learn again
                await quietly(conn.rollback, "rollback")
                raise
            finally:
                await quietly(conn.close, "returning a connection")

    async def one_statement(
        self, statement: Any, params: dict[str, Any], *, doing: str, held: AsyncConnection | None = None,
        committing: Callable[[], None] | None = None, names_itself: bool = False,
    ) -> list[Any]:  # fmt: skip
        """All rows of one statement, run outside any explicit transaction: a single statement is its own
        snapshot (a run's load) and its own transaction (PostgreSQL's one-round-trip commit). On a serialized
        run's ``held`` connection, inside its transaction. ``committing``: called before a write is sent (a
        write is not repeated here; a read that meets a dead pooled connection is, once). ``names_itself``: a
        statement that names its user for row-level security by itself (the commit functions' ``_as`` forms)."""
        if held is not None:
            with translated(self.url, doing):
                return list((await held.execute(statement, params)).all())
        def once() -> Awaitable[list[Any]]:
            return self._on_fresh_connection(statement, params, doing, committing, names_itself)

        return await (once() if committing is not None else once_more_if_dropped(once))

    async def _on_fresh_connection(self, statement: Any, params: dict[str, Any], doing: str,
                                   committing: Callable[[], None] | None, names_itself: bool) -> list[Any]:  # fmt: skip
        with translated(self.url, doing):
            await self.check_schema()
            conn = await checkout(self._single)
            lost = self.lost(doing)
            try:
                await tenancy.learn(self, conn)  # once per connection (and epoch)
                named = tenancy.named_read(statement) if self.row_security and committing is None else None
                if self.row_security and not names_itself and named is None:  # BEGIN, the name, it, COMMIT
                    await quietly(conn.close, "returning a connection")
                    async with self.transaction(write=True, doing=doing, committing=committing) as held:
                        return await self.driver.fetch(held, statement, params, lost=lost)
                if self.row_security and not names_itself:  # its user named in the same round trip (tenancy.py)
                    statement, params = named, {**params, **tenancy.read_names(self.settings.app_id)}
                if committing is not None:
                    await self.driver.check_open(conn, lost=lost)  # closed in the pool: certainly not sent
                    committing()
                try:
                    rows = await self.driver.fetch(conn, statement, params, lost=lost)
                except Exception as exc:
                    self.tenancy_epoch += tenancy.refused_by_policy(exc)
                    raise
                if self.dialect == "sqlite":  # no BEGIN was sent: nothing to roll back (engine._sqlite_reset)
                    conn.info[NO_TRANSACTION] = True
                return rows
            finally:
                await quietly(conn.close, "returning a connection")

    async def in_sqlite_thread(self, work: Callable[[Any], T], *, doing: str, committing: Callable[[], None]) -> T:
        """``work(sqlite3 connection)`` on a pooled connection, in one hop to its thread (run/commit_sqlite.py)."""
        with translated(self.url, doing):
            await self.check_schema()
            conn = await checkout(self._single)
            try:
                committing()
                done = await DriverPath.in_sqlite_thread(conn, work)
                conn.info[NO_TRANSACTION] = True  # the work ended its own transaction
                return done
            finally:
                await quietly(conn.close, "returning a connection")

    async def release(self, conn: AsyncConnection, *, commit: bool) -> None:
        """End a held transaction. A commit's failure propagates; a rollback's is only logged."""
        if commit:
            try:
                await conn.commit()
            finally:
                await quietly(conn.close, "returning a connection")
            return
        try:
            await quietly(conn.rollback, "rollback")
        finally:  # a second cancellation during the rollback still returns the connection
            await quietly(conn.close, "returning a connection")

    async def hold(self, session_id: str) -> AsyncConnection:
        """Open a serialized run's transaction and take its session's lock (SQLite: the database write lock)."""
        return await once_more_if_dropped(lambda: self._hold(session_id))

    async def _hold(self, session_id: str) -> AsyncConnection:
        with translated(self.url, "locking a session"):
            await self.check_schema()
            conn = await checkout(self._writer)
            try:
                await conn.begin()
                if self.dialect == "postgresql":
                    await self._name_user(conn)
                    await conn.execute(select(func.pg_advisory_xact_lock(SESSION_LOCK, func.hashtext(session_id))))
            except BaseException:
                await quietly(conn.close, "returning a connection")
                raise
            return conn

    async def check_schema(self, *, replica: bool = False) -> None:
        if replica and self._replica is not None:
            if not self._replica_schema_ok:
                with translated(self._replica.url, "checking the replica's schema"):
                    async with self._replica.connect() as conn:
                        await check_schema(conn, self._replica.url)
                self._replica_schema_ok = True
            return
        if not self._schema_ok:
            with translated(self.url, "checking the schema"):
                async with self.engine.connect() as conn:
                    await check_schema(conn, self.url)
            self._schema_ok = True

    async def _name_user(self, conn: AsyncConnection) -> None:
        """Begin a transaction by naming its user, under row-level security (learned first, per connection)."""
        await tenancy.learn(self, conn)
        if self.row_security:
            await conn.execute(tenancy.NAME, {**tenancy.named(), "app": self.settings.app_id})

    async def alembic(self, verb: str, revision: str) -> None:
        """``upgrade`` / ``downgrade`` with the shipped migrations; never a silent no-op in the wrong direction."""
        from alembic import command
        from alembic.config import Config
        from alembic.script import ScriptDirectory

        config = Config()
        config.set_main_option("script_location", str(migrations_dir()))
        script = ScriptDirectory.from_config(config)
        with translated(self.url, f"schema {verb}"):
            if revision not in ("head", "base"):
                try:
                    script.get_revision(revision)
                except Exception as exc:  # alembic's own error for an unknown or ambiguous id
                    raise InvalidValueError(f"unknown schema revision {revision!r}") from exc
            async with migration_connection(self.engine) as conn:
                current = await conn.run_sync(_current_revision)
                if current is not None and current not in {r.revision for r in script.walk_revisions()}:
                    if not (current.isdigit() and len(current) == 4):  # another Alembic project's: not ours
                        raise SchemaError(foreign_revision(redact(self.url), current))
                    raise SchemaTooNewError(f"{redact(self.url)} is at schema revision {current}, which this "
                                            "agent_store does not know; upgrade the agent-store package")
                if verb == "upgrade" and current is not None and revision != "head":
                    below = {r.revision for r in script.iterate_revisions(current, "base")}
                    if revision != current and script.get_revision(revision).revision in below:
                        raise InvalidValueError(
                            f"the database is at {current}, ahead of {revision}: go back with "
                            f"`agent-store downgrade {revision}` (Store.downgrade)"
                        )

                def run(sync_conn: Any) -> None:
                    config.attributes["connection"] = sync_conn
                    getattr(command, verb)(config, revision)

                await conn.run_sync(run)
        self._schema_ok = self._replica_schema_ok = not self._check  # checked again, if it was checked at all
        self.tenancy_epoch += 1

    async def revision(self) -> str | None:
        """The schema revision, None for none (also a SQLite path with no database yet: nothing is created)."""
        if self.dialect == "sqlite" and no_sqlite_file(self.url.database or ""):
            return None
        with translated(self.url, "reading the schema revision"):
            async with self.engine.connect() as conn:
                return await conn.run_sync(_current_revision)

    async def close(self) -> None:
        """Close every pooled connection (primary and replica)."""
        with translated(self.url, "closing the pool"):
            await self.engine.dispose()
            if self._replica is not None:
                await self._replica.dispose()


def _current_revision(sync_conn: Any) -> str | None:
    from alembic.migration import MigrationContext

    return MigrationContext.configure(sync_conn).get_current_revision()

