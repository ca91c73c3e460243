"""A run's journal (migration 0019): every event a streamed run sends, numbered, so a client that lost its
connection reads what it missed from any worker (agent_store/journal/).

- ``agent_streams``: one row per streamed run, partitioned by user (``""``: none): its ``status``
  (``in_progress``, ``completed``, ``failed``, ``cancelled``, ``incomplete``), the last sequence number written,
  the worker writing it and until when it holds it (``lease_until``: a writer renews it with every batch; an
  ``in_progress`` run whose lease ran out is a run whose worker died), a cancel asked from anywhere, and when it
  expires (a TTL from its last write; the purge deletes it).
- ``agent_stream_events``: its events, ``seq`` 1, 2, 3, ... with no gap, each a JSON document.

Every row is a user's: ``erase_user`` deletes them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import BigInteger, Boolean, ForeignKeyConstraint, Index, String, Table, Text, false, text
from sqlalchemy.orm import Mapped, mapped_column

from agent_store.db.column_types import JsonText, UTCDateTime
from agent_store.db.schema_base import ID_MAX, Base

STATUSES = ("in_progress", "completed", "failed", "cancelled", "incomplete")
LIVE_THREAD = text("status = 'in_progress' AND kind = 'agui' AND conversation_id IS NOT NULL")
NOTIFY_CHANNEL = "agent_store_streams"  # PostgreSQL: a batch's or a cancel's NOTIFY, ["batch"|"cancel", user, id]


class StreamRow(Base):
    __tablename__ = "agent_streams"

    user_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    stream_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    conversation_id: Mapped[str | None] = mapped_column(String(ID_MAX))  # the conversation (session) it serves
    kind: Mapped[str] = mapped_column(String(32))  # what its events are: "agui", "responses", "updates", ...
    status: Mapped[str] = mapped_column(String(16))
    last_seq: Mapped[int] = mapped_column(BigInteger)
    owner: Mapped[str | None] = mapped_column(String(ID_MAX))  # the writing worker
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    cancel_requested: Mapped[bool] = mapped_column(Boolean, server_default=false())
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (
        Index("ix_agent_streams_expires_at", "expires_at"),
        Index("ix_agent_streams_live", "lease_until", postgresql_where=text("status = 'in_progress'"),
              sqlite_where=text("status = 'in_progress'")),
        # One AG-UI run in progress per thread (0020): a second is refused, whichever worker starts it.
        Index("ux_agent_streams_live_thread", "user_id", "conversation_id", unique=True,
              postgresql_where=LIVE_THREAD, sqlite_where=LIVE_THREAD),
        {"sqlite_with_rowid": False},
    )


class StreamEventRow(Base):
    __tablename__ = "agent_stream_events"

    user_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    stream_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    event: Mapped[Any] = mapped_column(JsonText())

    __table_args__ = (
        ForeignKeyConstraint(["user_id", "stream_id"], ["agent_streams.user_id", "agent_streams.stream_id"],
                             ondelete="CASCADE"),
        {"sqlite_with_rowid": False},
    )


streams_t = cast(Table, StreamRow.__table__)
stream_events_t = cast(Table, StreamEventRow.__table__)
