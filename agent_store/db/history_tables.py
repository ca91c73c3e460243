"""What a conversation's points read back (migrations 0016, 0017): response keys, and the values rewrites replaced.

- ``agent_message_marks``: a message's compaction columns before a commit rewrote them (0016, a trigger): a fork
  or a truncation at an earlier seq, and a point read back, put them back.
- ``agent_responses``: a key (a response id) naming a point: a session, the seq after the point's last message,
  the session's version then (0017); or, ``moves``, naming the session's head wherever it is (0018).
- ``agent_state_history``: a session's own key before a change, once a point was recorded on it (0017, triggers).
- ``agent_branch_marks``: a branch's compaction of its base's messages, from a horizon on (0017).

Every row belongs to a session and goes with it.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    and_,
    case,
    false,
    literal,
    null,
    or_,
    select,
)
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.orm import Mapped, mapped_column

from agent_store.db.column_types import JsonText, UTCDateTime
from agent_store.db.schema_base import ID_MAX, Base

# 0021: the indexes by dialect: the key's (a hash either way), and a parent's by id or a session's rows.
PG_KEY_INDEX, SQLITE_KEY_INDEX = "ix_agent_responses_response_id", "ix_agent_responses_key_hash"
PG_ID_INDEX, SQLITE_SESSION_INDEX = "ix_agent_responses_id", "ix_agent_responses_session_id"


class MessageMarksRow(Base):
    """A message's compaction columns before a commit rewrote them (migration 0016, written by a trigger): what a
    fork or a truncation at an earlier seq puts back. ``horizon``: the first seq of the commit that rewrote it."""

    __tablename__ = "agent_message_marks"

    session_id: Mapped[str] = mapped_column(
        String(ID_MAX), ForeignKey("agent_sessions.id", ondelete="CASCADE"), primary_key=True
    )
    horizon: Mapped[int] = mapped_column(Integer, primary_key=True)
    message_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)  # the rewriting commit's (0 in a fork's copy)
    marks: Mapped[Any | None] = mapped_column(JsonText())
    excluded: Mapped[bool] = mapped_column(Boolean)
    exclude_reason: Mapped[str | None] = mapped_column(String(ID_MAX))
    summarized_by: Mapped[str | None] = mapped_column(String(ID_MAX))
    excluded_at: Mapped[int | None] = mapped_column(Integer)
    pos: Mapped[int | None] = mapped_column(BigInteger)


class ResponseRow(Base):
    """A key (a response id) naming a point of a conversation (0017): the session holding that point's last turn,
    the seq after its last message, and the session's version then. A point never changes.

    0021: rows are numbered (``id``, in the order they were made) and a response names the point it continued from
    by that number (``parent``; ``parent_id``, its key, where no row names it), so a row holds its key and its
    session once. The primary key is ``(session_id, id)`` on PostgreSQL (an index on ``id`` finds a parent) and
    the rowid on SQLite (an index on ``session_id`` finds a session's rows)."""

    __tablename__ = "agent_responses"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer(), "sqlite"), primary_key=True)
    parent: Mapped[int | None] = mapped_column(BigInteger)  # the row of the point it continued from
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    seq_end: Mapped[int] = mapped_column(Integer)
    version: Mapped[int] = mapped_column(Integer)
    # 0018: the key names the session's head and moves with it (a conversation id kept beside the session's own
    # id); seq_end and version are where it was last set.
    moves: Mapped[bool] = mapped_column(Boolean, server_default=false())
    session_id: Mapped[str] = mapped_column(String(ID_MAX), ForeignKey("agent_sessions.id", ondelete="CASCADE"))
    response_id: Mapped[str] = mapped_column(String(ID_MAX))
    user_id: Mapped[str | None] = mapped_column(String(ID_MAX))
    # The parent's key where ``parent`` names no row (deleted, or never a row here), and as code before 0021 wrote it.
    parent_id: Mapped[str | None] = mapped_column(String(ID_MAX))
    key_hash: Mapped[int | None] = mapped_column(Integer)  # SQLite: key_hash(response_id); NULL on PostgreSQL

    __table_args__ = (
        # Found by its key (one key, one point: the store checks under a lock on the key; no unique index, as the
        # key is not the distribution column on Citus), by equality only: the index holds a hash of the key (a
        # hash index on PostgreSQL; SQLite has none, nor a hash function: an index on the hash the store writes).
        Index(PG_KEY_INDEX, "response_id", postgresql_using="hash"),
        Index(SQLITE_KEY_INDEX, "key_hash"),
        Index(SQLITE_SESSION_INDEX, "session_id"),
        Index(PG_ID_INDEX, "id"),
        {"sqlite_autoincrement": True},
    )


