"""A hosted response's envelope and items, sealed with its user's keys (a store opened with ``keys=``; see
db/sealing.py): each bound to its id, so an item moved to another id or user does not open. Without keys, the
values pass through as they are."""

from __future__ import annotations

from typing import Any

from agent_store.db import sealing

Items = list[tuple[str, str, str | None]]  # (item id, its JSON, its type)


async def sealed(db: Any, user: str, rid: str, envelope: str, *lists: Items, fence: Any = None) -> tuple[Any, ...]:
    """The envelope and each list of items as stored: sealed, if the store has keys (``fence``: sealing.ready)."""
    cipher = await sealing.for_user(db, user, writing=True, fence=fence)
    if cipher is None:
        return (envelope, *lists)
    items = [[(i, sealing.seal_json(cipher, "i\0" + i, body), kind) for i, body, kind in items] for items in lists]
    return (sealing.seal_json(cipher, "r\0" + rid, envelope), *items)


async def opened_response(db: Any, user: str, rid: str, rows: list[Any]) -> dict[str, Any]:
    """A response read by its one statement (envelope, then its items' bodies), opened."""
    cipher = await sealing.for_user(db, user, writing=False)
    envelope = sealing.open_json(cipher, "r\0" + rid, rows[0].envelope)[0]
    return {**envelope, "output": [sealing.open_json(cipher, "i\0" + r.item_id, r.body)[0]
                                   for r in rows if r.body is not None]}  # fmt: skip


async def opened(db: Any, user: str, bodies: dict[str, Any]) -> dict[str, Any]:
    """Items' bodies by id, opened."""
    cipher = await sealing.for_user(db, user, writing=False)
    return {i: sealing.open_json(cipher, "i\0" + i, body)[0] for i, body in bodies.items()}
