"""SQLite: the run log and the usage ledger are stored in their primary keys (``WITHOUT ROWID``).

A SQLite table keeps its rows in rowid order and each other key in an index of its own: ``agent_runs`` and
``agent_usage`` each had their rows and, beside them, their primary key's index, which repeats the session and
run ids. Stored in the primary key instead, a run's row is one entry, not two; the ledger's index on
``called_at`` then holds the key instead of a rowid. About 27 bytes a message less after S1 (bench/s5.py; issue
43). Nothing reads their rowids. PostgreSQL is unchanged (its tables have no rowid).

Each table is rebuilt by copy (Alembic batch mode; foreign keys are off during a migration, db/engine.py), which
takes time in proportion to its rows (about 7 s per 1.5 million runs), holding SQLite's write lock meanwhile (app
writers wait up to their busy timeout), and leaves the old pages free in the file until a ``VACUUM``. Objects an
operator added to these two tables are rebuilt only if SQLAlchemy reflects them: plain and partial indexes come
back, while triggers and expression indexes are dropped and a ``DESC`` column of an index comes back ascending;
re-create those after the upgrade.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("agent_runs", "agent_usage")


def _rebuild(with_rowid: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in TABLES:
        with op.batch_alter_table(table, recreate="always", table_kwargs={"sqlite_with_rowid": with_rowid}):
            pass


def upgrade() -> None:
    _rebuild(False)


def downgrade() -> None:
    _rebuild(True)
