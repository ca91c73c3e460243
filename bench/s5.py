"""S5 as issue 43 measures it: bytes on disk per message after S1 (one session, 500 turns: 1,000 messages), for
agent_store, the floor and every peer, each in a database (or file) of its own.

Two figures a side: the whole (every table of the side, with indexes and TOAST, divided by the messages) and the
marginal (the same less what the side's empty schema takes, measured right after it was created: agent_store's
schema has about 60 tables and indexes for features S1 does not use, a fixed cost that S1's 1,000 messages would
otherwise carry). The store's bytes are also split in parts (space.py), with the rest a part of its own.
S1 is sequential: a burst of concurrent inserts (S2) would make PostgreSQL extend tables many pages at a time,
slack that later inserts fill, not bytes a message keeps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from floor import Floor
from peers import fresh_url, peers_for
from scenarios import floor_run, store_run, texts
from space import PARTS, postgres_parts, side_bytes, sqlite_parts
from sqlalchemy import text

from agent_store import Store

TURNS = 500  # S1: each turn adds a user message and a reply


async def s5(url: str, rep: int) -> dict[str, dict[str, float]]:
    """``url``: the backend's (a PostgreSQL database or a SQLite file beside which the sides' files go)."""
    postgres = url.startswith("postgresql")
    out: dict[str, dict[str, float]] = {"S5 bytes/message": {}, "S5 marginal bytes/message": {}}

    def record(side: str, empty: int, full: int) -> None:
        out["S5 bytes/message"][side] = full / (2 * TURNS)
        out["S5 marginal bytes/message"][side] = (full - empty) / (2 * TURNS)

    store_url = await fresh_url(url, f"s5_{rep}_store")
    async with Store.from_url(store_url) as store:
        await store.migrate()
        empty, _ = await side_bytes(store_url, "peer")
        for n in range(TURNS):
            await store_run(store, "s5", n)
        async with store.engine.connect() as conn:
            assert (await conn.execute(text("SELECT count(*) FROM agent_messages"))).scalar_one() == 2 * TURNS
    full, tables = await side_bytes(store_url, "peer")
    record("store", empty, full)
    if postgres:
        async with Store.from_url(store_url, check_schema=False) as store, store.engine.connect() as conn:
            parts = await postgres_parts(conn, tables, 2 * TURNS)
    else:
        parts = sqlite_parts(Path(store_url.split("///", 1)[1]), 2 * TURNS)
    parts["the rest"] = full / (2 * TURNS) - sum(parts.values())
    for part in (*PARTS, "the rest"):
        out["S5 part: " + part] = {"store": parts[part]}

    floor_url = await fresh_url(url, f"s5_{rep}_floor")
    floor = await Floor.open(floor_url, 1)
    try:
        empty, _ = await side_bytes(floor_url, "peer")
        for n in range(TURNS):
            await floor_run(floor, "s5", n)
    finally:
        await floor.close()
    record("floor", empty, (await side_bytes(floor_url, "peer"))[0])

    for number, peer_class in enumerate(peers_for("postgresql" if postgres else "sqlite")):
        peer_url = await fresh_url(url, f"s5_{rep}_peer{number}")
        peer: Any = await peer_class.open(peer_url, 1, texts)
        try:
            empty, _ = await side_bytes(peer_url, "peer")
            for n in range(TURNS):
                await peer.run("s5", n)
        finally:
            await peer.close()
        record(peer.name, empty, (await side_bytes(peer_url, "peer"))[0])
    return out
