"""The usage ledger's tables (migration 0014): one row per model call, budgets, and the operator's prices.

A ledger row belongs to a run-log row (``agent_runs``) and goes with it: a session deleted, purged or erased
takes its calls along. The run log's ``input_tokens`` / ``output_tokens`` are the sums of its calls'.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import BigInteger, Boolean, Float, ForeignKeyConstraint, Index, Integer, String, Table, Text, false
from sqlalchemy.orm import Mapped, mapped_column

from agent_store.db.column_types import JsonText, UTCDateTime
from agent_store.db.schema_base import ID_MAX, Base


class UsageRow(Base):
    """One model call of a run: its tokens as the framework reported them, the model, latency and trace."""

    __tablename__ = "agent_usage"

    session_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    call_no: Mapped[int] = mapped_column(Integer, primary_key=True)  # the run's calls, in the order they ended
    user_id: Mapped[str | None] = mapped_column(String(ID_MAX))
    agent_name: Mapped[str | None] = mapped_column(Text)
    app_id: Mapped[str] = mapped_column(String(ID_MAX))
    called_at: Mapped[datetime] = mapped_column(UTCDateTime())  # when the call began
    purpose: Mapped[str] = mapped_column(String(16))  # "chat", "compaction" (a summarizer's), "response" (a total)
    model: Mapped[str | None] = mapped_column(Text)
    provider: Mapped[str | None] = mapped_column(Text)
    input_tokens: Mapped[int | None] = mapped_column(BigInteger)
    output_tokens: Mapped[int | None] = mapped_column(BigInteger)
    total_tokens: Mapped[int | None] = mapped_column(BigInteger)
    cache_creation_input_tokens: Mapped[int | None] = mapped_column(BigInteger)
    cache_read_input_tokens: Mapped[int | None] = mapped_column(BigInteger)
    reasoning_output_tokens: Mapped[int | None] = mapped_column(BigInteger)
    extra: Mapped[Any | None] = mapped_column(JsonText())  # the provider's other counts (UsageDetails' extra items)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    finish_reason: Mapped[str | None] = mapped_column(Text)
    streamed: Mapped[bool] = mapped_column(Boolean, server_default=false())
    trace_id: Mapped[str | None] = mapped_column(String(32))  # OpenTelemetry, when a span was active
    span_id: Mapped[str | None] = mapped_column(String(16))

    __table_args__ = (
        ForeignKeyConstraint(
            ["session_id", "run_id"], ["agent_runs.session_id", "agent_runs.run_id"], ondelete="CASCADE"
        ),
        Index(None, "called_at"),  # reports over a period
        # One user's calls: through the sessions' user index, then the primary key's prefix (0015).
        {"sqlite_with_rowid": False},  # SQLite: stored in its primary key (0022)
    )


class UsageBudgetRow(Base):
    """A token budget per period for one user or for the app; a commit's update of it orders concurrent runs."""

    __tablename__ = "agent_usage_budgets"

    # The subject first: a distributed database shards budgets by it (docs/SCALING.md).
    subject: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)  # the user id, or the app id
    scope: Mapped[str] = mapped_column(String(8), primary_key=True)  # "user" or "app"
    period: Mapped[str] = mapped_column(String(8))  # "day", "month" (UTC) or "total"
    token_limit: Mapped[int] = mapped_column(BigInteger)
    used: Mapped[int] = mapped_column(BigInteger, server_default="0")  # in the period that began at period_start
    period_start: Mapped[datetime | None] = mapped_column(UTCDateTime())
    crossed_by_run: Mapped[str | None] = mapped_column(String(ID_MAX))  # the commit that reached the limit first
    crossed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class UsagePriceRow(Base):
    """What the operator pays per million tokens of one model: the cost view reads it; no price is built in."""

    __tablename__ = "agent_usage_prices"

    model: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    input_per_million: Mapped[float] = mapped_column(Float)
    output_per_million: Mapped[float] = mapped_column(Float)
    cached_input_per_million: Mapped[float | None] = mapped_column(Float)  # NULL: the input price


usage_t = cast(Table, UsageRow.__table__)
budgets_t = cast(Table, UsageBudgetRow.__table__)
prices_t = cast(Table, UsagePriceRow.__table__)
