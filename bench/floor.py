"""The raw-driver floor the benchmark measures agent_store against: the same work, fewest statements, no ORM.

A run is a short read transaction (session row, state, last 20 messages rebuilt as ``Message`` objects with the
framework's ``from_dict``: the floor of rows plus framework objects) and a
short write transaction (version-checked session update, 2 message inserts in one executemany, a session key
and a user-level key upserted, and, when agent_store's turn records a model call, the turn's token counts in one
row): the plain loop a developer would write first. Its tables hold only what that work needs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiosqlite
import asyncpg
from agent_framework import Message

DDL = [
    "CREATE TABLE IF NOT EXISTS floor_sessions "
    "(id TEXT PRIMARY KEY, version INTEGER NOT NULL, next_seq INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS floor_messages (session_id TEXT NOT NULL, seq INTEGER NOT NULL, role TEXT NOT NULL, "
    "body {json} NOT NULL, PRIMARY KEY (session_id, seq))",
    "CREATE TABLE IF NOT EXISTS floor_state (session_id TEXT NOT NULL, key TEXT NOT NULL, value {json} NOT NULL, "
    "PRIMARY KEY (session_id, key))",
    "CREATE TABLE IF NOT EXISTS floor_user_state (user_id TEXT NOT NULL, key TEXT NOT NULL, value {json} NOT NULL, "
    "PRIMARY KEY (user_id, key))",
    "CREATE TABLE IF NOT EXISTS floor_usage (session_id TEXT NOT NULL, version INTEGER NOT NULL, "
    "input_tokens BIGINT, output_tokens BIGINT, total_tokens BIGINT, PRIMARY KEY (session_id, version))",
]
TABLES = ["floor_sessions", "floor_messages", "floor_state", "floor_user_state", "floor_usage"]
STATE = (
    "SELECT key, value FROM floor_state WHERE session_id = ? "
    "UNION ALL SELECT 'user:' || key, value FROM floor_user_state WHERE user_id = ?"
)


class Conflict(Exception):
    pass


class Floor:
    """One backend's floor: ``load`` then ``commit``, like a store run."""

    def __init__(self, postgres: bool, pool: Any) -> None:
        self.postgres, self.pool = postgres, pool

    @classmethod
    async def open(cls, url: str, size: int) -> Floor:
        if url.startswith("postgresql"):
            pool = await asyncpg.create_pool(url.replace("+asyncpg", ""), min_size=size, max_size=size)
            async with pool.acquire() as conn:
                for ddl in DDL:
                    await conn.execute(ddl.format(json="JSONB"))
            return cls(True, pool)
        path = url.split("///", 1)[1]
        queue: asyncio.Queue[aiosqlite.Connection] = asyncio.Queue()
        for _ in range(size):
            conn = await aiosqlite.connect(path, isolation_level=None)
            for pragma in ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL", "PRAGMA busy_timeout=30000"):
                await conn.execute(pragma)
            queue.put_nowait(conn)
        conn = await queue.get()
        for ddl in DDL:
            await conn.execute(ddl.format(json="TEXT"))
        queue.put_nowait(conn)
        return cls(False, queue)

    async def close(self) -> None:
        if self.postgres:
            await self.pool.close()
        else:
            while not self.pool.empty():
                await (self.pool.get_nowait()).close()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        if self.postgres:
            async with self.pool.acquire() as conn:
                yield conn
            return
        conn = await self.pool.get()
        try:
            yield conn
        finally:
            self.pool.put_nowait(conn)

    async def load(
        self, sid: str, limit: int | None = 20, *, objects: bool = True
    ) -> tuple[int, int, dict[str, Any], list[Any]]:
        """``objects=False``: the message rows as the driver returns them, nothing decoded or built (the floor
        of rows only, against which building the framework's objects is measured)."""
        async with self.connection() as c:
            if self.postgres:
                async with c.transaction(isolation="repeatable_read", readonly=True):
                    row = await c.fetchrow("SELECT version, next_seq FROM floor_sessions WHERE id = $1", sid)
                    state = await c.fetch(STATE.replace("?", "$1", 1).replace("?", "$2"), sid, f"user-{sid}")
                    bodies = await c.fetch(
                        "SELECT body FROM floor_messages WHERE session_id = $1 AND seq >= $2 ORDER BY seq",
                        sid, (row["next_seq"] - limit) if row and limit else 0,
                    )  # fmt: skip
                loaded_state = {r["key"]: json.loads(r["value"]) for r in state}
                messages = [Message.from_dict(json.loads(r["body"])) for r in bodies] if objects else bodies
                return (row["version"], row["next_seq"], loaded_state, messages) if row else (0, 0, {}, [])
            await c.execute("BEGIN")
            try:
                cur = await c.execute("SELECT version, next_seq FROM floor_sessions WHERE id = ?", (sid,))
                row = await cur.fetchone()
                cur = await c.execute(STATE, (sid, f"user-{sid}"))
                state = await cur.fetchall()
                start = (row[1] - limit) if row and limit else 0
                cur = await c.execute(
                    "SELECT body FROM floor_messages WHERE session_id = ? AND seq >= ? ORDER BY seq", (sid, start)
                )
                bodies = await cur.fetchall()
            finally:
                await c.execute("COMMIT")
            loaded = {k: json.loads(v) for k, v in state}
            messages = [Message.from_dict(json.loads(b)) for (b,) in bodies] if objects else bodies
            return (row[0], row[1], loaded, messages) if row else (0, 0, {}, [])

    async def commit(
        self, sid: str, version: int, messages: list[Message], key: str, value: Any, usage: tuple[int, ...] | None
    ) -> None:
        """``usage``: the turn's (input, output, total) tokens, stored as one row keyed by the turn's version."""
        bodies = [(m.role, json.dumps(m.to_dict(), ensure_ascii=False)) for m in messages]
        async with self.connection() as c:
            if self.postgres:
                async with c.transaction():
                    if version == 0:
                        await c.execute("INSERT INTO floor_sessions VALUES ($1, 0, 0) ON CONFLICT DO NOTHING", sid)
                    next_seq = await c.fetchval(
                        "UPDATE floor_sessions SET version = version + 1, next_seq = next_seq + $3 "
                        "WHERE id = $1 AND version = $2 RETURNING next_seq", sid, version, len(bodies),
                    )  # fmt: skip
                    if next_seq is None:
                        raise Conflict
                    first = next_seq - len(bodies)
                    await c.executemany(
                        "INSERT INTO floor_messages VALUES ($1, $2, $3, $4)",
                        [(sid, first + i, role, body) for i, (role, body) in enumerate(bodies)],
                    )
                    await c.execute(
                        "INSERT INTO floor_state VALUES ($1, $2, $3) ON CONFLICT (session_id, key) "
                        "DO UPDATE SET value = excluded.value", sid, key, json.dumps(value),
                    )  # fmt: skip
                    await c.execute(
                        "INSERT INTO floor_user_state VALUES ($1, 'last_seen', $2) ON CONFLICT (user_id, key) "
                        "DO UPDATE SET value = excluded.value", f"user-{sid}", json.dumps(value),
                    )  # fmt: skip
                    if usage is not None:
                        await c.execute("INSERT INTO floor_usage VALUES ($1, $2, $3, $4, $5)", sid, version + 1, *usage)
                return
            await c.execute("BEGIN IMMEDIATE")
            try:
                if version == 0:
                    await c.execute("INSERT INTO floor_sessions VALUES (?, 0, 0) ON CONFLICT DO NOTHING", (sid,))
                cur = await c.execute(
                    "UPDATE floor_sessions SET version = version + 1, next_seq = next_seq + ? "
                    "WHERE id = ? AND version = ? RETURNING next_seq", (len(bodies), sid, version),
                )  # fmt: skip
                row = await cur.fetchone()
                if row is None:
                    raise Conflict
                first = row[0] - len(bodies)
                await c.executemany(
                    "INSERT INTO floor_messages VALUES (?, ?, ?, ?)",
                    [(sid, first + i, role, body) for i, (role, body) in enumerate(bodies)],
                )
                await c.execute(
                    "INSERT INTO floor_state VALUES (?, ?, ?) "
                    "ON CONFLICT (session_id, key) DO UPDATE SET value = excluded.value",
                    (sid, key, json.dumps(value)),
                )
                await c.execute(
                    "INSERT INTO floor_user_state VALUES (?, 'last_seen', ?) "
                    "ON CONFLICT (user_id, key) DO UPDATE SET value = excluded.value",
                    (f"user-{sid}", json.dumps(value)),
                )
                if usage is not None:
                    await c.execute("INSERT INTO floor_usage VALUES (?, ?, ?, ?, ?)", (sid, version + 1, *usage))
            except BaseException:
                await c.execute("ROLLBACK")
                raise
            await c.execute("COMMIT")
