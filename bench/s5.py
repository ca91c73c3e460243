"""S5 as issue 43 measures it: bytes on disk per message after S1 (one session, 500 turns: 1,000 messages), for
agent_store, the floor and every peer, each in a database (or file) of its own.

Three figures a side:
- the whole: every table of the side, with indexes, TOAST and their free-space and visibility maps, divided by
  the messages (the issue's figure);
- less the empty schema: the same less what the side's schema takes right after it was created (agent_store's
  has about 60 tables and indexes for features S1 does not use, each at least a page);
- the second half: the bytes the last 250 turns added, per message. Costs that do not grow with the messages
  (a table's first pages, its maps, the search index's pending list of recent entries) are in neither half's
  difference: this is what a message costs in a store that already has some.
The store's bytes are also split in parts (space.py), with the rest a part of its own.
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
NAMES = ("S5 bytes/message", "S5 bytes/message less the empty schema", "S5 bytes/message of the second half")


async def s5(url: str, rep: int) -> dict[str, dict[str, float]]:
    """``url``: the backend's (a PostgreSQL database or a SQLite file beside which the sides' files go)."""
    postgres = url.startswith("postgresql")
    out: dict[str, dict[str, float]] = {name: {} for name in NAMES}

    def record(side: str, sizes: list[int]) -> None:
        empty, half, full = sizes
        out[NAMES[0]][side] = full / (2 * TURNS)
        out[NAMES[1]][side] = (full - empty) / (2 * TURNS)
        out[NAMES[2]][side] = (full - half) / TURNS

    async def turns(side_url: str, run: Any) -> list[int]:
        """The side's bytes empty, after half the turns and after all of them."""
        sizes = [(await side_bytes(side_url))[0]]
        for n in range(TURNS):
            if n == TURNS // 2:
                sizes.append((await side_bytes(side_url))[0])
            await run("s5", n)
        return sizes

    store_url = await fresh_url(url, f"s5_{rep}_store")
    async with Store.from_url(store_url) as store:
        await store.migrate()
        sizes = await turns(store_url, lambda sid, n: store_run(store, sid, n))
        full, tables = await side_bytes(store_url)
        async with store.engine.connect() as conn:
            assert (await conn.execute(text("SELECT count(*) FROM agent_messages"))).scalar_one() == 2 * TURNS
            if postgres:
                parts = await postgres_parts(conn, tables, 2 * TURNS)
    if not postgres:
        parts = sqlite_parts(Path(store_url.split("///", 1)[1]), 2 * TURNS)
    record("store", [*sizes, full])
    parts["the rest"] = full / (2 * TURNS) - sum(parts.values())
    for part in (*PARTS, "the rest"):
        out["S5 part: " + part] = {"store": parts[part]}

    floor_url = await fresh_url(url, f"s5_{rep}_floor")
    floor = await Floor.open(floor_url, 1)
    try:
        sizes = await turns(floor_url, lambda sid, n: floor_run(floor, sid, n))
    finally:
        await floor.close()
    record("floor", [*sizes, (await side_bytes(floor_url))[0]])

    for number, peer_class in enumerate(peers_for("postgresql" if postgres else "sqlite")):
        peer_url = await fresh_url(url, f"s5_{rep}_peer{number}")
        peer: Any = await peer_class.open(peer_url, 1, texts)
        try:
            sizes = await turns(peer_url, peer.run)
        finally:
            await peer.close()
        record(peer.name, [*sizes, (await side_bytes(peer_url))[0]])
    return out
