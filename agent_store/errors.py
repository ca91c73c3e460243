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

The driver's, the pool's and Alembic's errors become these in one place, db/translation.py (``translated``).
Every translation is ``raise ... from exc`` (the original stays in ``__cause__``); messages name the database
with its password hidden and never carry SQL text or parameters.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from agent_framework.exceptions import WorkflowCheckpointException
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
