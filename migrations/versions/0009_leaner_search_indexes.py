"""Leaner search indexes: the same matches as 0007 for about half the bytes and cheaper commits.

Measured on the benchmark's messages (bench/README.md) before this was chosen:

- PostgreSQL, the full-text index: it only ever serves words of one or two characters (longer terms go to the
  trigram index), so it now holds only those (runs of letters and digits of length 1-2; a run of three or more
  is dropped whole, so "ai" still never matches inside "said"). 40 -> 9 bytes per message.
- PostgreSQL, the trigram index: GIN's pending list back on, bounded to 64 kB (PostgreSQL's least). Writing
  every message's ~100 trigrams straight into the index made 32 concurrent commits queue on the same index
  pages (S2: 1.75x the floor against 1.39x with the list); PostgreSQL's default 4 MB list made the index 7x
  larger at 1,000 messages and could make one commit pay for a 4 MB merge. 64 kB bounds both (128 bytes per
  message against 141 with 256 kB, the same S2); a search reads at most that much unmerged.
- SQLite: the FTS5 table keeps which messages hold each trigram but not where (``detail=none``) and no
  per-message sizes (``columnsize=0``: only bm25 ranking reads them, and search does not rank by bm25). 210 ->
  66 bytes per message. FTS5 then refuses phrase queries, so search.py asks for the AND of a term's trigrams
  and checks the term on each candidate row.

Recreating an index reads ``agent_messages`` once (about 3 s per 1,000,000 messages here); writes to it wait
meanwhile on PostgreSQL.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# One regular expression, leftmost-longest: a run of 3+ letters and digits is replaced whole, and so is every run
# of other characters; runs of 1-2 letters and digits are all that is left for the tsvector.
_SHORT_WORDS_INDEX = (
    "CREATE INDEX ix_agent_messages_text_words ON agent_messages USING gin (to_tsvector('simple',"
    " regexp_replace(left(text, 100000), '[[:alnum:]]{3,}|[^[:alnum:]]+', ' ', 'g'))) WITH (fastupdate = off)"
)
_ALL_WORDS_INDEX = (  # 0007's
    "CREATE INDEX ix_agent_messages_text_words ON agent_messages USING gin (to_tsvector('simple',"
    " regexp_replace(left(text, 100000), '[^[:alnum:]]+', ' ', 'g'))) WITH (fastupdate = off)"
)
_FTS_LEAN = (
    "CREATE VIRTUAL TABLE agent_messages_fts USING fts5(text, content='agent_messages', content_rowid='rowid',"
    " tokenize='trigram', detail='none', columnsize=0)"
)
_FTS_FULL = (  # 0007's
    "CREATE VIRTUAL TABLE agent_messages_fts USING fts5(text, content='agent_messages', content_rowid='rowid',"
    " tokenize='trigram')"
)


def _postgres(short_words_only: bool) -> None:
    op.execute("DROP INDEX ix_agent_messages_text_words")
    op.execute(_SHORT_WORDS_INDEX if short_words_only else _ALL_WORDS_INDEX)
    if short_words_only:
        op.execute("ALTER INDEX ix_agent_messages_text_trigrams SET (fastupdate = on, gin_pending_list_limit = 64)")
    else:
        op.execute("ALTER INDEX ix_agent_messages_text_trigrams SET (fastupdate = off)")
        op.execute("SELECT gin_clean_pending_list('ix_agent_messages_text_trigrams')")  # turning it off keeps it
        op.execute("ALTER INDEX ix_agent_messages_text_trigrams RESET (gin_pending_list_limit)")


def _sqlite(create: str) -> None:
    # The triggers of 0007 name the table, not its options: they keep working on the new one.
    op.execute("DROP TABLE agent_messages_fts")
    op.execute(create)
    op.execute("INSERT INTO agent_messages_fts(agent_messages_fts) VALUES ('rebuild')")


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _postgres(short_words_only=True)
    else:
        _sqlite(_FTS_LEAN)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _postgres(short_words_only=False)
    else:
        _sqlite(_FTS_FULL)
