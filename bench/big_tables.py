"""Many sessions, quickly, and the question "does this query read a whole table?" (tests and bench/)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

if TYPE_CHECKING:
    from agent_store.store import Store

# Generated in the database itself (one statement per table), so 1,000,000 messages take seconds.
_PG_FILL = [
    """INSERT INTO agent_sessions (id, user_id, version, next_seq, created_at, updated_at, metadata)
       SELECT 'session-' || g, 'user-' || (g % :users), 1, :per, CAST(:now AS timestamptz) - g * interval '1 second',
              CAST(:now AS timestamptz) - g * interval '1 second', '{}'::jsonb
       FROM generate_series(0, :sessions - 1) g""",
    """INSERT INTO agent_messages (session_id, seq, message_id, run_id, role, author_name, text, created_at, body)
       SELECT 'session-' || g, s, md5(g || '-' || s), 'bulk', CASE WHEN s % 2 = 0 THEN 'user' ELSE 'assistant' END,
              NULL, 'message ' || s, :now,
              jsonb_build_object('type', 'message', 'role', CASE WHEN s % 2 = 0 THEN 'user' ELSE 'assistant' END,
                                 'contents', jsonb_build_array(jsonb_build_object('type', 'text', 'text', 'msg ' || s)))
       FROM generate_series(0, :sessions - 1) g, generate_series(0, :per - 1) s""",
]
_SQLITE_FILL = [
    """WITH RECURSIVE g(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM g WHERE n + 1 < :sessions)
       INSERT INTO agent_sessions (id, user_id, version, next_seq, created_at, updated_at, metadata)
       SELECT 'session-' || n, 'user-' || (n % :users), 1, :per, datetime(:now, '-' || n || ' seconds'),
              datetime(:now, '-' || n || ' seconds'), '{}' FROM g""",
    """WITH RECURSIVE g(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM g WHERE n + 1 < :sessions),
                   s(m) AS (SELECT 0 UNION ALL SELECT m + 1 FROM s WHERE m + 1 < :per)
       INSERT INTO agent_messages (session_id, seq, message_id, run_id, role, author_name, text, created_at, body)
       SELECT 'session-' || n, m, n || '-' || m, 'bulk', CASE WHEN m % 2 = 0 THEN 'user' ELSE 'assistant' END,
              NULL, 'message ' || m, :now,
              json_object('type', 'message', 'role', CASE WHEN m % 2 = 0 THEN 'user' ELSE 'assistant' END, 'contents',
                          json_array(json_object('type', 'text', 'text', 'message ' || m)))
       FROM g, s""",
]


async def fill(store: Store, *, sessions: int, messages_per_session: int, users: int) -> None:
    """Add ``sessions`` sessions (ids ``session-N`` of users ``user-(N % users)``) with their messages."""
    postgres = store.engine.dialect.name == "postgresql"
    now: Any = datetime.now(UTC) if postgres else datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")
    params = {"sessions": sessions, "per": messages_per_session, "users": users, "now": now}
    async with store.engine.begin() as conn:
        for statement in _PG_FILL if postgres else _SQLITE_FILL:
            await conn.execute(text(statement), params)
    async with store.engine.connect() as conn:
        await conn.execute(text("ANALYZE"))
        await conn.commit()


async def full_scans(store: Store, statement: str, parameters: Any) -> list[str]:
    """The big tables a statement reads whole, according to the database's own query plan."""
    async with store.engine.connect() as conn:
        raw = await conn.get_raw_connection()
        driver: Any = raw.driver_connection
        if store.engine.dialect.name == "postgresql":
            rows = await driver.fetch("EXPLAIN " + statement, *(parameters or ()))
            plan = [r[0] for r in rows]
            return [
                line.strip()
                for line in plan
                if "Seq Scan on agent_sessions" in line or "Seq Scan on agent_messages" in line
            ]
        cursor = await driver.execute("EXPLAIN QUERY PLAN " + statement, parameters or ())
        details = [row[3] for row in await cursor.fetchall()]
        # "SCAN t USING INDEX" walks an index in order (served by it); a bare "SCAN t" reads the whole table.
        tables = ("agent_sessions", "agent_messages", " m", " s")
        return [d for d in details if d.startswith("SCAN") and "USING" not in d and any(t in d for t in tables)]
