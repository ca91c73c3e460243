"""The usage ledger: a row per model call, joined to its run; token budgets; the operator's prices; report views.

- ``agent_usage``: one row per model call of a run (``call_no`` in the order the calls ended), with every
  ``UsageDetails`` count the framework reported (the provider's other counts in ``extra``), the model and
  provider, latency, finish reason, whether it streamed, and the OpenTelemetry trace and span ids active around
  it. ``purpose`` says what the call was for: ``chat`` (the agent's calls, a tool loop's included),
  ``compaction`` (a summarizer's), ``response`` (a response's total, when no per-call record was made).
  It belongs to its ``agent_runs`` row (cascade): a session deleted, purged or erased takes its calls along.
- ``agent_usage_budgets``: an optional token limit per period (``day``, ``month``, UTC, or ``total``) for one
  user or the app. A run's commit adds its calls' tokens in its own transaction; that row update orders
  concurrent commits, and the first to reach the limit is kept in ``crossed_by_run``.
- ``agent_usage_prices``: what the operator pays per million tokens of a model; nothing is built in.
- ``agent_usage_daily``: tokens per UTC day, user and model, with the cost where the model has a price.

On PostgreSQL ``agent_store_commit_usage(jsonb)`` is the one-call commit (0005, 0010, 0012, 0013) plus the
run's ledger rows and its budgets' update, in the same call: a run with calls still commits in one round trip.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_DOC = sa.Text().with_variant(postgresql.JSONB(), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)
ID = sa.String(255)

# Per call: input tokens not read from a cache at the input price, cached ones at the cached price (else the
# input price), output at the output price. NULL where the model has no price row.
_COST = """(coalesce(u.input_tokens, 0) - coalesce(u.cache_read_input_tokens, 0)) * p.input_per_million
        + coalesce(u.cache_read_input_tokens, 0) * coalesce(p.cached_input_per_million, p.input_per_million)
        + coalesce(u.output_tokens, 0) * p.output_per_million"""
_DAILY = """
CREATE VIEW agent_usage_daily AS
SELECT {day} AS day, u.user_id, u.model, count(*) AS calls,
       sum(u.input_tokens) AS input_tokens, sum(u.output_tokens) AS output_tokens,
       sum(coalesce(u.total_tokens, coalesce(u.input_tokens, 0) + coalesce(u.output_tokens, 0))) AS total_tokens,
       sum(u.cache_read_input_tokens) AS cache_read_input_tokens,
       sum(u.reasoning_output_tokens) AS reasoning_output_tokens,
       sum({cost}) / 1000000.0 AS cost
FROM agent_usage u LEFT JOIN agent_usage_prices p ON p.model = u.model
GROUP BY {day}, u.user_id, u.model
"""
_DAY = {"postgresql": "CAST(u.called_at AT TIME ZONE 'UTC' AS date)", "sqlite": "substr(u.called_at, 1, 10)"}
DAILY_VIEW = {dialect: _DAILY.format(day=day, cost=_COST) for dialect, day in _DAY.items()}  # constants only

_COMMIT_USAGE = r"""
CREATE FUNCTION agent_store_commit_usage(p jsonb) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    version_ bigint;
    c jsonb := p->'charge';
    tokens_ bigint := (p->'charge'->>'tokens')::bigint;
    start_ timestamptz;
    b record;
