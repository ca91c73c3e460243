"""Rolling upgrades: the schema says which older code runs on it (``agent_schema_compat.oldest_code``).

From this revision on, code at N opens a database at a newer revision M when M's ``oldest_code`` is at most N
(agent_store/db/compat.py); every later migration keeps it, or raises it to its own revision when the code
before it would misread the new schema. This one only adds a table and a partial unique index (one AG-UI run in
progress per thread and user, ``ux_agent_streams_live_thread``): ``oldest_code`` is 0019 (code at 0019 runs here
with ``check_schema=False``: it does not read the rule; its second AG-UI run on a busy thread is refused as a
stream id that exists).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLDEST_CODE = "0019"


def upgrade() -> None:
    compat = op.create_table(
        "agent_schema_compat",
        sa.Column("id", sa.SmallInteger(), primary_key=True, autoincrement=False),
        sa.Column("oldest_code", sa.String(32), nullable=False),
    )
    op.bulk_insert(compat, [{"id": 1, "oldest_code": OLDEST_CODE}])
    live = sa.text("status = 'in_progress' AND kind = 'agui' AND conversation_id IS NOT NULL")
    op.create_index("ux_agent_streams_live_thread", "agent_streams", ["user_id", "conversation_id"], unique=True,
                    postgresql_where=live, sqlite_where=live)  # fmt: skip


def downgrade() -> None:
    op.drop_index("ux_agent_streams_live_thread", table_name="agent_streams")
    op.drop_table("agent_schema_compat")
