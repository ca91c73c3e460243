"""The exceptions agent_store raises, and the one place driver errors are translated.

    AgentStoreError
    ├── ConfigurationError        bad URL, sync driver, unusable option (also a ValueError)
    ├── InvalidValueError         a value that cannot be stored; names the key or field (also a ValueError)
    ├── SessionNotFoundError      no such session for this user / agent (also a LookupError)
    ├── SessionClosedError        the session was closed: readable, no longer writable
    ├── SessionExpiredError       the session outlived its idle time-to-live
    ├── ConflictError             a concurrent run changed the same state keys; nothing was written
    ├── SchemaError               the database schema does not match this version of agent_store
    │   ├── SchemaOutOfDateError  database behind the code: run `agent-store upgrade`
    │   └── SchemaTooNewError     database ahead of the code: upgrade the agent-store package
    └── StorageUnavailableError   cannot connect, connection lost, timed out, read-only database

Driver and SQLAlchemy exceptions are mapped by type in :func:`translated`, always ``raise ... from exc``
so the original stays in ``__cause__``; messages name the database with its password hidden.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL


class AgentStoreError(Exception):
    """Base class of every error agent_store raises on purpose."""


class ConfigurationError(AgentStoreError, ValueError):
    """The store was configured wrongly (bad URL, sync driver, bad option)."""


class InvalidValueError(AgentStoreError, ValueError):
    """A value cannot be stored as it is; the message names the key or field and the rule broken."""


class SessionNotFoundError(AgentStoreError, LookupError):
    """No session with this id exists for the given user (and agent)."""


class SessionClosedError(AgentStoreError):
    """The session was closed with ``close_session``: its transcript stays readable, runs are refused."""


class SessionExpiredError(AgentStoreError):
    """The session's idle time-to-live ran out; open it with ``if_expired="restart"`` to start afresh."""


class ConflictError(AgentStoreError):
    """Another run committed a change to the same state keys first; this run wrote nothing.

    Attributes:
        session_id: the conversation whose commit was refused.
        keys: the state keys both runs changed.
    """

    def __init__(self, session_id: str, keys: list[str]) -> None:
        self.session_id = session_id
        self.keys = keys
        super().__init__(
            f"session {session_id!r}: state keys {keys} were changed by another run after this run "
            "loaded them; nothing was written (reload and retry, e.g. with agent_store.retry_on_conflict)"
        )


class SchemaError(AgentStoreError):
    """The database schema does not match the migrations shipped with this agent_store."""


class SchemaOutOfDateError(SchemaError):
    """The database is behind the code's schema; `agent-store upgrade` (or store.migrate()) fixes it."""


class SchemaTooNewError(SchemaError):
    """The database was migrated by a newer agent_store than the one running."""


class StorageUnavailableError(AgentStoreError):
    """The database could not be reached, went away, timed out or refused to write."""


def redact(url: URL | str) -> str:
    """Render a database URL for messages, with the password replaced by ***."""
    if isinstance(url, URL):
        return url.render_as_string(hide_password=True)
    return str(url)


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return f"{type(orig).__name__}: {text[0]}" if text else type(orig).__name__


@contextmanager
def translated(url: URL, doing: str) -> Iterator[None]:
    """Turn driver failures inside the block into :class:`StorageUnavailableError`.

    Errors of our own tree pass through untouched; so does anything that is not a storage failure
    (a bug should surface as itself, not be disguised).
    """
    try:
        yield
    except AgentStoreError:
        raise
    except (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.DisconnectionError) as exc:
        raise StorageUnavailableError(f"{doing} failed on {redact(url)}: {_first_line(exc)}") from exc
    except sa_exc.DBAPIError as exc:
        if exc.connection_invalidated or isinstance(exc.orig, sqlite3.OperationalError):
            raise StorageUnavailableError(f"{doing} failed on {redact(url)}: {_first_line(exc)}") from exc
        raise
    except (OSError, TimeoutError) as exc:
        raise StorageUnavailableError(f"{doing} failed on {redact(url)}: {_first_line(exc)}") from exc
