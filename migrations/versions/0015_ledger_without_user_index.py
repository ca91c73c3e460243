"""The usage ledger without its own user index: one user's calls are found through that user's sessions.

A ledger row's ``user_id`` is always its session's (a run's user must own its session), so the sessions' index
``(user_id, updated_at, id)`` finds a user's sessions, and the ledger's primary key ``(session_id, run_id,
call_no)`` their calls. A report of one user (``store.usage.report(user_id=...)``) reads that way, and erasing
a user already deletes through the sessions. The dropped index cost every recorded call an index entry
(about a fifth of the ledger's bytes; bench/README.md, "Fourteenth session"). ``user_id`` stays a column: the
daily view and plain SQL group by it without a join.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_agent_usage_user_id_called_at", "agent_usage")


def downgrade() -> None:
    op.create_index("ix_agent_usage_user_id_called_at", "agent_usage", ["user_id", "called_at"])
