"""S5 in parts: what each side's bytes per message are spent on, so a gap in the one S5 figure has its profile.

The parts are named by what they buy. The floor keeps message rows, their key and session/state rows; the store
also keeps the message-id index (a retried save stores nothing twice), the run log (a retried commit lands once),
the usage ledger (a row per model call: bench.py records one a turn, --no-ledger none) and the search indexes
(the trigram and short-word indexes on PostgreSQL, the FTS5 table on SQLite). Whatever no part names (sessions,
state, tool calls, free pages) is the rest of the side's S5 figure.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

PARTS = ("message rows", "message key (session, seq)", "message-id index", "run log", "usage ledger",
         "search indexes", "placed-summaries index")  # fmt: skip


def part_of(table: str, relation: str, primary_key: bool) -> str | None:
    """The part a relation (a table, or one of its indexes) belongs to; None: the rest."""
    if table in ("agent_runs", "floor_runs"):
        return "run log"
    if table in ("agent_usage", "floor_usage"):  # a row per model call, with its indexes (0014)
        return "usage ledger"
    if table.startswith("agent_messages_fts"):
        return "search indexes"
    if table not in ("agent_messages", "floor_messages"):
        return None
    if relation == table:
        return "message rows"
    if primary_key:
        return "message key (session, seq)"
    if relation == "ix_agent_messages_placed":  # compaction's summaries (0013): empty until a session is compacted
        return "placed-summaries index"
    return "message-id index" if "message_id" in relation else "search indexes"


async def postgres_parts(conn: AsyncConnection, tables: list[str], messages: int) -> dict[str, float]:
    """Bytes per message by part, as ``pg_total_relation_size`` counts them (a table's size includes TOAST)."""
    found = await conn.execute(
        text(
            "SELECT t.relname, t.relname, true, pg_table_size(t.oid) FROM pg_class t WHERE t.relname = ANY(:tables)"
            " UNION ALL SELECT t.relname, i.relname, x.indisprimary, pg_relation_size(i.oid) FROM pg_index x"
            " JOIN pg_class t ON t.oid = x.indrelid JOIN pg_class i ON i.oid = x.indexrelid"
            " WHERE t.relname = ANY(:tables)"
        ),
        {"tables": tables},
    )
    parts = dict.fromkeys(PARTS, 0.0)
    for table, relation, primary_key, size in found:
        part = part_of(table, relation, primary_key and relation != table)
        if part is not None:
            parts[part] += size / messages
    return parts


def sqlite_parts(path: Path, messages: int) -> dict[str, float]:
    """Bytes per message by part, from SQLite's ``dbstat`` table (pages of each table and index)."""
    conn = sqlite3.connect(path)
    try:
        pages = conn.execute(
            "SELECT s.name, coalesce(m.tbl_name, s.name), sum(s.pgsize) FROM dbstat s"
            " LEFT JOIN sqlite_schema m ON m.name = s.name GROUP BY s.name"
        ).fetchall()
    finally:
        conn.close()
    parts = dict.fromkeys(PARTS, 0.0)
    for relation, table, size in pages:
        part = part_of(table, relation, relation.startswith("sqlite_autoindex_"))
        if part is not None:
            parts[part] += size / messages
    return parts


async def side_bytes(url: str) -> tuple[int, list[str]]:
    """Bytes on disk of one side of the comparison (bench/s5.py: each in a database or file of its own), and
    (PostgreSQL) its tables.

    PostgreSQL: every table of the database, the empty ones of features the work did not use included, with
    indexes and TOAST, each VACUUMed first as autovacuum would do on its own schedule (dead row versions of the
    last seconds' updates are not bytes a message keeps). SQLite: the side's file, after a WAL checkpoint.
    """
    if not url.startswith("postgresql"):
        path = url.split("///", 1)[1]
        conn = sqlite3.connect(path)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
        return Path(path).stat().st_size, []  # noqa: ASYNC240 - one stat() after the benchmark
    import asyncpg

    pg = await asyncpg.connect(url.replace("+asyncpg", ""))
    try:
        tables = [r[0] for r in await pg.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        for table in tables:
            await pg.execute(f'VACUUM "{table}"')  # names read from the catalog
        size = await pg.fetchval("SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c WHERE c.relname = "
                                 "ANY($1::text[]) AND c.relkind = 'r' AND c.relnamespace = 'public'::regnamespace",
                                 tables)  # fmt: skip
        return int(size or 0), tables
    finally:
        await pg.close()
