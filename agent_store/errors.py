"""The exceptions agent_store raises, and the one place driver, pool and Alembic errors are translated.

    AgentStoreError               .retryable: whether the same call may succeed if simply tried again
    ├── ConfigurationError        bad URL or option, missing database or role, no permission (also a ValueError)
    │   ├── EmbeddingProfileError a query in another embedding space than the stored vectors'
    │   ├── MissingExtraError     an optional part used without its extra installed: names the pip command
    │   └── NotEmbeddedError      ranking by meaning before any vector exists: run `agent-store embed`
    ├── InvalidValueError         a value that cannot be stored; names the key or field (also a ValueError)
    ├── CheckpointRefusedError    a stored workflow checkpoint that may not be read back (also the framework's
    │                             WorkflowCheckpointException)
    │   └── StreamBusyError       a run's id used already, or its conversation has a run in progress
    ├── SessionNotFoundError      no such session for this user / agent (also a LookupError)
    ├── StreamNotFoundError       no such run in the journal for this user (also a LookupError)
    ├── StreamLostError           a journal writer whose run was ended elsewhere
    ├── SessionClosedError        the session was closed: readable, no longer writable
    ├── SessionExpiredError       the session outlived its idle time-to-live
    ├── BudgetExceededError       the user's or the app's token budget for the period is spent: no run starts
    ├── ConflictError             another run or incarnation got there first; nothing was written (retryable)
    ├── SchemaError               the database schema does not match this agent_store, or a migration failed
    │   ├── SchemaOutOfDateError  database behind the code: run `agent-store upgrade`
    │   └── SchemaTooNewError     database ahead of the code: upgrade the agent-store package
    ├── StorageUnavailableError   cannot connect, connection lost, pool timeout, deadlock, serialization
    │                             failure, statement timeout (retryable); read-only database (not retryable,
    │                             but for a URL naming several servers: a failover under way)
    └── DatabaseError             the database refused a statement for any other reason (not retryable)

Every translation is ``raise ... from exc`` (the original stays in ``__cause__``); messages name the database
with its password hidden and never carry SQL text or parameters.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from agent_framework.exceptions import WorkflowCheckpointException
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url


class AgentStoreError(Exception):
    """Base class of every error agent_store raises on purpose.

    ``retryable`` says whether repeating the same call (a commit, a load) can succeed without any change.
    """

    retryable: bool = False

    def __init__(self, *args: object, retryable: bool | None = None) -> None:
        super().__init__(*args)
        if retryable is not None:
            self.retryable = retryable


class ConfigurationError(AgentStoreError, ValueError):
    """The store was configured wrongly (bad URL, sync driver, bad option)."""


class MissingExtraError(ConfigurationError):
    """An optional part (search by meaning, the browser, AG-UI, ...) used without its extra installed.

    ``extra`` is the extra's name; the message says how to install it, from an index and from a checkout.
    """

    def __init__(self, what: str, extra: str, missing: str | None) -> None:
        self.extra = extra
        module = f" ({missing} is not installed)" if missing else ""
        super().__init__(f'{what} needs the "{extra}" extra{module}: pip install "agent-store[{extra}]", '
                         f'or in a checkout of agent_store: pip install ".[{extra}]"')  # fmt: skip


@contextmanager
def needs_extra(extra: str, what: str) -> Iterator[None]:
    """Imports inside the block come from the optional ``extra``: a missing one is a ``MissingExtraError``."""
    try:
        yield
    except ImportError as exc:
        raise MissingExtraError(what, extra, getattr(exc, "name", None)) from exc


class InvalidValueError(AgentStoreError, ValueError):
    """A value cannot be stored as it is; the message names the key or field and the rule broken."""


class EmbeddingProfileError(ConfigurationError):
    """A query's embedding space is not the stored vectors' (another model, size or version): never compared."""


class NotEmbeddedError(ConfigurationError):
    """Ranking by meaning alone was asked of a store none of whose messages has a vector in its embedder's
    profile: the backfill (``store.embeddings.backfill()``, ``agent-store embed``) has not run. Hybrid ranking
    does not raise it: it ranks by words and says so (``SearchPage.ranking``)."""


class ContentSealedError(AgentStoreError):
    """Content sealed with per-user keys (``Store(keys=...)``) that cannot be opened: its key was destroyed (the
    user was erased, so this is a copy from before, such as a restored backup), or it was moved from another row
    or another user. Nothing of it is returned."""


class CheckpointRefusedError(AgentStoreError, WorkflowCheckpointException):
    """A stored workflow checkpoint was not read back: it would run a constructor, names a type outside the
    allow-list, or is malformed. Nothing it names was built. Also a ``WorkflowCheckpointException``, what the
    framework's ``CheckpointStorage.load`` raises."""


