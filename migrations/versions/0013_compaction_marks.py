"""Compaction, stored faithfully: each message's compaction marks and its place in the framework's list.

Agent Framework's ``CompactionProvider`` rewrites a stored history in place: it annotates messages (also ones
stored long ago) in ``additional_properties`` (``_group``, ``_excluded``, ``_exclude_reason``, and links between
summaries and what they summarize) and inserts summary messages in the middle of the list. The store keeps both:

- ``marks``: those annotations as the framework wrote them (JSON; never encrypted: ids, kinds, counts, reasons);
- ``summary_of``: a summary's links to what it replaced (``_summary_of_message_ids`` and ``_summary_of_group_ids``
  from its ``_group``), written once, apart: a load of only the included messages does not read them;
- ``excluded_at``: the first seq of the commit that excluded it (kept while it stays excluded): a fork or a
  truncation at an earlier seq includes it again, as it was then;
- ``excluded``, ``exclude_reason``, ``summarized_by`` (the store id of the summary that replaced the message):
  the same facts as plain columns, for SQL;
- ``pos``: the message's place in the list where it differs from commit order (NULL: at its ``seq``). The list
  order is ``coalesce(pos, seq * 2^32)``; ``seq`` stays gap-free and in commit order.

On PostgreSQL the commit function (0005, 0010, 0012) writes a compaction too, in its one call: the stored
messages' new marks and places, the new messages' mark columns and places, ``included_from``, and the run log's
count. Such a call says ``"format": 3``; an older function refuses it (the checked path writes it instead).
Its bump already requires that no commit came since the load, which is what the rewrites are computed against.

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
from pathlib import Path
from typing import Any

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


_FORMATS = (
    "IF coalesce(p->>'format', '') NOT IN ('1', '2') OR (p ? 'create' AND p->>'format' <> '2') THEN",
    "IF coalesce(p->>'format', '') NOT IN ('1', '2', '3') OR (p ? 'create' AND p->>'format' <> '2') THEN",
)
_DECLARE = ("    bumped record;\n", "    bumped record;\n    rw record;\n")
_REWRITES = (
    "    -- 5. Messages at the seq numbers the bump reserved, their tool calls, and the run log.\n",
    """    -- 4b. A compaction's rewrites of stored messages (0013), one index probe each: new marks, new places.
    FOR rw IN SELECT * FROM jsonb_to_recordset(coalesce(p->'marks', '[]')) AS x(message_id text, marks jsonb,
             excluded boolean, exclude_reason text, summarized_by text, summary_of jsonb) LOOP
        UPDATE agent_messages SET marks = rw.marks, excluded = rw.excluded, exclude_reason = rw.exclude_reason,
            summarized_by = rw.summarized_by, summary_of = coalesce(rw.summary_of, summary_of),
            excluded_at = CASE WHEN rw.excluded THEN coalesce(excluded_at, bumped.next_seq - n) END
        WHERE session_id = sid AND md5(message_id)::uuid = md5(rw.message_id)::uuid AND message_id = rw.message_id;
    END LOOP;
    FOR rw IN SELECT * FROM jsonb_to_recordset(coalesce(p->'moves', '[]')) AS x(message_id text, pos bigint) LOOP
        UPDATE agent_messages SET pos = rw.pos
        WHERE session_id = sid AND md5(message_id)::uuid = md5(rw.message_id)::uuid AND message_id = rw.message_id;
    END LOOP;
    IF p ? 'included_from' THEN  -- set, when the run read every included message; else only lowered
        UPDATE agent_sessions SET included_from = CASE
            WHEN (p->>'included_exactly')::boolean OR included_from > (p->>'included_from')::integer
            THEN (p->>'included_from')::integer ELSE included_from END
        WHERE id = sid;
    END IF;
    -- 5. Messages at the seq numbers the bump reserved, their tool calls, and the run log.
