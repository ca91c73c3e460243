"""The Store: one engine (and its pool) plus the verbs an application calls."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any

from agent_framework import AgentSession
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_store.db import codec, message_rows
from agent_store.db.database import Database, Settings
from agent_store.db.engine import make_engine
from agent_store.db.warm_up import open_and_ready
from agent_store.errors import ConfigurationError, InvalidValueError
from agent_store.journal import Journal
from agent_store.keys import KeyProvider
from agent_store.models import ErasureReport, MessageRecord, SearchPage, SessionInfo, SessionPage, TransferReport
from agent_store.operations import branching, health, lifecycle, retention, seal_clear, stats, transfer, transfer_all
from agent_store.operations.usage import UsageLedger
from agent_store.run import priming
from agent_store.run.commit import Run
from agent_store.run.load import load
from agent_store.run.recording import recording_into, say_if_unrecorded
from agent_store.search import hybrid
from agent_store.search.vectors import Embeddings

if TYPE_CHECKING:
    from agent_store.search.embedders import Embedder  # numpy loads with the first embedder

Progress = Callable[[int], None]  # called with how many were done since the last call


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
        keys: per-user data keys instead (``KeyFile(path)``, agent_store/keys.py): erase_user shreds a user's.
        check_schema: verify once, before first use, that the database is at this code's schema.
        embedder: search by meaning too (search/embedders.py: ``"wordllama"``, ``"e5"``, or an embedder object).
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        app_id: str = "default",
        idle_ttl: timedelta | None = None,
        max_value_bytes: int = codec.DEFAULT_MAX_VALUE_BYTES,
        message_cipher: message_rows.MessageCipher | None = None,
        keys: KeyProvider | None = None,
        check_schema: bool = True,
        embedder: Embedder | str | None = None,
        operator: bool = False,
    ) -> None:
        codec.check_id(app_id, "app_id", required=True)
        if type(max_value_bytes) is not int or max_value_bytes < 1024:
            raise InvalidValueError(f"max_value_bytes must be an int of at least 1024, not {max_value_bytes!r}")
        settings = Settings(app_id=app_id, idle_ttl_seconds=codec.check_ttl(idle_ttl, "idle_ttl"),
                            max_value_bytes=max_value_bytes, message_cipher=message_cipher, operator=operator is True,
                            keys=keys)  # fmt: skip
        self.db = Database(engine, settings, check_schema=check_schema)  # operator: docs/row-security.md
        self.engine = engine
        self.usage = UsageLedger(self.db)  # the usage ledger's reports, budgets and prices
        self.embeddings = Embeddings(self.db, embedder)  # search by meaning: search/vectors.py

    @classmethod
    def from_url(cls, url: str | URL | None = None, **options: Any) -> Store:
        """Open a store on ``url``; without one, ``$AGENT_STORE_URL``, else ``sqlite+aiosqlite:///agent_store.db``.

        Keyword options go to :class:`Store` (its own) or, for any other name, to ``create_async_engine``.
        ``replica_url`` sends listings, transcript pages, exports and stats to a read replica (runs always
        load and commit on the primary). No connection is made here.

        Raises:
            ConfigurationError: malformed URL, a sync driver (``postgresql://``, ``sqlite://``), in-memory SQLite,
                or a ``pool`` object with ``replica_url``.
        """
        store_options = {
            k: options.pop(k)
            for k in inspect.signature(cls.__init__).parameters if k in options and k not in ("self", "engine")
        }
        replica_url = options.pop("replica_url", None)
        if replica_url is not None and "pool" in options:  # one pool object would serve both: reads on the primary
            raise ConfigurationError("replica_url cannot share a pool object with the primary; give pool options")
        store = cls(make_engine(url, **options), **store_options)
        if replica_url is not None:
            store.db.use_replica(make_engine(replica_url, **options))
        return store

    @property
    def url(self) -> URL:
        return self.engine.url

    @property
    def app_id(self) -> str:
        return self.db.settings.app_id

    async def warm_up(self, connections: int | None = None, *, for_runs: bool = True) -> int:
        """Open the pool's connections now (default: as many as it keeps, ``pool_size``) and check the schema.

        Call it at start-up: the first runs then find connections ready, and a wrong URL, a down server or an
        old schema fails here. Returns how many connections were opened. On PostgreSQL each connection also runs
        a load's statements and, ``for_runs``, makes a run's two common commits in a transaction it rolls back
        (nothing is kept); ``for_runs=False`` sends nothing that writes (a browser or a report only reads)."""
        if not isinstance(for_runs, bool):
            raise InvalidValueError(f"for_runs must be True or False, not {for_runs!r}")
        commits = (lambda conn: priming.prime_commits(self.db, conn)) if for_runs else None
        return await open_and_ready(self.db, connections, commits)

    async def ready(self, *, figures: bool = False) -> dict[str, Any]:
        """A readiness probe: the database answers and its schema runs this code (else the error a run would
        meet); ``figures``: purge lag, conflicts and stuck runs, what an operator alerts on (operations/health.py)."""
        return await health.ready(self.db, figures=figures)

    def journal(self, **options: Any) -> Journal:
        """A run journal on this store (journal/facade.py): ``worker_id``, ``batch_events``, ``lease_s``, ..."""
        return Journal(self.db, **options)

    async def migrate(self, revision: str = "head") -> None:
        """Upgrade the schema to ``revision`` with the shipped migrations (same as ``alembic upgrade``).

        Raises ``InvalidValueError`` for an unknown revision or one the database is already past (use
        :meth:`downgrade`), ``SchemaTooNewError`` when the database is at a revision this package does not know.
        """
        codec.check_id(revision, "revision", required=True)
        await self.db.alembic("upgrade", revision)

    async def downgrade(self, revision: str) -> None:
        """Downgrade the schema to ``revision`` (``"base"`` drops every agent_store table)."""
        codec.check_id(revision, "revision", required=True)
        await self.db.alembic("downgrade", revision)

    async def load(
        self, session_id: str, *, user_id: str | None = None, agent_id: str | None = None,
        history_limit: int | None = None, if_expired: str = "error", serialized: bool = False,
        run_id: str | None = None, skip_excluded: bool = False,
    ) -> Run:  # fmt: skip
        """Load a session for one run: ``await run.commit()`` it (or ``run.discard()``). See :meth:`session`."""
        return await load(
            self.db, session_id, user_id=user_id, agent_id=agent_id, history_limit=history_limit,
            if_expired=if_expired, serialized=serialized, run_id=run_id, skip_excluded=skip_excluded,
        )  # fmt: skip

    @asynccontextmanager
    async def session(
        self, session_id: str, *, user_id: str | None = None, agent_id: str | None = None,
        history_limit: int | None = None, if_expired: str = "error", serialized: bool = False,
        run_id: str | None = None, skip_excluded: bool = False,
    ) -> AsyncIterator[AgentSession]:  # fmt: skip
        """Yield the stored session as an ``AgentSession``; commit what changed when the block exits.

        The session is created on first use. ``history_limit`` loads only the last N messages (the
        database keeps them all). If the block raises, nothing is written and the exception propagates.
        An expired session raises ``SessionExpiredError``, or with ``if_expired="restart"`` starts afresh.
        ``serialized=True`` queues overlapping runs on this session instead of letting them conflict: the run
        holds the session's lock and one pooled connection from load to commit (PostgreSQL advisory lock;
        on SQLite the database write lock, which queues every writer). ``run_id`` is the caller's idempotency
        key (a request id): a commit under a key already committed writes nothing and returns the first result.
        ``skip_excluded=True`` loads only the messages a compaction left included (summaries among them), in
        the framework's order, reading no excluded original: for runs that do not compact (a compaction must
        see the whole list; its commit is refused with ``InvalidValueError``).

        Raises:
            SessionNotFoundError: the id belongs to another user, or to another agent.
            SessionClosedError / SessionExpiredError: the session was closed / outlived its time-to-live.
            ConflictError: on exit, another run changed the same state keys first.
            InvalidValueError: a state value or message cannot be stored.
            SchemaError: the database is not at this code's schema.
            StorageUnavailableError: the database cannot be reached.
        """
        run = await self.load(
            session_id, user_id=user_id, agent_id=agent_id, history_limit=history_limit, if_expired=if_expired,
            serialized=serialized, run_id=run_id, skip_excluded=skip_excluded,
        )  # fmt: skip
        try:
            with recording_into(run.calls):  # an application's UsageRecorder records here
                yield run.session
        except BaseException as exc:
            await run.discard()
            if isinstance(exc, Exception | asyncio.CancelledError):  # its model calls were spent all the same
                await run.log_unwritten("failed")  # (a client that went away must not spend a budget unseen)
            raise
        say_if_unrecorded(run.calls, run.history, run.loaded_ids, budgeted=run.budgeted)  # never silently off
        await run.commit()

    # ---- lifecycle: see operations/ ---------------------------

    async def list_sessions(
        self, *, user_id: str | None = None, all_users: bool = False, agent_id: str | None = None,
        metadata: dict[str, Any] | None = None, limit: int = 50, cursor: str | None = None, status: str | None = None,
    ) -> SessionPage:  # fmt: skip
        """A page of ``user_id``'s sessions (every user's with ``all_users=True``; with neither, the sessions that
        have no user), most recently active first.

        ``metadata`` keeps sessions whose metadata has those key/value pairs; ``status`` ("active", "closed",
        "expired") those in that state. Pass the page's ``next_cursor``
        back as ``cursor`` for the next page (keyset pagination: stable and index-served at any depth).
        """
        return await lifecycle.list_sessions(
            self.db, user_id=user_id, all_users=all_users, agent_id=agent_id, metadata=metadata, limit=limit,
            cursor=cursor, status=status,
        )  # fmt: skip

    async def search(
        self, query: str, *, user_id: str | None = None, all_users: bool = False, session_id: str | None = None,
        agent_id: str | None = None, limit: int = 20, cursor: str | None = None, ranking: str = "auto",
        min_score: float | None = None,
    ) -> SearchPage:  # fmt: skip
        """Messages of ``user_id``'s sessions (``all_users``: every user's, an operator's) that match ``query``,
        best first (``agent_store.search``): words, ``"phrases"``, ``OR``, ``-exclusions``; Chinese inside words.
        ``ranking``: ``keyword``, ``vector``, ``hybrid`` (both, fused), or ``auto`` (hybrid with an embedder).
        ``min_score``: by meaning, the lowest cosine similarity a hit found by meaning alone may have (each hit's
        ``similarity`` says its own); a question of any length by meaning (the words' leg takes its longest terms)."""
        return await hybrid.search(
            self.db, self.embeddings, query, ranking=ranking, user_id=user_id, session_id=session_id,
            agent_id=agent_id, limit=limit, cursor=cursor, all_users=all_users, min_score=min_score,
        )  # fmt: skip

    async def get(self, session_id: str, *, user_id: str | None = None) -> SessionInfo:
        """One session's summary. Raises ``SessionNotFoundError`` (also for another user's session)."""
        return await lifecycle.get(self.db, session_id, user_id)

    async def messages(
        self, session_id: str, *, user_id: str | None = None, after_seq: int = -1, limit: int = 100
    ) -> list[MessageRecord]:
        """Up to ``limit`` stored messages with ``seq > after_seq``, in order: page through a transcript."""
        return await lifecycle.messages(self.db, session_id, user_id, after_seq, limit)

    async def update(self, session_id: str, *, user_id: str | None = None, **changes: Any) -> None:
        """Set a session's ``title`` (str or None), ``metadata`` (a JSON dict) or idle ``ttl`` (a timedelta)."""
        if unknown := set(changes) - {"title", "metadata", "ttl"}:
            raise InvalidValueError(f"update() takes title, metadata and ttl, not {sorted(unknown)}")
        await lifecycle.update_info(self.db, session_id, user_id, changes)

    async def close_session(self, session_id: str, *, user_id: str | None = None) -> None:
        """Make a session read-only: later runs raise ``SessionClosedError``; the transcript stays readable."""
        await lifecycle.close(self.db, session_id, user_id)

    async def clear(self, session_id: str, *, user_id: str | None = None) -> int:
        """Delete a session's messages, keeping the session and its state; returns how many."""
        return await lifecycle.clear(self.db, session_id, user_id)

    async def purge_expired(
        self, *, batch_size: int = 500, batch_messages: int = retention.BATCH_MESSAGES, progress: Progress | None = None
    ) -> int:
        """Delete every expired session, in short transactions of at most ``batch_size`` sessions and
        ``batch_messages`` messages (``progress`` is called with each batch's count); returns how many."""
        return await retention.purge_expired(self.db, batch_size, batch_messages, progress)

    async def purge_checkpoints(self, older_than: timedelta, *, keep_latest: bool = True, batch_size: int = 500) -> int:
        """Delete checkpoints saved over ``older_than`` ago, in batches; each workflow's latest stays (resumable)."""
        return await retention.purge_checkpoints(self.db, older_than, keep_latest=keep_latest, batch_size=batch_size)

    async def count_expired(self) -> int:
        """How many sessions ``purge_expired`` would delete now."""
        return await retention.count_expired(self.db)

    async def erase_user(
        self, user_id: str, *, batch_messages: int = retention.BATCH_MESSAGES, progress: Progress | None = None
    ) -> ErasureReport:
        """Delete everything of a user's, in short transactions (``retention.erase_user``); again if interrupted."""
        return await retention.erase_user(self.db, user_id, batch_messages, progress)

    async def seal_clear(self, *, batch_size: int = 500) -> dict[str, int]:
        """Seal content in clear with per-user keys (keys turned on for a store with content: seal_clear.py)."""
        return await seal_clear.seal_clear(self.db, batch_size=batch_size)

    async def fork(
        self, session_id: str, *, user_id: str | None = None, at_seq: int | None = None, new_id: str | None = None,
        share: bool = False,
    ) -> str:  # fmt: skip
        """Copy a session's history (up to ``at_seq``) and state into a new session; returns its id. ``share``: a
        branch instead (0017), which reads that history through its base, never copied (edit, regenerate)."""
        new_id = uuid.uuid4().hex if new_id is None else new_id
        return await (branching.branch if share else branching.fork)(self.db, session_id, user_id, at_seq, new_id)

    async def tree(self, session_id: str, *, user_id: str | None = None) -> list[branching.TreeNode]:
        """The conversation tree from ``session_id`` down: it, its branches and theirs, and each one's response ids."""
        return await branching.tree(self.db, session_id, user_id)

    async def truncate(self, session_id: str, after_seq: int, *, user_id: str | None = None) -> int:
        """Drop the messages after ``after_seq`` (a rewind; tool calls stay with their results)."""
        return await branching.truncate(self.db, session_id, user_id, after_seq)

    def export(self, *, user_id: str | None = None, session_id: str | None = None, all_users: bool = False
               ) -> AsyncIterator[str]:  # fmt: skip
        """JSON Lines of one session of ``user_id``, of all that user's sessions and rows, or of every user's."""
        return transfer_all.export(self.db, user_id=user_id, session_id=session_id, all_users=all_users)

    async def import_lines(self, lines: Iterable[str], *, progress: Progress | None = None) -> TransferReport:
        """Recreate the sessions of an export; a session that exists already is skipped, never duplicated."""
        return await transfer.import_lines(self.db, lines, progress)

    async def stats(self) -> dict[str, Any]:
        """Every table's rows and bytes on disk (with its indexes), and the busiest sessions."""
        return await stats.stats(self.db)

    async def delete(self, session_id: str, *, user_id: str | None = None) -> bool:
        """Delete a session with its messages, state and run log in one transaction; False if there was none."""
        return await lifecycle.delete_session(self.db, session_id, user_id)

    async def close(self) -> None:  # every pooled connection
        await self.db.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
