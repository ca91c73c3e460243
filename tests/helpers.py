"""Small helpers shared by the test modules."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from agent_store import Store


async def rows(store: Store, sql: str, **params: object) -> list[tuple[Any, ...]]:
    """The rows of a plain SQL query, as tuples."""
    async with store.engine.connect() as conn:
        return [tuple(r) for r in (await conn.execute(text(sql), params)).all()]