""",
)
_MESSAGES = (
    "        INSERT INTO agent_messages (session_id, seq, message_id, run_id, role, author_name, text, created_at,"
    """ body)
            SELECT sid, bumped.next_seq - n + m.i, m.message_id, p->>'run_id', m.role, m.author_name, m.text, now_,
                   m.body
            FROM jsonb_to_recordset(p->'messages')
                AS m(i integer, message_id text, role text, author_name text, text text, body jsonb);""",
    "        INSERT INTO agent_messages (session_id, seq, message_id, run_id, role, author_name, text, created_at,"
    """ body,
                                    pos, marks, excluded, exclude_reason, summarized_by, summary_of, excluded_at)
            SELECT sid, bumped.next_seq - n + m.i, m.message_id, p->>'run_id', m.role, m.author_name, m.text, now_,
                   m.body, m.pos, m.marks, coalesce(m.excluded, false), m.exclude_reason, m.summarized_by,
                   m.summary_of, CASE WHEN m.excluded THEN bumped.next_seq - n END
            FROM jsonb_to_recordset(p->'messages')
                AS m(i integer, message_id text, role text, author_name text, text text, body jsonb, pos bigint,
                     marks jsonb, excluded boolean, exclude_reason text, summarized_by text, summary_of jsonb);""",
)
_LOG = (
    "                            committed_at, agent_name, messages_in, messages_out, input_tokens, output_tokens,"
    """ outcome)
        SELECT sid, p->>'run_id', bumped.version, n, r.state_keys_written, r.started_at, r.committed_at,
               r.agent_name, r.messages_in, r.messages_out, r.input_tokens, r.output_tokens, 'committed'""",
    "                            committed_at, agent_name, messages_in, messages_out, input_tokens, output_tokens,"
    """ outcome,
                            messages_rewritten)
        SELECT sid, p->>'run_id', bumped.version, n, r.state_keys_written, r.started_at, r.committed_at,
               r.agent_name, r.messages_in, r.messages_out, r.input_tokens, r.output_tokens, 'committed',
               coalesce((p->>'rewritten')::integer, 0)""",
)


def _revision(revision_id: str) -> Any:
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(Path(__file__).resolve().parents[1])).get_revision(revision_id).module


def commit_function() -> str:
    before = _revision("0010")  # its function_of() and splice()
    changes = (_FORMATS, _DECLARE, _REWRITES, _MESSAGES, _LOG)
    return str(before.splice(before.function_of("0012"), changes, revision))


def upgrade() -> None:
    op.add_column("agent_messages", sa.Column("pos", sa.BigInteger(), nullable=True))
    op.add_column("agent_messages", sa.Column("marks", JSON_DOC, nullable=True))
    op.add_column("agent_messages", sa.Column("excluded", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("agent_messages", sa.Column("exclude_reason", sa.String(255), nullable=True))
    op.add_column("agent_messages", sa.Column("summarized_by", sa.String(255), nullable=True))
    op.add_column("agent_messages", sa.Column("excluded_at", sa.Integer(), nullable=True))
    op.add_column("agent_messages", sa.Column("summary_of", JSON_DOC, nullable=True))  # last: read only when asked
    op.add_column("agent_runs", sa.Column("messages_rewritten", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("agent_sessions", sa.Column("included_from", sa.Integer(), nullable=True))
    op.create_index(
        "ix_agent_messages_placed", "agent_messages", ["session_id", "seq"],
        postgresql_where=sa.text("pos IS NOT NULL"), sqlite_where=sa.text("pos IS NOT NULL"),
    )  # fmt: skip
    op.execute(MODEL_VIEW)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(commit_function())


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_revision("0012").commit_function())
    op.execute("DROP VIEW agent_model_view")
    op.drop_index("ix_agent_messages_placed", "agent_messages")
    with op.batch_alter_table("agent_sessions") as batch:
        batch.drop_column("included_from")
    with op.batch_alter_table("agent_runs") as batch:
        batch.drop_column("messages_rewritten")
    with op.batch_alter_table("agent_messages") as batch:
        for column in ("summary_of", "excluded_at", "summarized_by", "exclude_reason", "excluded", "marks", "pos"):
            batch.drop_column(column)