def key_hash(key: str) -> int:
    """A response key's 32-bit hash (``agent_responses.key_hash``, SQLite; migration 0021 computes it the same):
    as wide as PostgreSQL's hash index keeps, and a lookup compares the key as well."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "big", signed=True)


def key_is(columns: Any, key: Any, hashed: Any) -> ColumnElement[bool]:
    """The rows of a key: by its hash where one was written (SQLite's index), or by the key alone where none was
    (PostgreSQL, whose index hashes by itself, and rows that code before 0021 wrote)."""
    return and_(columns.response_id == key, or_(columns.key_hash == hashed, columns.key_hash.is_(None)))


class StateHistoryRow(Base):
    """A session's own state key before a commit changed it (0017; a trigger, once the session keeps history)."""

    __tablename__ = "agent_state_history"

    session_id: Mapped[str] = mapped_column(
        String(ID_MAX), ForeignKey("agent_sessions.id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    until_version: Mapped[int] = mapped_column(Integer, primary_key=True)  # the commit that changed it
    value: Mapped[Any | None] = mapped_column(JsonText())
    existed: Mapped[bool] = mapped_column(Boolean)  # false: that commit created the key


class BranchMarksRow(Base):
    """A branch's compaction columns for a message of its base, from ``horizon`` on (0017)."""

    __tablename__ = "agent_branch_marks"

    session_id: Mapped[str] = mapped_column(
        String(ID_MAX), ForeignKey("agent_sessions.id", ondelete="CASCADE"), primary_key=True
    )
    message_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)  # the branch's commit that wrote it
    horizon: Mapped[int] = mapped_column(Integer)  # that commit's first seq (a truncation forgets what came after)
    marks: Mapped[Any | None] = mapped_column(JsonText())
    excluded: Mapped[bool] = mapped_column(Boolean)
    exclude_reason: Mapped[str | None] = mapped_column(String(ID_MAX))
    summarized_by: Mapped[str | None] = mapped_column(String(ID_MAX))
    pos: Mapped[int | None] = mapped_column(BigInteger)


message_marks_t = cast(Table, MessageMarksRow.__table__)
responses_t = cast(Table, ResponseRow.__table__)
state_history_t = cast(Table, StateHistoryRow.__table__)
branch_marks_t = cast(Table, BranchMarksRow.__table__)


async def insert_row(db: AsyncConnection, row: dict[str, Any], parent: str | None) -> None:
    """A key's row, naming the point it continued from by that point's row (0021): the parent key's row of the same
    user, found in the insert itself (no round trip); by its key only where it names no row (a session's own id
    that never became a key). A commit (run/responses.py) and an import write their rows through here."""
    if db.dialect.name == "sqlite":  # the key's index (see ResponseRow)
        row = {**row, "key_hash": key_hash(row["response_id"])}
    if parent is None:
        await db.execute(responses_t.insert(), row)
        return
    up, base = responses_t.alias("up"), responses_t.metadata.tables["agent_sessions"].alias("base")
    user = row.get("user_id")
    mine = up.c.user_id.is_(None) if user is None else up.c.user_id == user
    # Only in the child's session or its base (where a run continues from): rows there outlive the child (a base
    # is deleted with its branches, never purged before them), and a deleted one leaves its key with its
    # children there (cut_points.py).
    near = or_(up.c.session_id == row["session_id"],
               up.c.session_id == select(base.c.base_id).where(base.c.id == row["session_id"]).scalar_subquery())
    found = select(up.c.id).where(key_is(up.c, parent, key_hash(parent)), mine, near).order_by(up.c.id.desc())
    row_of = found.limit(1).scalar_subquery()
    named = case((row_of.is_(None), literal(parent, String)), else_=null())
    await db.execute(responses_t.insert().values(parent=row_of, parent_id=named), row)
