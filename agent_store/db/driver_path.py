"""A run's hot statements straight on the driver connection, compiled once by SQLAlchemy.

SQLAlchemy's per-execution layers cost about 0.2 ms of CPU per statement on these machines, a quarter of a run;
its pool, its connection set-up (asyncpg's JSON codecs, SQLite's pragmas) and everything that is not a run's
load or commit stay SQLAlchemy's. On SQLite the cost that matters most is aiosqlite's: every call is a hop to
the connection's thread and back (about 50 us of CPU), so a commit's statements run there in one hop.
"""

from __future__ import annotations

import sqlite3
from collections import namedtuple
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import exc as sa_exc
from sqlalchemy import select
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.errors import StorageUnavailableError

T = TypeVar("T")


CACHED = 256  # compiled statements kept (the store has a few dozen)

class DriverPath:
    """Compiled statements and their row types, per engine (one dialect)."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._sql: dict[Any, tuple[str, list[str], dict[str, Any]]] = {}  # statement -> SQL, parameter order
        self._rows: dict[Any, tuple[Any, list[Any]]] = {}  # statement -> row type, result converters

    def compiled(self, statement: Any) -> tuple[str, list[str], dict[str, Any]]:
        """(SQL text, parameter order, values of the statement's own literals)."""
        found = self._sql.get(statement)
        if found is None:
            if len(self._sql) >= CACHED:  # statements are built once and reused; a caller that builds one per call
                self._sql.clear()  # must not grow this without bound
                self._rows.clear()
            compiled = statement.compile(dialect=self.dialect)
            found = self._sql[statement] = (compiled.string, list(compiled.positiontup or ()), dict(compiled.params))
        return found

    def _values(self, statement: Any, params: dict[str, Any]) -> tuple[str, list[Any]]:
        sql, names, defaults = self.compiled(statement)
        return sql, [params[n] if n in params else defaults[n] for n in names]

    async def fetch(self, conn: AsyncConnection, statement: Any, params: dict[str, Any], *, lost: str) -> list[Any]:
        """All rows of one statement. Its parameters must need no conversion (text, numbers): they go as they are.

        ``lost``: the message of the :class:`StorageUnavailableError` raised when the connection turns out dead.
        """
        driver = _driver(conn)
        sql, values = self._values(statement, params)
        if self.dialect.name == "sqlite":
            return self._sqlite_rows(statement, await driver.execute_fetchall(sql, values))
        try:
            records = await driver.fetch(sql, *values)
        except BaseException as exc:
            if not isinstance(exc, Exception):  # cancelled mid-statement: the connection's state is unknown
                await conn.invalidate()
            elif driver.is_closed():
                await _drop_dead_pool(conn)
                dropped = StorageUnavailableError(f"{lost}: {type(exc).__name__}: connection lost")
                dropped.connection_lost = True
                raise dropped from exc
            raise
        if not records:
            return []
        if statement not in self._rows:  # the column names are known once a first row came back
            self._rows[statement] = (namedtuple("Row", list(records[0].keys())), [])
        row_type = self._rows[statement][0]
        return [row_type(*record) for record in records]

    async def check_open(self, conn: AsyncConnection, *, lost: str) -> None:
        """Raise the lost-connection error now if the pooled connection was closed while it sat in the pool.

        A server restart closes idle connections, and asyncpg sees that as it happens: a write sent on such a
        connection certainly never reached the server, which a caller needs to know (a run's first commit,
        retried as "may have landed", could not tell "never created" from "created and deleted since").
        The pool's checkout already replaces such connections (engine._closed_while_idle); this covers one closed
        in the loop iteration between that checkout and the send.
        """
        if self.dialect.name == "postgresql" and _driver(conn).is_closed():
            await _drop_dead_pool(conn)
            dropped = StorageUnavailableError(f"{lost}: connection lost before anything was sent")
            dropped.connection_lost = True
            raise dropped

    def _sqlite_rows(self, statement: Any, rows: Any) -> list[Any]:
        """SQLite hands back text for JSON and timestamps: the columns' own SQLAlchemy types convert them."""
        found = self._rows.get(statement)
        if found is None:
            columns = list(statement.exported_columns)  # a SELECT's columns, or an INSERT's RETURNING
            processors = [c.type.dialect_impl(self.dialect).result_processor(self.dialect, None) for c in columns]
            converters = [(i, f) for i, f in enumerate(processors) if f is not None]
            found = self._rows[statement] = (namedtuple("Row", [c.name for c in columns]), converters)
        row_type, converters = found
        out = []
        for row in rows:
            values = list(row)
            for i, convert in converters:
                if values[i] is not None:  # most cells of a union's rows are NULL: no call for those
                    values[i] = convert(values[i])
            out.append(row_type(*values))
        return out

    @staticmethod
    def sqlite_thread_available(conn_class: type) -> bool:
        return callable(getattr(conn_class, "_execute", None))

    @staticmethod
    async def in_sqlite_thread(conn: AsyncConnection, work: Callable[[sqlite3.Connection], T]) -> T:
        """``work(sqlite3 connection)`` in aiosqlite's thread for the connection, in one hop.

        aiosqlite runs every call this way (``Connection._execute``, the one way in since its first releases);
        the store checks it is there (:meth:`sqlite_thread_available`) and takes the slower path if not. A
        caller cancelled meanwhile does not stop ``work``: it runs to its end in that thread, as a statement does.
        """
        driver = _driver(conn)
        return await driver._execute(lambda: work(driver._conn))  # type: ignore[no-any-return]


def _driver(conn: AsyncConnection) -> Any:
    """The driver's connection (asyncpg's, aiosqlite's) of a connection just checked out of the pool: as
    ``get_raw_connection()``, without its trip through a greenlet (it is there already; nothing to wait for)."""
    return conn.sync_connection.connection.driver_connection  # type: ignore[union-attr]


async def _drop_dead_pool(conn: AsyncConnection) -> None:
    """A dead connection usually means a server restart: every pooled connection of that age is dead too.
    One statement through SQLAlchemy lets its own disconnect handling drop them all (not just this one)."""
    try:
        await conn.execute(select(1))
    except sa_exc.DBAPIError:
        pass  # expected: "connection is closed", now invalidated with the pool
