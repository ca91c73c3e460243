"""A Responses server's store (issue 38, point 5): 200 chained responses through StoreResponseProvider, beside the
package's own FileResponseStore, and the raw floor.

Each turn is what the server does for a ``previous_response_id`` request: read the history ids (its window: the
last 20), create the response with its input item, its output item and that history, then read the history's
items (``get_items``). Bytes: what the turns added (agent_store: every hosted table and index, after VACUUM on
PostgreSQL, the file after a checkpoint on SQLite; FileResponseStore: its directory), beside the items' own JSON
(the floor: each item once). Time: median ms of a turn's three calls, beside the raw driver doing a turn's reads
and writes on the same tables (asyncpg, or aiosqlite's connection): the floor.

    .venv/bin/python bench/studies/hosted_responses.py [--turns 200] [--url postgresql+asyncpg://postgres@127.0.0.1:5432/b]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL", "true")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from azure.ai.agentserver.responses import FileResponseStore
from responses import fresh, store_bytes

from agent_store import Store
from agent_store.agentserver.responses import StoreResponseProvider

WINDOW = 20


def item(item_id: str, role: str, n: int) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    words = f"turn {n}: " + "这是一段普通长度的对话内容，some ordinary words as well. " * 3
    return {"id": item_id, "type": "message", "role": role, "content": [{"type": kind, "text": words}]}


async def chain(provider: Any, turns: int) -> tuple[list[float], int]:
    """The turns; (each turn's ms, the items' own JSON bytes)."""
    took, floor, previous = [], 0, None
    for n in range(turns):
        rid, given, said = f"resp_{n:05d}", item(f"in_{n:05d}", "user", n), item(f"out_{n:05d}", "assistant", n)
        floor += sum(len(json.dumps(i, ensure_ascii=False).encode()) for i in (given, said))
        start = time.perf_counter()
        history = await provider.get_history_item_ids(previous, None, WINDOW)
        envelope = {"id": rid, "object": "response", "status": "completed", "model": "m", "output": [said]}
        if previous is not None:
            envelope["previous_response_id"] = previous
        await provider.create_response(envelope, [given], history)
        await provider.get_items(history)
        took.append((time.perf_counter() - start) * 1000)
        previous = rid
    return took, floor


async def floor_turns(store: Store, turns: int) -> list[float]:
    """The raw driver's turn on the same tables (another partition): read the previous response's history ids,
    write the response, its two items and its links (its window of history ids copied) in one transaction, read
    the history's items. What any SQL store of this protocol must at least do, without agent_store's code."""
    async with store.engine.connect() as conn:
        raw = (await conn.get_raw_connection()).driver_connection
        return await _floor_turns(raw, conn.dialect.name == "postgresql", turns)


async def _floor_turns(raw: Any, pg: bool, turns: int) -> list[float]:
    took: list[float] = []
    previous, window = None, []
    for n in range(turns):
        rid, given, said = f"raw_{n:05d}", item(f"rin_{n:05d}", "user", n), item(f"rout_{n:05d}", "assistant", n)
        start = time.perf_counter()
        if previous is not None:
            history = await _fetch(raw, pg, HISTORY, previous)
            window = [r[0] for r in history][-WINDOW:]
        envelope = json.dumps({"id": rid, "object": "response", "status": "completed", "model": "m"})
        links = [*window, given["id"], said["id"]]
        await _write(raw, pg, rid, envelope, [given, said], links)
        if window:
            await _fetch(raw, pg, ITEMS, window if pg else json.dumps(window))
        took.append((time.perf_counter() - start) * 1000)
        previous = rid
    return took


HISTORY = {True: "SELECT item_id FROM agent_hosted_links WHERE user_id = 'raw' AND response_id = $1 ORDER BY kind, pos",
           False: "SELECT item_id FROM agent_hosted_links WHERE user_id = 'raw' AND response_id = ? ORDER BY kind, pos"}
ITEMS = {True: "SELECT item_id, body FROM agent_hosted_items WHERE user_id = 'raw' AND item_id = ANY($1)",
         False: "SELECT item_id, body FROM agent_hosted_items WHERE user_id = 'raw' AND item_id IN "
                "(SELECT value FROM json_each(?))"}  # fmt: skip


async def _fetch(raw: Any, pg: bool, sql: dict[bool, str], arg: Any) -> list[Any]:
    if pg:
        return list(await raw.fetch(sql[True], arg))
    cursor = await raw.execute(sql[False], [arg])
    return list(await cursor.fetchall())


async def _write(raw: Any, pg: bool, rid: str, envelope: str, items: list[dict[str, Any]], links: list[str]) -> None:
    rows = [("raw", i["id"], "message", json.dumps(i, ensure_ascii=False)) for i in items]
    link_rows = [("raw", rid, "h", n, item_id) for n, item_id in enumerate(links)]
    response = ("raw", rid, envelope)
    if pg:
        async with raw.transaction():
            await raw.execute("INSERT INTO agent_hosted_responses (user_id, response_id, envelope, history_skip, "
                              "history_len, created_seq, created_at, updated_at) VALUES ($1, $2, $3, 0, 0, 0, now(), "
                              "now())", *response)  # fmt: skip
            await raw.executemany("INSERT INTO agent_hosted_items VALUES ($1, $2, $3, $4)", rows)
            await raw.executemany("INSERT INTO agent_hosted_links VALUES ($1, $2, $3, $4, $5)", link_rows)
        return
    await raw.execute("BEGIN IMMEDIATE")
    await raw.execute("INSERT INTO agent_hosted_responses (user_id, response_id, envelope, history_skip, history_len, "
                      "created_seq, created_at, updated_at) VALUES (?, ?, ?, 0, 0, 0, datetime(), datetime())",
                      response)  # fmt: skip
    await raw.executemany("INSERT INTO agent_hosted_items VALUES (?, ?, ?, ?)", rows)
    await raw.executemany("INSERT INTO agent_hosted_links VALUES (?, ?, ?, ?, ?)", link_rows)
    await raw.execute("COMMIT")


async def main(args: argparse.Namespace) -> None:
    url = await fresh(args.url, "hosted")
    async with Store.from_url(url) as store:
        await store.migrate()
        empty = await store_bytes(store, url)
        ours, floor = await chain(StoreResponseProvider(store), args.turns)
        ours_bytes = await store_bytes(store, url) - empty
        raw = await floor_turns(store, args.turns)
    folder = Path(tempfile.mkdtemp())
    theirs, _ = await chain(FileResponseStore(storage_dir=folder), args.turns)
    files = [f for f in folder.rglob("*") if f.is_file()]  # noqa: ASYNC240 - once, after the chain
    file_bytes = sum(f.stat().st_size for f in files)
    backend = "PostgreSQL" if args.url.startswith("postgresql") else "SQLite"
    print(f"\n{args.turns} chained responses, a history window of {WINDOW}, {backend}\n")
    base = statistics.median(raw)
    print("| stored by | bytes | per response | x floor | turn ms (median) | x raw turn |\n|---|---|---|---|---|---|")
    print(f"| the items' own JSON, once (floor) | {floor:,} | {floor / args.turns:,.0f} | 1.00 | | |")
    print(f"| the raw driver's turn (floor), same tables | | | | {base:.2f} | 1.00 |")
    print(f"| StoreResponseProvider | {ours_bytes:,} | {ours_bytes / args.turns:,.0f} | {ours_bytes / floor:.2f} | "
          f"{statistics.median(ours):.2f} | {statistics.median(ours) / base:.2f} |")  # fmt: skip
    print(f"| FileResponseStore ({len(files)} files, no fsync) | {file_bytes:,} | {file_bytes / args.turns:,.0f} | "
          f"{file_bytes / floor:.2f} | {statistics.median(theirs):.2f} | {statistics.median(theirs) / base:.2f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--url", default="sqlite+aiosqlite:///bench_hosted.db")
    asyncio.run(main(parser.parse_args()))
