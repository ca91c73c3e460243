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

from datetime import datetime
from typing import Any, cast

from sqlalchemy import BigInteger, Boolean, ForeignKey, Index, Integer, String, Table, false
from sqlalchemy.orm import Mapped, mapped_column

from agent_store.db.column_types import JsonText, UTCDateTime
from agent_store.db.schema_base import ID_MAX, Base


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
    the seq after its last message, and the session's version then. A point never changes."""

    __tablename__ = "agent_responses"

    session_id: Mapped[str] = mapped_column(
        String(ID_MAX), ForeignKey("agent_sessions.id", ondelete="CASCADE"), primary_key=True
    )
    response_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    user_id: Mapped[str | None] = mapped_column(String(ID_MAX))
    seq_end: Mapped[int] = mapped_column(Integer)
    version: Mapped[int] = mapped_column(Integer)
    parent_id: Mapped[str | None] = mapped_column(String(ID_MAX))  # the point it continued from
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # 0018: the key names the session's head and moves with it (a conversation id kept beside the session's own
    # id); seq_end and version are where it was last set.
    moves: Mapped[bool] = mapped_column(Boolean, server_default=false())

    __table_args__ = (
        Index("ix_agent_responses_response_id", "response_id"),  # one key, one point: see 0017
        {"sqlite_with_rowid": False},
    )


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
