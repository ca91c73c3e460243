"""A served response's turn in the store's transcript (issue 58 item 5): ``agent_hosted_responses.transcribed``.

agent_store/agent_framework/served_transcripts.py writes each ended response's items as the store's own messages,
after the server's transaction, and then marks it here; ``transcribe_pending`` (``agent-store transcribe``) writes
those a process left unmarked (a partial index finds them). Responses stored before this revision are unmarked: the
first ``transcribe_pending`` writes them.

Only adds: code at 0027 runs here (``oldest_code`` is left as it is); what it serves is not transcribed until
code at 0028 runs ``transcribe_pending``.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UNMARKED = sa.text("NOT transcribed")


def upgrade() -> None:
    op.add_column("agent_hosted_responses", sa.Column("transcribed", sa.Boolean(), nullable=False,
                                                      server_default=sa.false()))  # fmt: skip
    op.create_index("ix_agent_hosted_responses_untranscribed", "agent_hosted_responses", ["created_seq"],
                    postgresql_where=_UNMARKED, sqlite_where=_UNMARKED)  # fmt: skip


def downgrade() -> None:
    op.drop_index("ix_agent_hosted_responses_untranscribed", "agent_hosted_responses")
    with op.batch_alter_table("agent_hosted_responses") as batch:
        batch.drop_column("transcribed")
