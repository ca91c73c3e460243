"""Turning a URL into a correctly configured async engine, and the schema check a store does once.

SQLite gets WAL, a busy timeout, foreign keys and explicit ``BEGIN`` statements (pysqlite's implicit
transactions would let a run's reads see two different snapshots); PostgreSQL gets a connect timeout (an
unreachable host fails, it does not hang) and no pre-ping: a round trip per checkout is too dear, so a load or
commit that meets a connection dropped by a server restart is tried once more instead (run/load.py, run/commit.py).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from sqlalchemy import Column, MetaData, String, Table, event, inspect, select
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, DisconnectionError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from agent_store.db import text_match
from agent_store.db.compat import oldest_code
from agent_store.db.log_redaction import keep_values_out_of_logs
from agent_store.db.tables import SCHEMA_REVISION
from agent_store.db.urls import DEFAULT_URL, postgres_connect_args, resolve_url
from agent_store.errors import ConfigurationError, SchemaError, SchemaOutOfDateError, SchemaTooNewError, redact

BUSY_TIMEOUT_S = 30  # how long a SQLite writer waits for the lock, unless connect_args says otherwise
SQLITE3_DEFAULT_BUSY_MS = 5000  # what sqlite3.connect() sets when not told: Store(engine) raises it to ours
CONNECT_TIMEOUT_S = 10.0
NO_TRANSACTION = "agent_store_no_transaction"  # set on a SQLite connection whose last hop left no transaction

# Fixed statements chosen by an execution option; never assembled from input.
_SQLITE_BEGIN = {"deferred": "BEGIN", "immediate": "BEGIN IMMEDIATE", "none": ""}

log = logging.getLogger("agent_store")


def make_engine(url: str | URL | None = None, **engine_kwargs: Any) -> AsyncEngine:
    """Create the engine agent_store expects for ``url`` (see :func:`resolve_url`)."""
    parsed = resolve_url(url)
    if parsed.drivername == "postgresql+asyncpg":
        parsed, from_url = postgres_connect_args(parsed)
        connect_args = {"timeout": CONNECT_TIMEOUT_S, **from_url, **engine_kwargs.pop("connect_args", {})}
        pgbouncer = parsed.query.get("pgbouncer")
        parsed = parsed.difference_update_query(["pgbouncer"])
        if pgbouncer in ("true", "1", "yes"):
            # PgBouncer in transaction pooling (before 1.21) cannot keep prepared statements between
            # transactions: no statement caches, and a unique name for every statement asyncpg prepares.
            parsed = parsed.update_query_dict({"prepared_statement_cache_size": "0"})
            connect_args.update(statement_cache_size=0, prepared_statement_name_func=_unique_statement_name)
        engine_kwargs.setdefault("hide_parameters", True)  # parameters are message text: keep them out of errors
        return _create(parsed, connect_args=connect_args, **engine_kwargs)
    database = parsed.database or ""
    if database in ("", ":memory:") or database.startswith("file::memory:"):
        raise ConfigurationError("an in-memory SQLite database cannot be shared by runs; give a file path")
    # A writer waits this long for SQLite's lock ("database is locked" after it); connect_args={"timeout": s}
    # sets another wait, as for sqlite3.connect.
    engine_kwargs["connect_args"] = {"timeout": BUSY_TIMEOUT_S, **engine_kwargs.pop("connect_args", {})}
    engine_kwargs.setdefault("hide_parameters", True)
    if "pool" not in engine_kwargs:  # a pool object of the caller's resets its connections its own way
        engine_kwargs.setdefault("pool_reset_on_return", None)  # _sqlite_reset does it, skipping what needs none
    engine = _create(parsed, **engine_kwargs)
    configure_engine(engine)
    event.listen(engine.sync_engine, "do_connect", _sqlite_existing_only)
    if "pool_reset_on_return" in engine_kwargs and engine_kwargs["pool_reset_on_return"] is None:
        event.listen(engine.sync_engine, "reset", _sqlite_reset)
    return engine


def _create(url: URL, **engine_kwargs: Any) -> AsyncEngine:
    if "poolclass" not in engine_kwargs and "pool" not in engine_kwargs:
        # The most recently returned connection first: a light load keeps reusing the few connections whose
        # statements are prepared and planned (with FIFO, 32 connections took turns and a load could pay for
        # its plan again on each; the bench's window load ran 0.8 or 2 ms by connection), and the spare ones
        # stay idle long enough for a server-side idle timeout to close them.
        engine_kwargs.setdefault("pool_use_lifo", True)
    try:
        return create_async_engine(url, **engine_kwargs)
    except (ArgumentError, TypeError, ValueError) as exc:  # an engine option of the wrong name or type
        raise ConfigurationError(f"cannot create an engine for {redact(url)}: {exc}") from exc


# Set while the store migrates (Database.alembic): only then may a connection bring a new SQLite file into being.
CREATING_SQLITE: ContextVar[bool] = ContextVar("agent_store_creating_sqlite", default=False)


def no_sqlite_file(path: str) -> bool:
    """A SQLite path (not a ``file:`` URI) where no database exists yet."""
    return bool(path) and not path.startswith("file:") and not Path(path).exists()


def _sqlite_existing_only(_dialect: Any, _record: Any, cargs: list[Any], cparams: dict[str, Any]) -> None:
    """A read, a run or a warm-up on a path with no database fails here, instead of leaving an empty file behind
    (sqlite3's connect would create one): only a migration creates the database."""
    path = str(cargs[0]) if cargs else str(cparams.get("database", ""))
    if CREATING_SQLITE.get() or cparams.get("uri") or not no_sqlite_file(path):
        return
    raise SchemaOutOfDateError(
        f"no SQLite database at {path} (none was created): create it with `await store.migrate()` or "
        f"`agent-store upgrade --url sqlite+aiosqlite:///{path}`"
    )


def _unique_statement_name() -> str:
    return f"__agent_store_{uuid.uuid4().hex}__"


def configure_engine(engine: AsyncEngine) -> None:
    """Install the connection set-up of the engine's dialect; harmless if called twice.

    It runs at checkout, so an engine handed to ``Store(engine)`` after it already opened connections gets it on
    those connections too. SQLite: the pragmas, once per pooled connection (marked in its record).
    PostgreSQL: a connection the server closed while it sat in the pool is replaced before it is handed out.
    Both: the drivers' log records never carry a statement's values (log_redaction.py).
    """
    sync_engine = engine.sync_engine
    keep_values_out_of_logs(engine)  # statement parameters and rows are message text: never in a log record
    if sync_engine.dialect.name == "postgresql" and not event.contains(sync_engine, "checkout", _closed_while_idle):
        event.listen(sync_engine, "checkout", _closed_while_idle)
    if sync_engine.dialect.name != "sqlite" or event.contains(sync_engine, "checkout", _sqlite_checkout):
        return
    event.listen(sync_engine, "checkout", _sqlite_checkout)
    event.listen(sync_engine, "begin", _sqlite_begin)
    event.listen(sync_engine, "handle_error", _sqlite_cancelled)


def _sqlite_reset(dbapi_connection: Any, record: Any, state: Any) -> None:
    """The pool's rollback as a connection goes back, skipped after a hop known to leave no transaction.

    A rollback on aiosqlite is a hop to the connection's thread; after a run's load (one statement, no
    transaction) or its one-hop commit (which ends its own transaction) it would do nothing, twice per run. The
    store marks those connections (``NO_TRANSACTION`` in the connection's info) only when the hop completed;
    every other connection (a cancelled statement may still be running in that thread) is rolled back as the
    pool would, the rollback queued behind it.
    """
    clean = record.info.pop(NO_TRANSACTION, False)
    if state.asyncio_safe and not state.terminate_only and not state.transaction_was_reset and not clean:
        dbapi_connection.rollback()


def _sqlite_cancelled(context: Any) -> None:
    """A statement whose caller was cancelled is not a lost connection on SQLite.

    aiosqlite runs a connection's operations one after another in its own thread: the cancelled statement
    finishes there, and the rollback our cleanup sends next runs after it. Treated as a disconnect (SQLAlchemy's
    default for a cancellation), the connection would be terminated instead, and aiosqlite can then drop its
    sqlite3 connection unclosed, holding the database's write lock until garbage collection.
    """
    if isinstance(context.original_exception, asyncio.CancelledError):
        context.is_disconnect = False


def _closed_while_idle(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """A server-side idle timeout, or a restart, closes connections that sit in the pool, and asyncpg sees it as
    it happens (no round trip asked). The pool replaces such a connection (and only it) before handing it out:
    with the pool LIFO, the spare connections are the ones an idle timeout closes, and the next burst of
    listings and reads would otherwise each meet one and fail (the pool would then drop every connection)."""
    if dbapi_connection.driver_connection.is_closed():
        raise DisconnectionError("the server closed this pooled connection while it was idle")


def _sqlite_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
    if not record.info.get("agent_store_configured"):
        _sqlite_connect(dbapi_connection)
        record.info["agent_store_configured"] = True


def _sqlite_connect(dbapi_connection: Any) -> None:
    dbapi_connection.isolation_level = None  # we emit BEGIN ourselves, see _sqlite_begin
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA busy_timeout")
    if cursor.fetchone()[0] == SQLITE3_DEFAULT_BUSY_MS:  # an engine made elsewhere, with sqlite3's default
        cursor.execute("PRAGMA busy_timeout = 30000")  # BUSY_TIMEOUT_S, in ms
    cursor.execute("PRAGMA journal_mode = WAL")
    cursor.execute("PRAGMA synchronous = NORMAL")
    cursor.execute("PRAGMA foreign_keys = ON")
    # Table rebuilds (Alembic batch mode) rename a copy over the original; without this, SQLite re-checks
    # every view on rename and the agent_transcript view makes the rename fail.
    cursor.execute("PRAGMA legacy_alter_table = ON")
    cursor.close()
    text_match.register(dbapi_connection)  # search's case folding and short-word matching (agent_store.search)


def _sqlite_begin(conn: Any) -> None:
    # Writes start with BEGIN IMMEDIATE: the write lock is taken (waiting up to busy_timeout) before any
    # read, so a commit never fails with "database is locked" on lock upgrade.
    mode = conn.get_execution_options().get("agent_store_begin", "deferred")
    if _SQLITE_BEGIN[mode]:  # "none": a single statement, which is its own transaction
        conn.exec_driver_sql(_SQLITE_BEGIN[mode])


@asynccontextmanager
async def migration_connection(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection for schema changes, committed at the end of the block.

    On SQLite, foreign keys are off meanwhile: Alembic's batch mode rebuilds a table by copy, drop and
    rename, and with foreign keys on, dropping ``agent_sessions`` would cascade-delete every message.
    """
    creating = CREATING_SQLITE.set(True)  # a migration may bring a new SQLite file into being
    try:
        async with engine.connect() as conn:
            on_sqlite = conn.dialect.name == "sqlite"
            if on_sqlite:
                await _sqlite_foreign_keys(conn, on=False)
                # The write lock up front (BEGIN IMMEDIATE, waiting up to busy_timeout): a deferred transaction
                # that reads first and writes later fails at once with "database is locked" when an app
                # writes meanwhile, since SQLite cannot wait to upgrade a read that others have passed.
                await conn.execution_options(agent_store_begin="immediate")
            try:
                yield conn
                await conn.commit()
            finally:
                if conn.in_transaction():
                    await conn.rollback()
                if on_sqlite:
                    await _sqlite_foreign_keys(conn, on=True)
    finally:
        CREATING_SQLITE.reset(creating)


async def _sqlite_foreign_keys(conn: AsyncConnection, *, on: bool) -> None:
    # Straight to the driver: the PRAGMA is a no-op inside a transaction, and SQLAlchemy would open one.
    raw = await conn.get_raw_connection()
    await raw.driver_connection.execute("PRAGMA foreign_keys = ON" if on else "PRAGMA foreign_keys = OFF")  # type: ignore[union-attr]


def migrations_dir() -> Path:
    """Where the Alembic scripts are: inside the installed package, or the source checkout's migrations/."""
    package = Path(__file__).resolve().parent.parent  # agent_store/ (this file is agent_store/db/engine.py)
    for candidate in (package / "migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise ConfigurationError("agent_store's migrations are missing from this installation")


_VERSIONS = Table("alembic_version", MetaData(), Column("version_num", String(32)))  # Alembic's own table


def known_revisions() -> set[str]:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(str(migrations_dir()))
    return {rev.revision for rev in script.walk_revisions()}


def foreign_revision(where: str, revision: str) -> str:
    """The error for an ``alembic_version`` another Alembic project wrote (agent_store's revisions are 0001, ...)."""
    return (f"{where}'s alembic_version holds revision {revision[:40]!r}, which is not agent_store's: another "
            "Alembic project keeps its version in this database's alembic_version table. Give that project a "
            "version table of its own (docs/operations.md, 'Beside your own Alembic migrations'); nothing changed")


async def check_schema(conn: AsyncConnection, url: URL) -> None:
    """Raise a :class:`SchemaError` unless the database is at this code's head revision, or at a newer one that
    keeps this code working (compat.py)."""

    def read_revision(sync_conn: Any) -> str | None:
        # Read here, not through Alembic's MigrationContext: importing it on a serving process's path adds about
        # 15,000 objects that every full pass of the garbage collector walks (issue 43; tests/test_garbage.py).
        if not inspect(sync_conn).has_table(_VERSIONS.name):
            return None
        found = sync_conn.execute(select(_VERSIONS.c.version_num)).all()
        if len(found) > 1:  # several heads: Alembic's own error says so
            from alembic.migration import MigrationContext

            return MigrationContext.configure(sync_conn).get_current_revision()
        return found[0][0] if found else None

    current = await conn.run_sync(read_revision)
    if current == SCHEMA_REVISION:
        return
    where = redact(url)
    upgrade = "agent-store upgrade" + ("" if where == DEFAULT_URL else f" --url '{where}'")  # the password: yours
    if current is None:
        raise SchemaOutOfDateError(
            f"{where} has no agent_store schema; run `{upgrade}` (or `await store.migrate()`, "
            "or `alembic upgrade head` from a checkout)"
        )
    if current in known_revisions():
        raise SchemaOutOfDateError(
            f"{where} is at schema revision {current}, behind this agent_store ({SCHEMA_REVISION}); "
            f"run `{upgrade}` (or `await store.migrate()`)"
        )
    if not (current.isdigit() and len(current) == len(SCHEMA_REVISION)):  # not one of ours, past or future
        raise SchemaError(foreign_revision(where, current))
    newer = current > SCHEMA_REVISION  # 0027, ...: zero-padded, text order
    oldest = await oldest_code(conn) if newer else None
    needs = "upgrade the agent-store package"
    if oldest is not None:
        if oldest <= SCHEMA_REVISION:  # zero-padded revisions: text order
            log.info("%s is at schema %s, newer than this code (%s), which it keeps working (oldest code %s)",
                     where, current, SCHEMA_REVISION, oldest)  # fmt: skip
            return
        needs = f"it needs agent_store code at schema {oldest} or newer: {needs}"
    raise SchemaTooNewError(
        f"{where} is at schema revision {current}, which this agent_store does not know "
        f"(its newest is {SCHEMA_REVISION}); {needs}"
    )