class SessionNotFoundError(AgentStoreError, LookupError):
    """No session with this id exists for the given user (and agent)."""


class StreamNotFoundError(AgentStoreError, LookupError):
    """No streamed run with this id in the journal for the given user (never started, purged, or erased)."""


class StreamBusyError(InvalidValueError):
    """A run cannot start: its stream id is used already (a run's id is used once), or its conversation has a
    run in progress (``live_stream_id``: an AG-UI thread runs one at a time; follow that one instead)."""

    def __init__(self, message: str, *, live_stream_id: str | None = None) -> None:
        super().__init__(message)
        self.live_stream_id = live_stream_id


class StreamLostError(AgentStoreError):
    """A journal writer no longer holds its run: the run was ended elsewhere (marked ``incomplete`` once its lease
    ran out, or finished); nothing of the batch was written."""


class SessionClosedError(AgentStoreError):
    """The session was closed with ``close_session``: its transcript stays readable, runs are refused."""


class SessionExpiredError(AgentStoreError):
    """The session's idle time-to-live ran out; open it with ``if_expired="restart"`` to start afresh."""


class BudgetExceededError(AgentStoreError):
    """A run was refused at load: its user's (or the app's) token budget for the current period is spent.

    ``scope`` ("user" or "app"), ``subject`` (the user id or app id), ``used`` and ``limit`` (tokens), and
    ``resets_at`` (when the period ends; None for a "total" budget) say which budget and until when.
    """

    def __init__(self, scope: str, subject: str, used: int, limit: int, resets_at: datetime | None) -> None:
        until = f"; it resets at {resets_at.isoformat()}" if resets_at else "; it does not reset (period: total)"
        super().__init__(f"the {scope} {subject!r} has used {used} of its {limit} tokens{until}")
        self.scope, self.subject, self.used, self.limit, self.resets_at = scope, subject, used, limit, resets_at


class ConflictError(AgentStoreError):
    """Another run committed first, or the session was replaced since this run loaded it; nothing was written.

    Retryable by reloading (``agent_store.retry_on_conflict``), not by committing the same run again.

    Attributes:
        session_id: the conversation whose commit was refused.
        keys: the state keys both runs changed (empty when the whole session was replaced).
    """

    retryable = True

    def __init__(self, session_id: str, keys: list[str], *, reason: str | None = None) -> None:
        self.session_id = session_id
        self.keys = keys
        what = reason or f"state keys {keys} were changed by another run after this run loaded them"
        super().__init__(
            f"session {session_id!r}: {what}; nothing was written "
            "(reload and retry, e.g. with agent_store.retry_on_conflict)"
        )


class SchemaError(AgentStoreError):
    """The database schema does not match the migrations shipped with this agent_store."""


class SchemaOutOfDateError(SchemaError):
    """The database is behind the code's schema; `agent-store upgrade` (or store.migrate()) fixes it."""


class SchemaTooNewError(SchemaError):
    """The database was migrated by a newer agent_store than the one running."""


class StorageUnavailableError(AgentStoreError):
    """The database could not be reached, went away, timed out, rolled back a deadlock, or refused to write.

    ``connection_lost``: a pooled connection turned out dead (the server restarted, a proxy dropped it); the
    pool has dropped every connection of that age, so a new attempt gets a fresh one.
    ``refused``: the database answered that it refused the statement (a lock or statement timeout, a deadlock, a
    serialization failure, SQLite's busy or locked file): nothing of it was kept, whatever was sent.
    """

    retryable = True
    connection_lost = False
    refused = False


class CheckedPathNeeded(AgentStoreError):
    """Internal, never raised to callers: the one-round-trip commit refused (SQLSTATE AS000), nothing kept."""


class DatabaseError(AgentStoreError):
    """The database refused a statement for a reason that is neither an outage nor a value agent_store checks."""


def redact(url: URL | str) -> str:
    """Render a database URL for messages, with its passwords replaced by *** (also one given in the query
    string, e.g. ``?password=...``, which asyncpg accepts)."""
    if not isinstance(url, URL):
        try:
            url = make_url(url)
        except Exception:
            return "(a database URL that could not be parsed)"
    secrets = {k: "***" for k in url.query if k.lower() in ("password", "sslpassword")}
    return url.update_query_dict(secrets).render_as_string(hide_password=True)


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
