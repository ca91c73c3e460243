"""bench/space.py, the profile behind S5: each part is found on each backend and counted against its own side."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from agent_framework import Message
from sqlalchemy import text

from agent_store import Store

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from space import PARTS, postgres_parts, side_bytes, sqlite_parts

TABLES = ["agent_sessions", "agent_messages", "agent_state", "agent_runs", "agent_tool_calls", "agent_usage"]


async def test_s5_parts_name_where_a_messages_bytes_go(store: Store, url: str) -> None:
    for n in range(40):
        run = await store.load(f"s{n % 4}", user_id="u")
        question = f"李明 question {n} " * 30
        run.history.extend([Message(role="user", contents=[question]), Message(role="assistant", contents=["answer"])])
        run.session.state["n"] = n
        run.add_usage({"input_token_count": 100 + n, "output_token_count": 20})  # the turn's model call
        await run.commit()
    if store.engine.dialect.name == "postgresql":
        async with store.engine.connect() as conn:
            parts = await postgres_parts(conn, TABLES, 80)
            total = (
                await conn.execute(
                    text("SELECT sum(pg_total_relation_size(t)) FROM unnest(CAST(:t AS text[])) t"), {"t": TABLES}
                )
            ).scalar_one()
    else:
        async with store.engine.connect() as conn:  # the pages into the file itself, as the bench does
            await conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
        path = Path(store.url.database or "")
        parts = sqlite_parts(path, 80)
        total = os.path.getsize(path)  # noqa: ASYNC240 - one stat() of a closed test file
    assert list(parts) == list(PARTS)
    assert all(parts[part] > 0 for part in PARTS), parts  # each part is there, on each backend
    # 80 messages of ~500 characters: the rows are the largest part, and the parts never exceed the whole.
    assert parts["message rows"] == max(parts.values())
    assert sum(parts.values()) <= total / 80
    # The side's whole (bench/s5.py's S5): every table of the store, the empty ones of unused features included,
    # so at least the six above and the parts' sum.
    whole, tables = await side_bytes(url)
    assert whole >= total if tables else whole == total
    assert not tables or set(TABLES) | {"alembic_version"} <= set(tables)
