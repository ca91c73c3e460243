"""The relational schema, as SQLAlchemy ORM rows. Alembic migrations create it; this module only describes it.

Every session-owned table carries ``session_id`` first in its primary key: it is the natural shard key
(see docs/SCALING.md) and it keeps a session's rows together in the index.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    Boolean,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    String,
    Table,
    Text,
    false,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from agent_store.db.column_types import ExactJsonText as ExactJsonText
from agent_store.db.column_types import JsonText as JsonText
from agent_store.db.column_types import UTCDateTime as UTCDateTime

# The usage ledger's tables (0014), on the same metadata: migrations compare the schema with all of them.
from agent_store.db.compat import compat_t as compat_t
from agent_store.db.history_tables import branch_marks_t as branch_marks_t
from agent_store.db.history_tables import message_marks_t as message_marks_t
from agent_store.db.history_tables import responses_t as responses_t
from agent_store.db.history_tables import state_history_t as state_history_t
from agent_store.db.hosted_tables import hosted_items_t as hosted_items_t
from agent_store.db.hosted_tables import hosted_links_t as hosted_links_t
from agent_store.db.hosted_tables import hosted_responses_t as hosted_responses_t
from agent_store.db.journal_tables import stream_events_t as stream_events_t
from agent_store.db.journal_tables import streams_t as streams_t
from agent_store.db.schema_base import ID_MAX as ID_MAX
from agent_store.db.schema_base import Base as Base
from agent_store.db.usage_tables import budgets_t as budgets_t
from agent_store.db.usage_tables import prices_t as prices_t
from agent_store.db.usage_tables import usage_t as usage_t
from agent_store.db.vector_tables import profiles_t as profiles_t
from agent_store.db.vector_tables import vectors_t as vectors_t

# The Alembic revision this code expects; tests/test_migrations.py pins it to the scripts' head.
SCHEMA_REVISION = "0028"


class SessionRow(Base):
    """One conversation. ``version`` goes up by one with every committed run.

    ``incarnation`` is a random number drawn when the row is created: an id deleted (or expired, purged,
    erased) and used again is a new incarnation, and a run loaded from the old one cannot commit into it.
    """

    __tablename__ = "agent_sessions"

    id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    incarnation: Mapped[int] = mapped_column(BigInteger, server_default="0")
    user_id: Mapped[str | None] = mapped_column(String(ID_MAX))
    agent_id: Mapped[str | None] = mapped_column(String(ID_MAX))
    service_session_id: Mapped[Any | None] = mapped_column(JsonText())
    version: Mapped[int] = mapped_column(Integer, default=0)
    # Next free message seq; also the message count. Bumped under the row lock so seq is gap-free.
    next_seq: Mapped[int] = mapped_column(Integer, default=0)
    # Below this seq every included message has a pos (a compaction placed it): see migration 0013. NULL: 0.
    included_from: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())  # last activity: what listings sort by
    title: Mapped[str | None] = mapped_column(String(512))
    meta: Mapped[Any] = mapped_column("metadata", JsonText(), server_default="{}")  # the app's JSON dict
    last_run_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    closed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())  # set: read-only
    ttl_seconds: Mapped[int | None] = mapped_column(Integer)  # idle time-to-live; NULL: the store's default
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())  # pushed forward by each run
    forked_from: Mapped[str | None] = mapped_column(String(ID_MAX))  # Store.fork: the session branched from
    forked_at_seq: Mapped[int | None] = mapped_column(Integer)  # ... and its last message copied
    # A branch (0017): its messages before base_seq are base_id's (through its chain of bases), never copied.
    base_id: Mapped[str | None] = mapped_column(String(ID_MAX))  # no foreign key: see migration 0017
    base_seq: Mapped[int | None] = mapped_column(Integer)
    base_version: Mapped[int | None] = mapped_column(Integer)  # the base's version at the point it branched from
    base_incarnation: Mapped[int | None] = mapped_column(BigInteger)  # which session of base_id it is (0027)
    keeps_history: Mapped[bool] = mapped_column(Boolean, server_default=false())  # a point was recorded on it

    __table_args__ = (
        Index(None, "user_id", "updated_at", "id"),  # a user's sessions, newest first (keyset pagination)
        Index(None, "updated_at", "id"),
        Index(None, "expires_at"),  # purge_expired
        Index(
            None,
            "forked_from",
            postgresql_where=text("forked_from IS NOT NULL"),
            sqlite_where=text("forked_from IS NOT NULL"),
        ),  # a session's branches
        Index(
            None, "base_id", postgresql_where=text("base_id IS NOT NULL"), sqlite_where=text("base_id IS NOT NULL")
        ),  # the branches that point at it (0017)
    )


PLACED = text("pos IS NOT NULL")  # the rows a compaction placed: summaries, a few per session (0013)


class MessageRow(Base):
    """One chat message, in commit order. ``body`` is ``Message.to_dict()``; ``text`` its plain text."""

    __tablename__ = "agent_messages"

    session_id: Mapped[str] = mapped_column(
        String(ID_MAX), ForeignKey("agent_sessions.id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    message_id: Mapped[str] = mapped_column(String(ID_MAX))
    run_id: Mapped[str] = mapped_column(String(ID_MAX))
    role: Mapped[str] = mapped_column(String(32))
    author_name: Mapped[str | None] = mapped_column(String(ID_MAX))
    text: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    body: Mapped[Any] = mapped_column(JsonText())
    # Compaction (migration 0013): the framework's marks as written, the same facts as columns, and the place in
    # the framework's list where it differs from commit order (NULL: at seq; the order is coalesce(pos, seq<<32)).
    pos: Mapped[int | None] = mapped_column(BigInteger)
    marks: Mapped[Any | None] = mapped_column(JsonText())
    excluded: Mapped[bool] = mapped_column(Boolean, server_default=false())
    exclude_reason: Mapped[str | None] = mapped_column(String(ID_MAX))
    summarized_by: Mapped[str | None] = mapped_column(String(ID_MAX))  # the store id of the summary replacing it
    excluded_at: Mapped[int | None] = mapped_column(Integer)  # the first seq of the commit that excluded it
    summary_of: Mapped[Any | None] = mapped_column(JsonText())  # a summary's links, apart (message_rows.SUMMARY_LINKS)

    # On PostgreSQL the index keys md5(message_id)::uuid, 16 bytes instead of the id's text (migration 0011).
    __table_args__ = (
        Index(None, "session_id", "message_id", unique=True),
        Index("ix_agent_messages_placed", "session_id", "seq", postgresql_where=PLACED, sqlite_where=PLACED),
    )


class StateRow(Base):
    """One top-level key of ``AgentSession.state``; ``version`` is the random stamp of the commit that wrote it."""

    __tablename__ = "agent_state"

    session_id: Mapped[str] = mapped_column(
        String(ID_MAX), ForeignKey("agent_sessions.id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    value: Mapped[Any] = mapped_column(JsonText())
    version: Mapped[int] = mapped_column(BigInteger)  # a write stamp: equal means "not written since"
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class RunRow(Base):
    """One committed run. Its key makes a retried commit of the same run a no-op, never a duplicate."""

    __tablename__ = "agent_runs"

    session_id: Mapped[str] = mapped_column(
        String(ID_MAX), ForeignKey("agent_sessions.id", ondelete="CASCADE"), primary_key=True
    )
    run_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)  # ours, or the caller's idempotency key
    version: Mapped[int] = mapped_column(Integer)
    messages_written: Mapped[int] = mapped_column(Integer)
    state_keys_written: Mapped[int] = mapped_column(Integer)
    messages_rewritten: Mapped[int] = mapped_column(Integer, server_default="0")  # a compaction's (0013)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    committed_at: Mapped[datetime] = mapped_column(UTCDateTime())
    agent_name: Mapped[str | None] = mapped_column(String(ID_MAX))
    messages_in: Mapped[int] = mapped_column(Integer, server_default="0")  # user / tool messages
    messages_out: Mapped[int] = mapped_column(Integer, server_default="0")  # assistant messages
    input_tokens: Mapped[int | None] = mapped_column(Integer)
    output_tokens: Mapped[int | None] = mapped_column(Integer)
    outcome: Mapped[str] = mapped_column(String(32), server_default="committed")  # or "conflict"

    __table_args__ = ({"sqlite_with_rowid": False},)  # SQLite: stored in its primary key (0022)


class ToolCallRow(Base):
    """One function call or function result inside a message, so tools can be queried (and paired) in SQL."""

    __tablename__ = "agent_tool_calls"

    session_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    call_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # "call" or "result"
    tool_name: Mapped[str | None] = mapped_column(String(ID_MAX))  # a result's name, when its call is known

    __table_args__ = (
        ForeignKeyConstraint(
            ["session_id", "seq"], ["agent_messages.session_id", "agent_messages.seq"], ondelete="CASCADE"
        ),
        Index(None, "session_id", "call_id"),
    )


class UserStateRow(Base):
    """A ``user:``-prefixed state key: shared by every session of one user (long-term memory)."""

    __tablename__ = "agent_user_state"

    user_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    key: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    value: Mapped[Any] = mapped_column(JsonText())
    version: Mapped[int] = mapped_column(BigInteger)  # a random write stamp: equal means "not written since"
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class AppStateRow(Base):
    """An ``app:``-prefixed state key: shared by every session of one application (``Store(app_id=...)``)."""

    __tablename__ = "agent_app_state"

    app_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    key: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    value: Mapped[Any] = mapped_column(JsonText())
    version: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class ErasureRow(Base):
    """A user erased at ``erased_at``, keyed by a SHA-256 of the user id: runs loaded before it stay out."""

    __tablename__ = "agent_erasures"

    user_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    erased_at: Mapped[datetime] = mapped_column(UTCDateTime())


class CheckpointRow(Base):
    """A workflow checkpoint (Agent Framework's ``WorkflowCheckpoint``), as its checkpoint encoding produced it.

    ``user_id`` is ``''`` for checkpoints saved without a user. ``seq`` numbers a workflow's checkpoints in
    commit order (per user and workflow name): "latest" is the highest, never a wall-clock timestamp.
    """

    __tablename__ = "agent_checkpoints"

    user_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    checkpoint_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    workflow_name: Mapped[str] = mapped_column(String(ID_MAX))
    seq: Mapped[int] = mapped_column(BigInteger)
    previous_checkpoint_id: Mapped[str | None] = mapped_column(String(ID_MAX))
    timestamp: Mapped[str] = mapped_column(String(64))  # the framework's ISO 8601 text, as it wrote it
    iteration_count: Mapped[int] = mapped_column(Integer)
    saved_at: Mapped[datetime] = mapped_column(UTCDateTime())
    payload: Mapped[Any] = mapped_column(ExactJsonText())  # encode_checkpoint_value(checkpoint.to_dict()), as written

    __table_args__ = (
        Index(None, "user_id", "workflow_name", "seq", unique=True),  # get_latest, list_*, in order
        Index(None, "user_id", "previous_checkpoint_id"),  # walking a chain forwards
        Index(None, "saved_at"),  # retention
    )


class CheckpointWorkflowRow(Base):
    """The next checkpoint ``seq`` of one user's workflow: its row lock orders concurrent saves."""

    __tablename__ = "agent_checkpoint_workflows"

    user_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    workflow_name: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    next_seq: Mapped[int] = mapped_column(BigInteger)


class UISnapshotRow(Base):
    """The latest AG-UI thread snapshot of one thread in one scope (the app's authorization boundary)."""

    __tablename__ = "agent_ui_snapshots"

    scope: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    thread_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    snapshot: Mapped[Any] = mapped_column(ExactJsonText())  # the AGUIThreadSnapshot's fields, as written
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


# Core tables for the run's batched statements (the ORM classes above document them).
sessions_t = cast(Table, SessionRow.__table__)
messages_t = cast(Table, MessageRow.__table__)
state_t = cast(Table, StateRow.__table__)
runs_t = cast(Table, RunRow.__table__)
tool_calls_t = cast(Table, ToolCallRow.__table__)
user_state_t = cast(Table, UserStateRow.__table__)
app_state_t = cast(Table, AppStateRow.__table__)
erasures_t = cast(Table, ErasureRow.__table__)
checkpoints_t = cast(Table, CheckpointRow.__table__)
checkpoint_workflows_t = cast(Table, CheckpointWorkflowRow.__table__)
ui_snapshots_t = cast(Table, UISnapshotRow.__table__)
