"""A run's journal (issue 39): what a batch of events costs, beside the raw driver writing the same batch, and what
journaling adds to a whole streamed run of the offline agent, beside the same run without it. Medians.

    python bench/studies/journal.py                                   # SQLite (a temp file)
    python bench/studies/journal.py --url postgresql+asyncpg://...    # PostgreSQL

The floor writes the same events with the raw driver in one request per batch (PostgreSQL: one statement, the
run row's update, ``INSERT ... SELECT FROM jsonb_array_elements($1)`` and a NOTIFY in one CTE; SQLite: one
transaction, an executemany and an update), into tables of its own with the same keys.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid

import aiosqlite
import asyncpg
from agent_framework import Agent
from sqlalchemy.engine import make_url

from agent_store import Store
from agent_store.offline import OfflineChatClient

EVENT = {"type": "agent_response_update", "role": "assistant", "author_name": "Assistant",
         "contents": [{"type": "text", "text": "你好，李明！很高兴认识你。", "additional_properties": {}}]}  # fmt: skip
FLOOR_DDL = [
    "CREATE TABLE IF NOT EXISTS floor_streams (user_id TEXT NOT NULL, stream_id TEXT NOT NULL, last_seq BIGINT NOT "
    "NULL, PRIMARY KEY (user_id, stream_id))",
    "CREATE TABLE IF NOT EXISTS floor_events (user_id TEXT NOT NULL, stream_id TEXT NOT NULL, seq BIGINT NOT NULL, "
    "event {json} NOT NULL, PRIMARY KEY (user_id, stream_id, seq))",
]
PG_BATCH = """WITH moved AS (UPDATE floor_streams SET last_seq = $3 + $4 WHERE user_id = $1 AND stream_id = $2
    AND last_seq = $3 RETURNING 1),
written AS (INSERT INTO floor_events SELECT $1, $2, $3 + n, value
    FROM jsonb_array_elements($5::jsonb) WITH ORDINALITY e(value, n) WHERE EXISTS (SELECT 1 FROM moved))
SELECT pg_notify('floor_streams', $2) FROM moved"""  # the same work: the row, the events, the wake-up


async def ours(store: Store, batches: int, size: int) -> list[float]:
    journal = store.journal(batch_events=size, batch_ms=60_000)
    writer = await journal.start(uuid.uuid4().hex, user_id="u")
    times = []
    for _ in range(batches):
        for _ in range(size - 1):
            await writer.append(EVENT)
        started = time.perf_counter()
        await writer.append(EVENT)  # the batch's last event: sends it
        times.append((time.perf_counter() - started) * 1000)
    await writer.finish()
    await journal.close()
    return times


async def floor(url: str, batches: int, size: int) -> list[float]:
    text = json.dumps([EVENT] * size, ensure_ascii=False)
    sid, times = uuid.uuid4().hex, []
    if url.startswith("postgresql"):
        conn = await asyncpg.connect(make_url(url).set(drivername="postgresql", query={})
                                     .render_as_string(hide_password=False))  # fmt: skip
        for ddl in FLOOR_DDL:
            await conn.execute(ddl.format(json="JSONB"))
        await conn.execute("INSERT INTO floor_streams VALUES ('u', $1, 0)", sid)
        for n in range(batches):
            started = time.perf_counter()
            await conn.fetch(PG_BATCH, "u", sid, n * size, size, text)
            times.append((time.perf_counter() - started) * 1000)
        await conn.close()
        return times
    async with aiosqlite.connect(make_url(url).database or "") as conn:
        for ddl in FLOOR_DDL:
            await conn.execute(ddl.format(json="TEXT"))
        await conn.execute("INSERT INTO floor_streams VALUES ('u', ?, 0)", (sid,))
        await conn.commit()
        event = json.dumps(EVENT, ensure_ascii=False)
        for n in range(batches):
            started = time.perf_counter()
            await conn.execute("BEGIN IMMEDIATE")
            await conn.execute("UPDATE floor_streams SET last_seq = ? WHERE user_id = 'u' AND stream_id = ?",
                               ((n + 1) * size, sid))  # fmt: skip
            await conn.executemany("INSERT INTO floor_events VALUES ('u', ?, ?, ?)",
                                   [(sid, n * size + i + 1, event) for i in range(size)])  # fmt: skip
            await conn.commit()
            times.append((time.perf_counter() - started) * 1000)
    return times


async def whole_runs(store: Store, runs: int) -> tuple[list[float], list[float]]:
    agent = Agent(client=OfflineChatClient(), name="Assistant")
    plain: list[float] = []
    journaled: list[float] = []
    journal = store.journal()
    for n in range(runs):
        for kept, into in ((False, plain), (True, journaled)):
            started = time.perf_counter()
            async with store.session(f"bench-{kept}-{n}", user_id="u") as session:
                if kept:
                    async with await journal.start(uuid.uuid4().hex, user_id="u") as writer:
                        async for update in agent.run("我叫李明", session=session, stream=True):
                            await writer.append(update.to_dict())
                else:
                    async for _ in agent.run("我叫李明", session=session, stream=True):
                        pass
            into.append((time.perf_counter() - started) * 1000)
    await journal.close()
    return plain, journaled


async def main(args: argparse.Namespace) -> None:
    url = args.url or f"sqlite+aiosqlite:///{tempfile.mkdtemp()}/journal.db"
    async with Store.from_url(url) as store:
        await store.migrate()
        await ours(store, 3, args.size)  # warm
        await floor(url, 3, args.size)
        mine, raw = await ours(store, args.batches, args.size), await floor(url, args.batches, args.size)
        plain, journaled = await whole_runs(store, args.runs)
    backend = "PostgreSQL" if url.startswith("postgresql") else "SQLite"
    print(f"\n{backend}: a batch of {args.size} events (median of {args.batches})\n")
    print("| writer | ms per batch | x raw |\n|---|---|---|")
    print(f"| raw driver, one request | {statistics.median(raw):.2f} | 1.00 |")
    ratio = statistics.median(mine) / statistics.median(raw)
    print(f"| agent_store journal | {statistics.median(mine):.2f} | {ratio:.2f} |")
    print(f"\n{backend}: a streamed run of the offline agent with its commit (median of {args.runs})\n")
    print("| run | ms | x without |\n|---|---|---|")
    print(f"| without a journal | {statistics.median(plain):.2f} | 1.00 |")
    print(f"| journaled (start, one batch, end) | {statistics.median(journaled):.2f} | "
          f"{statistics.median(journaled) / statistics.median(plain):.2f} |")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url")
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--runs", type=int, default=41)
    asyncio.run(main(parser.parse_args()))