BEGIN
    version_ := agent_store_commit(p);  -- refuses (AS000) before anything below runs
    INSERT INTO agent_usage (session_id, run_id, call_no, user_id, agent_name, app_id, called_at, purpose, model,
                             provider, input_tokens, output_tokens, total_tokens, cache_creation_input_tokens,
                             cache_read_input_tokens, reasoning_output_tokens, extra, latency_ms, finish_reason,
                             streamed, trace_id, span_id)
        SELECT p->>'sid', p->>'run_id', u.call_no, p->>'uid', u.agent_name, p->>'app_id', u.called_at, u.purpose,
               u.model, u.provider, u.input_tokens, u.output_tokens, u.total_tokens, u.cache_creation_input_tokens,
               u.cache_read_input_tokens, u.reasoning_output_tokens, u.extra, u.latency_ms, u.finish_reason,
               u.streamed, u.trace_id, u.span_id
        FROM jsonb_to_recordset(p->'calls') AS u(call_no integer, agent_name text, called_at timestamptz,
             purpose text, model text, provider text, input_tokens bigint, output_tokens bigint,
             total_tokens bigint, cache_creation_input_tokens bigint, cache_read_input_tokens bigint,
             reasoning_output_tokens bigint, extra jsonb, latency_ms double precision, finish_reason text,
             streamed boolean, trace_id text, span_id text);
    IF c IS NOT NULL THEN  -- the run's tokens against the user's budget, then the app's (one lock order)
        FOR b IN SELECT scope, subject, period FROM agent_usage_budgets
                 WHERE (scope = 'user' AND subject = p->>'uid') OR (scope = 'app' AND subject = p->>'app_id')
                 ORDER BY scope DESC LOOP
            start_ := CASE b.period WHEN 'day' THEN (c->>'day')::timestamptz
                                    WHEN 'month' THEN (c->>'month')::timestamptz
                                    ELSE (c->>'ever')::timestamptz END;
            UPDATE agent_usage_budgets SET
                used = CASE WHEN used >= 4611686018427387904 THEN used
                    ELSE CASE WHEN period_start = start_ THEN used ELSE 0 END + tokens_ END,
                crossed_by_run = CASE WHEN period_start = start_ AND used >= token_limit THEN crossed_by_run
                    WHEN CASE WHEN period_start = start_ THEN used ELSE 0 END + tokens_ >= token_limit
                    THEN p->>'run_id' END,
                crossed_at = CASE WHEN period_start = start_ AND used >= token_limit THEN crossed_at
                    WHEN CASE WHEN period_start = start_ THEN used ELSE 0 END + tokens_ >= token_limit
                    THEN (p->>'now')::timestamptz END,
                period_start = start_
            WHERE scope = b.scope AND subject = b.subject;
        END LOOP;
    END IF;
    RETURN version_;
END $$;
"""


def upgrade() -> None:
    op.create_table(
        "agent_usage",
        sa.Column("session_id", ID, nullable=False),
        sa.Column("run_id", ID, nullable=False),
        sa.Column("call_no", sa.Integer(), nullable=False),
        sa.Column("user_id", ID, nullable=True),
        sa.Column("agent_name", sa.Text(), nullable=True),
        sa.Column("app_id", ID, nullable=False),
        sa.Column("called_at", TIMESTAMP, nullable=False),
        sa.Column("purpose", sa.String(16), nullable=False),
        sa.Column("model", sa.Text(), nullable=True),
        sa.Column("provider", sa.Text(), nullable=True),
        *(
            sa.Column(name, sa.BigInteger(), nullable=True)
            for name in (
                "input_tokens",
                "output_tokens",
                "total_tokens",
                "cache_creation_input_tokens",
                "cache_read_input_tokens",
                "reasoning_output_tokens",
            )
        ),
        sa.Column("extra", JSON_DOC, nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.Column("finish_reason", sa.Text(), nullable=True),
        sa.Column("streamed", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("trace_id", sa.String(32), nullable=True),
        sa.Column("span_id", sa.String(16), nullable=True),
        sa.PrimaryKeyConstraint("session_id", "run_id", "call_no", name="pk_agent_usage"),
        sa.ForeignKeyConstraint(
            ["session_id", "run_id"],
            ["agent_runs.session_id", "agent_runs.run_id"],
            name="fk_agent_usage_session_id_agent_runs",
            ondelete="CASCADE",
        ),
    )
    op.create_index("ix_agent_usage_called_at", "agent_usage", ["called_at"])
    op.create_index("ix_agent_usage_user_id_called_at", "agent_usage", ["user_id", "called_at"])
    op.create_table(
        "agent_usage_budgets",
        sa.Column("subject", ID, nullable=False),
        sa.Column("scope", sa.String(8), nullable=False),
        sa.Column("period", sa.String(8), nullable=False),
        sa.Column("token_limit", sa.BigInteger(), nullable=False),
        sa.Column("used", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("period_start", TIMESTAMP, nullable=True),
        sa.Column("crossed_by_run", ID, nullable=True),
        sa.Column("crossed_at", TIMESTAMP, nullable=True),
        sa.PrimaryKeyConstraint("subject", "scope", name="pk_agent_usage_budgets"),
    )
    op.create_table(
        "agent_usage_prices",
        sa.Column("model", ID, nullable=False),
        sa.Column("input_per_million", sa.Float(), nullable=False),
        sa.Column("output_per_million", sa.Float(), nullable=False),
        sa.Column("cached_input_per_million", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("model", name="pk_agent_usage_prices"),
    )
    dialect = op.get_bind().dialect.name
    op.execute(DAILY_VIEW[dialect])
    if dialect == "postgresql":
        op.execute(_COMMIT_USAGE)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION agent_store_commit_usage(jsonb)")
    op.execute("DROP VIEW agent_usage_daily")
    op.drop_table("agent_usage_prices")
    op.drop_table("agent_usage_budgets")
    op.drop_index("ix_agent_usage_user_id_called_at", "agent_usage")
    op.drop_index("ix_agent_usage_called_at", "agent_usage")
    op.drop_table("agent_usage")
