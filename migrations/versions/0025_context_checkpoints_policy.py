"""A user's hosted workflow checkpoints are theirs under row-level security (issue 41): the policies on
``agent_checkpoints`` and ``agent_checkpoint_workflows`` admit, beside the named user's own rows, those of the
user's hosted workflow contexts, whose owner is the user id, ``E'\\x1fcontext:'`` and a 24-character hash
(agentserver/foundry.py, db/hosted_tables.py). Such a collection's saves act as its user (their lock, fence and
keys are the user's, so ``erase_user`` destroys them), and plain SQL acting for the user sees them; exactly that
form, as ``erase_user`` matches it, never a longer owner that only starts with it.

Code at 0024 acts as the collection's own name, which the policies still admit: ``oldest_code`` is left as it is.
SQLite has no row-level security: nothing changes there.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# left(x, -24): all but the hash; a shorter owner gives '', which no name followed by the marker equals.
_OR_CONTEXT = """
    USING (user_id = (SELECT NULLIF(current_setting('agent_store.user_id', true), ''))
           OR left(user_id, -24) = ((SELECT NULLIF(current_setting('agent_store.user_id', true), ''))
                                    || E'\\x1fcontext:'))"""
_OWN = """
    USING (user_id = (SELECT NULLIF(current_setting('agent_store.user_id', true), '')))"""
_UP = ("ALTER POLICY agent_store_tenant ON agent_checkpoints" + _OR_CONTEXT,
       "ALTER POLICY agent_store_tenant ON agent_checkpoint_workflows" + _OR_CONTEXT)  # fmt: skip
_DOWN = ("ALTER POLICY agent_store_tenant ON agent_checkpoints" + _OWN,
         "ALTER POLICY agent_store_tenant ON agent_checkpoint_workflows" + _OWN)  # fmt: skip


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for statement in _UP:
            op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for statement in _DOWN:
            op.execute(statement)
