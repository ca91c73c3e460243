"""``Store.stats``: every table's rows and bytes on disk, and the busiest sessions; for `agent-store stats`.

Bytes are a table's with its indexes: ``pg_total_relation_size`` on PostgreSQL, SQLite's ``dbstat`` pages (the
search index's FTS tables reported as their own line, ``search index``). Counting rows scans each table: this is
an operator's command, not one to run per request.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db.database import Database
from agent_store.db.tables import Base, sessions_t

SEARCH_INDEX = "search index"
# Each b-tree (table or index) and the table it belongs to; FTS shadow tables are tables of their own there.
_SQLITE_SIZES = text(
    "SELECT coalesce(m.tbl_name, d.name), sum(d.pgsize) FROM dbstat AS d"
    " LEFT JOIN sqlite_master AS m ON m.name = d.name GROUP BY 1"
)


async def stats(db: Database, top: int = 5) -> dict[str, Any]:
    tables = [t.name for t in Base.metadata.sorted_tables]
    async with db.transaction(write=False, replica=True, doing="reading statistics") as conn:
        counts = {
            table.name: (await conn.execute(select(func.count()).select_from(table))).scalar_one()
            for table in Base.metadata.sorted_tables
        }
        S = sessions_t.c
        busiest = (await conn.execute(select(S.id, S.user_id, S.next_seq).order_by(S.next_seq.desc()).limit(top))).all()
        sizes = await (
            _postgres_sizes(conn, tables) if conn.dialect.name == "postgresql" else _sqlite_sizes(conn, tables)
        )
    return {
        "rows": counts,
        "busiest": [{"id": r.id, "user_id": r.user_id, "messages": r.next_seq} for r in busiest],
        "bytes": sizes,
    }


async def _postgres_sizes(conn: AsyncConnection, tables: list[str]) -> dict[str, int]:
    sizes = {name: (await conn.execute(select(func.pg_total_relation_size(name)))).scalar_one() for name in tables}
    sizes["database"] = (await conn.execute(select(func.pg_database_size(func.current_database())))).scalar_one()
    return sizes


async def _sqlite_sizes(conn: AsyncConnection, tables: list[str]) -> dict[str, int]:
    file_size = text("SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()")
    sizes: dict[str, int] = dict.fromkeys(tables, 0)
    if (await conn.execute(text("SELECT 1 FROM pragma_module_list WHERE name = 'dbstat'"))).first():
        for name, size in (await conn.execute(_SQLITE_SIZES)).all():
            if name in sizes:
                sizes[name] += size
            elif name.startswith("agent_messages_fts"):  # the search index's shadow tables
                sizes[SEARCH_INDEX] = sizes.get(SEARCH_INDEX, 0) + size
    else:  # a SQLite built without dbstat: only the file's size is known
        sizes = {}
    sizes["database"] = (await conn.execute(file_size)).scalar_one()
    return sizes
