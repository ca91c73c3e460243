"""The one place driver, pool and Alembic errors become agent_store's (errors.py draws the tree): ``translated``, the
error boundary every database call runs inside, and ``classify``, by exception type and SQLSTATE, never by regex over
a driver's message but for PgBouncer's refusals, which carry no code of their own."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL

from agent_store.errors import (
    AgentStoreError,
    CheckedPathNeeded,
    ConfigurationError,
    DatabaseError,
    InvalidValueError,
    SchemaError,
    StorageUnavailableError,
    redact,
)

__all__ = ["classify", "translated"]


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    # SQLAlchemy's asyncpg adapter wraps the driver's error in a class named "Error": name the driver's.
    name = type(orig.__cause__ if type(orig).__name__ == "Error" and orig.__cause__ else orig).__name__
    if text and text[0].startswith("<class '"):  # SQLAlchemy's asyncpg adapter: "<class 'asyncpg...Error'>: msg"
        name, _, rest = text[0].partition(">: ")
        name, text = name.rsplit(".", 1)[-1].rstrip("'"), [rest]
    return f"{name}: {text[0]}" if text else name


# PostgreSQL SQLSTATE classes and codes (https://www.postgresql.org/docs/current/errcodes-appendix.html).
_PG_RETRYABLE_CLASSES = ("08", "53", "57", "58")  # connection, resources, operator intervention, system
_PG_RETRYABLE = {"40001", "40P01", "55P03", "55006"}  # serialization, deadlock, lock not available, in use
_PG_REFUSED = _PG_RETRYABLE | {"57014"}  # ... and a cancelled statement (statement_timeout): rolled back, nothing kept
_PG_CONFIGURATION = {"3D000", "28000", "28P01", "42501", "3F000"}  # no database / role / password / permission
_PG_READ_ONLY = {"25006"}
_NEXT_STEP = {  # what to do about a refused connection or statement, said beside PostgreSQL's own words
    "3D000": " (create it on the server, e.g. `createdb -h HOST -p PORT NAME`, then run `agent-store upgrade`)",
    "28000": " (the URL's user is not a role on the server, or pg_hba.conf refuses it: create the role or "
             "name another)",
    "28P01": " (check the password in the URL, or $PGPASSWORD / ~/.pgpass)",
    "42501": " (the role lacks a privilege: docs/row-security.md lists the application's grants)",
}
# PgBouncer refuses an unknown database or user as a protocol violation (08P01), not with the server's codes.
_POOLER_REFUSAL = re.compile(r"database \".*\" does not exist|authentication failed|no such user", re.IGNORECASE)
_SQLITE_CONFIGURATION = {"SQLITE_CANTOPEN", "SQLITE_AUTH", "SQLITE_PERM", "SQLITE_NOTADB"}


def classify(exc: BaseException, where: str) -> AgentStoreError | None:
    """The documented error for a driver, pool or Alembic failure; None for what is not a storage failure."""
    line = f"{where}: {_first_line(exc)}"
    if isinstance(exc, OverflowError) or _is_data_error(exc):  # the driver's text may quote the value: omit it
        return InvalidValueError(f"{where}: a value is out of range or of the wrong type for its column")
    if isinstance(exc, sa_exc.TimeoutError):  # the pool: no connection free within pool_timeout
        return StorageUnavailableError(f"{where}: no pooled connection became free in time ({exc.__class__.__name__})")
    if isinstance(exc, sa_exc.DBAPIError):
        orig = exc.orig
        state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
        if isinstance(state, str):
            by_state = _by_sqlstate(state, line, orig)
            if isinstance(by_state, DatabaseError) and exc.connection_invalidated:
                return StorageUnavailableError(line)
            return by_state
        if isinstance(orig, sqlite3.Error):
            return _by_sqlite_error(orig, line)
        if isinstance(exc, (sa_exc.OperationalError, sa_exc.InterfaceError)) or exc.connection_invalidated:
            return StorageUnavailableError(line)
        return DatabaseError(line)
    if isinstance(exc, ConnectionRefusedError):  # nothing listens there: the next step, not only the errno
        return StorageUnavailableError(f"{line} (is the database server running, at that host and port? For "
                                       "PostgreSQL, `pg_isready -h HOST -p PORT` tells)")  # fmt: skip
    if isinstance(exc, (sa_exc.DisconnectionError, OSError, TimeoutError, ConnectionError)):
        return StorageUnavailableError(line)
    if isinstance(exc, sqlite3.Error):  # outside SQLAlchemy's wrapping: the hot path (driver_path.py)
        return _by_sqlite_error(exc, line)
    if type(exc).__module__.startswith("asyncpg"):  # outside SQLAlchemy's wrapping: connect, close, the hot path
        state = getattr(exc, "sqlstate", None)
        if isinstance(state, str) and state[:2] != "08":
            return _by_sqlstate(state, line, exc)
        return StorageUnavailableError(line)
    if type(exc).__name__ == "CommandError" and type(exc).__module__.startswith("alembic"):
        return SchemaError(line)
    return None


def _by_sqlstate(state: str, line: str, orig: object) -> AgentStoreError:
    """PostgreSQL's answer, by SQLSTATE (the same rules through SQLAlchemy and on the driver's hot path)."""
    if state == "AS000":  # raised by agent_store_commit() (migration 0005)
        return CheckedPathNeeded(line)
    if state in _PG_CONFIGURATION or (state == "08P01" and _POOLER_REFUSAL.search(str(orig))):
        return ConfigurationError(line + _NEXT_STEP.get(state, ""))
    if state in _PG_READ_ONLY:
        read_only = StorageUnavailableError(line + " (the server is read-only: a standby?)", retryable=False)
        read_only.refused = True
        return read_only
    if state in _PG_RETRYABLE or state[:2] in _PG_RETRYABLE_CLASSES:
        unavailable = StorageUnavailableError(line)
        unavailable.refused = state in _PG_REFUSED
        return unavailable
    return DatabaseError(line)


def _by_sqlite_error(orig: sqlite3.Error, line: str) -> AgentStoreError:
    name = getattr(orig, "sqlite_errorname", "") or ""
    if name in _SQLITE_CONFIGURATION or "unable to open" in str(orig):
        return ConfigurationError(line)
    if name.startswith("SQLITE_READONLY") or "readonly" in str(orig):
        read_only = StorageUnavailableError(line + " (the database file is read-only)", retryable=False)
        read_only.refused = True
        return read_only
    if isinstance(orig, sqlite3.OperationalError):  # busy, locked, I/O, disk full, interrupted
        unavailable = StorageUnavailableError(line)
        unavailable.refused = True  # a file drops no connection: an error means the transaction did not commit
        return unavailable
    return DatabaseError(line)


def _is_data_error(exc: BaseException) -> bool:
    if isinstance(exc, sa_exc.DataError):
        return True
    orig = getattr(exc, "orig", None)
    state = getattr(exc if orig is None else orig, "sqlstate", None)  # raw driver errors (the hot path) have it
    driver = orig.__cause__ if orig is not None and orig.__cause__ is not None else orig
    return (isinstance(state, str) and state.startswith("22")) or type(driver).__name__ == "DataError"


@contextmanager
def translated(url: URL, doing: str) -> Iterator[None]:
    """The error boundary: every storage failure inside the block leaves it as an :class:`AgentStoreError`.

    Errors of our own tree pass through untouched; so does anything that is not a storage failure
    (a bug in the caller's code surfaces as itself, not disguised).
    """
    try:
        yield
    except AgentStoreError:
        raise
    except Exception as exc:
        mapped = classify(exc, f"{doing} failed on {redact(url)}")
        if mapped is None:
            raise
        if isinstance(mapped, StorageUnavailableError):
            mapped.connection_lost = bool(getattr(exc, "connection_invalidated", False))
            if "read-only: a standby?" in str(mapped) and _names_several_servers(url):
                # A URL naming several servers (target_session_attrs=read-write): a failover is under way, and
                # the same call on a fresh connection finds the new primary.
                mapped.retryable = True
        raise mapped from exc


def _names_several_servers(url: URL) -> bool:
    hosts = url.query.get("host")
    return "," in (url.host or "") or (isinstance(hosts, tuple) and len(hosts) > 1) or "," in str(hosts or "")
