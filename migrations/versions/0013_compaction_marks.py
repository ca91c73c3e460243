"""Compaction, stored faithfully: each message's compaction marks and its place in the framework's list.

Agent Framework's ``CompactionProvider`` rewrites a stored history in place: it annotates messages (also ones
stored long ago) in ``additional_properties`` (``_group``, ``_excluded``, ``_exclude_reason``, and links between
summaries and what they summarize) and inserts summary messages in the middle of the list. The store keeps both:

- ``marks``: those annotations as the framework wrote them (JSON; never encrypted: ids, kinds, counts, reasons);
- ``summary_of``: a summary's links to what it replaced (``_summary_of_message_ids`` and ``_summary_of_group_ids``
  from its ``_group``), written once, apart: a load of only the included messages does not read them;
- ``excluded``, ``exclude_reason``, ``summarized_by`` (the store id of the summary that replaced the message):
  the same facts as plain columns, for SQL;
- ``pos``: the message's place in the list where it differs from commit order (NULL: at its ``seq``). The list
  order is ``coalesce(pos, seq * 2^32)``; ``seq`` stays gap-free and in commit order.

The run log counts the stored messages each commit rewrote (``agent_runs.messages_rewritten``): an export that
meets one mid-way knows its earlier pages changed.

The ``agent_model_view`` view is what the model sees: the included messages, ordered by ``position``.

A load of only the included messages (``skip_excluded``) reads no excluded original: the session row keeps
``included_from``, a seq below which every included message was placed by a compaction (a summary: ``pos`` is
set), and those few are found by a partial index over placed rows; the rest is the range from
``included_from`` up. NULL means 0 (a session never compacted: its every message is included). A session never
compacted costs only the NULLs' bits.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_DOC = sa.Text().with_variant(postgresql.JSONB(), "postgresql")

MODEL_VIEW = """
CREATE VIEW agent_model_view AS
SELECT m.session_id, s.user_id, COALESCE(m.pos, m.seq * 4294967296) AS position, m.seq, m.message_id, m.role,
       m.author_name, m.text, m.created_at
FROM agent_messages m JOIN agent_sessions s ON s.id = m.session_id
WHERE NOT m.excluded
"""


def upgrade() -> None:
    op.add_column("agent_messages", sa.Column("pos", sa.BigInteger(), nullable=True))
    op.add_column("agent_messages", sa.Column("marks", JSON_DOC, nullable=True))
    op.add_column("agent_messages", sa.Column("excluded", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("agent_messages", sa.Column("exclude_reason", sa.String(255), nullable=True))
    op.add_column("agent_messages", sa.Column("summarized_by", sa.String(255), nullable=True))
    op.add_column("agent_messages", sa.Column("summary_of", JSON_DOC, nullable=True))  # last: read only when asked
    op.add_column("agent_runs", sa.Column("messages_rewritten", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("agent_sessions", sa.Column("included_from", sa.Integer(), nullable=True))
    op.create_index(
        "ix_agent_messages_placed", "agent_messages", ["session_id", "seq"],
        postgresql_where=sa.text("pos IS NOT NULL"), sqlite_where=sa.text("pos IS NOT NULL"),
    )  # fmt: skip
    op.execute(MODEL_VIEW)


def downgrade() -> None:
    op.execute("DROP VIEW agent_model_view")
    op.drop_index("ix_agent_messages_placed", "agent_messages")
    with op.batch_alter_table("agent_sessions") as batch:
        batch.drop_column("included_from")
    with op.batch_alter_table("agent_runs") as batch:
        batch.drop_column("messages_rewritten")
    with op.batch_alter_table("agent_messages") as batch:
        for column in ("summary_of", "summarized_by", "exclude_reason", "excluded", "marks", "pos"):
            batch.drop_column(column)
