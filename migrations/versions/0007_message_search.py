"""Search over message text: the indexes ``Store.search`` uses (agent_store/search.py says how).

- PostgreSQL: a trigram index (``pg_trgm``, GIN) on ``agent_messages.text`` for substring terms of three or more
  characters in any script (Chinese has no spaces between words, so "李明" must match inside "我叫李明"), and a
  full-text index over the words of ``text`` (runs of letters and digits of its first 100,000 characters: a
  tsvector must stay under 1 MB) for short words ("AI", "ok") matched as whole words.
  ``pg_trgm`` is a trusted extension: a database owner may create it (PostgreSQL 13+).
- SQLite: an FTS5 table with the trigram tokenizer over the same column (external content: the text is not
  stored twice), kept in step by triggers. Its rows are tied to ``agent_messages``' rowid: a later migration
  that rebuilds that table (batch mode) must recreate the triggers and run ``'rebuild'``; so must anyone who
  runs ``VACUUM``, which may renumber rowids: ``INSERT INTO agent_messages_fts(agent_messages_fts)
  VALUES ('rebuild')``.

Both are filled from the existing messages here (the backfill). Encrypted messages keep an empty ``text``
column, so nothing of them is indexed.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_POSTGRES = [
    "CREATE EXTENSION IF NOT EXISTS pg_trgm",
    # fastupdate off: entries go straight into the index. With PostgreSQL's default pending list, the same 1,000
    # messages took 7x the space (819 kB against 115 kB) and a commit now and then pays for flushing the list.
    "CREATE INDEX ix_agent_messages_text_trigrams ON agent_messages USING gin (text gin_trgm_ops)"
    " WITH (fastupdate = off)",
    # Words are runs of letters and digits, as search.py's SQLite side has them (the parser alone would keep an
    # e-mail address, a URL or "3.5" as one token); the first 100,000 characters, as a tsvector must stay < 1 MB.
    "CREATE INDEX ix_agent_messages_text_words ON agent_messages USING gin"
    " (to_tsvector('simple', regexp_replace(left(text, 100000), '[^[:alnum:]]+', ' ', 'g'))) WITH (fastupdate = off)",
]
_SQLITE = [
    "CREATE VIRTUAL TABLE agent_messages_fts USING fts5("
    " text, content='agent_messages', content_rowid='rowid', tokenize='trigram')",
    "CREATE TRIGGER agent_messages_fts_insert AFTER INSERT ON agent_messages BEGIN"
    " INSERT INTO agent_messages_fts(rowid, text) VALUES (new.rowid, new.text); END",
    "CREATE TRIGGER agent_messages_fts_delete AFTER DELETE ON agent_messages BEGIN"
    " INSERT INTO agent_messages_fts(agent_messages_fts, rowid, text) VALUES ('delete', old.rowid, old.text); END",
    "CREATE TRIGGER agent_messages_fts_update AFTER UPDATE OF text ON agent_messages BEGIN"
    " INSERT INTO agent_messages_fts(agent_messages_fts, rowid, text) VALUES ('delete', old.rowid, old.text);"
    " INSERT INTO agent_messages_fts(rowid, text) VALUES (new.rowid, new.text); END",
    "INSERT INTO agent_messages_fts(agent_messages_fts) VALUES ('rebuild')",
]


def upgrade() -> None:
    for statement in _POSTGRES if op.get_bind().dialect.name == "postgresql" else _SQLITE:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        # The extension stays: other schemas in the database may use it.
        op.execute("DROP INDEX IF EXISTS ix_agent_messages_text_words")
        op.execute("DROP INDEX IF EXISTS ix_agent_messages_text_trigrams")
        return
    op.execute("DROP TRIGGER IF EXISTS agent_messages_fts_insert")
    op.execute("DROP TRIGGER IF EXISTS agent_messages_fts_delete")
    op.execute("DROP TRIGGER IF EXISTS agent_messages_fts_update")
    op.execute("DROP TABLE IF EXISTS agent_messages_fts")
