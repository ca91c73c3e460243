"""Hybrid search at scale (issue 40, point 4), PostgreSQL; outside CI.

    python bench/studies/semantic_scale.py                          # 10,000,000 messages, then a 1,000,000 backfill
    python bench/studies/semantic_scale.py --messages 1000000 --backfill 100000     # a quick look

1. **Search at 10M.** ten_million.py's layout (20 sessions a user, 100 messages a session on average: a typical
   user has about 2,000), filled at 0006 and upgraded (the search indexes built over the rows), then a vector
   for every message written by SQL (random 4-bit codes: a vector's bytes, not its meaning, are what a scan
   costs). For 200 random users: p50/p99 of hybrid, vector-only and keyword-only search (wordllama embeds each
   query; ``--embedder e5``: e5 does, over vectors of its 192 bytes), beside the floor: the raw driver reading the
   same user's vectors with the same join.
2. **The backfill of 1M messages** with wordllama in a fresh database: messages a second, the longest batch
   write (the longest any other writer of those rows could wait), and an app's commits meanwhile (p50, max).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from typing import Any

import asyncpg
from agent_framework import Message
from sqlalchemy import text
from ten_million import FILL, build, fresh_store

from agent_store import Store

VECTORS = """INSERT INTO agent_message_vectors (session_id, seq, profile_id, vec)
    SELECT session_id, seq, :pid, decode(md5(session_id || seq) || md5(seq || session_id) || md5(session_id)
                                         || md5(seq::text) || md5(session_id || 'a') || md5(seq || 'b')
                                         || md5(session_id || 'c') || md5(seq || 'd'), 'hex')
    FROM agent_messages"""
# e5's vectors: 384 dimensions at 4 bits, 192 bytes
VECTORS_E5 = """INSERT INTO agent_message_vectors (session_id, seq, profile_id, vec)
    SELECT session_id, seq, :pid, decode(md5(session_id || seq) || md5(seq || session_id) || md5(session_id)
                                         || md5(seq::text) || md5(session_id || 'a') || md5(seq || 'b')
                                         || md5(session_id || 'c') || md5(seq || 'd') || md5(session_id || 'e')
                                         || md5(seq || 'f') || md5(session_id || 'g') || md5(seq || 'h'), 'hex')
    FROM agent_messages"""
FLOOR = """SELECT v.session_id, v.seq, v.vec FROM agent_message_vectors v JOIN agent_sessions s ON s.id = v.session_id
    WHERE s.user_id = $1 AND v.profile_id = $2"""


def p50_p99(samples: list[float]) -> str:
    samples = sorted(samples)
    return f"{statistics.median(samples):6.1f} {samples[int(0.99 * (len(samples) - 1))]:6.1f}"


async def timed(call: Any, users: list[str]) -> list[float]:
    out = []
    for user in users:
        started = time.perf_counter()
        await call(user)
        out.append((time.perf_counter() - started) * 1e3)
    return out


async def search_at(pg_url: str, messages: int, reuse: bool, embedder: str) -> None:
    sessions = messages // 100
    url = pg_url.rsplit("/", 1)[0] + "/agent_store_bench_semantic"
    if not reuse:
        store = await fresh_store(pg_url, "agent_store_bench_semantic")
        print(f"building {messages:,} messages ...", flush=True)
        built = await build(store, sessions)
        await store.close()
    async with Store.from_url(url, embedder=embedder, pool_size=4) as semantic:
        pid = await semantic.embeddings.profile_id(create=True)
        if not reuse:
            started = time.perf_counter()
            async with semantic.engine.begin() as conn:
                await conn.execute(text(VECTORS_E5 if embedder == "e5" else VECTORS), {"pid": pid})
            async with semantic.engine.connect() as conn:
                autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
                await autocommit.execute(text("VACUUM ANALYZE agent_message_vectors"))
                size = (await conn.execute(text("SELECT pg_total_relation_size('agent_message_vectors')"))).scalar_one()
            print(f"built in {built:.0f} s; vectors written in {time.perf_counter() - started:.0f} s, "
                  f"{size / messages:.0f} bytes a message (table and key)", flush=True)
        pick = random.Random(11)
        users = [f"user-{pick.randrange(sessions // 20)}" for _ in range(200)]
        raw = await asyncpg.connect(url.replace("+asyncpg", ""))

        async def floor(user: str) -> None:  # with the store's plan setting (vectors.py: NO_PARALLEL)
            async with raw.transaction():
                await raw.execute("SET LOCAL max_parallel_workers_per_gather = 0")
                await raw.fetch(FLOOR, user, pid)

        rows = {"floor: raw driver, the user's vectors": await timed(floor, users)}
        await raw.close()
        for ranking in ("vector", "hybrid", "keyword"):
            await semantic.search("train tickets", user_id=users[0], ranking=ranking)  # warm
            rows[f"search, {ranking}"] = await timed(
                lambda u, r=ranking: semantic.search("train tickets", user_id=u, ranking=r, limit=10), users)
    print(f"\n| {messages:,} messages, 200 users of about 2,000 ({embedder}) | p50 ms | p99 ms |\n|---|---|---|")
    for name, samples in rows.items():
        p50, p99 = p50_p99(samples).split()
        print(f"| {name} | {p50} | {p99} |")


async def backfill_of(pg_url: str, messages: int) -> None:
    store = await fresh_store(pg_url, "agent_store_bench_backfill")
    await store.migrate()
    async with store.engine.begin() as conn:
        for statement in FILL:
            await conn.execute(text(statement), {"sessions": messages // 100})
    await store.close()
    url = pg_url.rsplit("/", 1)[0] + "/agent_store_bench_backfill"
    async with Store.from_url(url, embedder="wordllama", pool_size=4) as semantic:
        writes: list[float] = []
        real = semantic.embeddings._write

        async def write(*args: Any) -> int:  # timed: the longest another writer of these rows could wait
            started = time.perf_counter()
            done = await real(*args)
            writes.append((time.perf_counter() - started) * 1e3)
            return done

        semantic.embeddings._write = write  # type: ignore[method-assign]
        commits: list[float] = []
        finished = asyncio.Event()

        async def app() -> None:  # a session of the app committing while the backfill runs
            while not finished.is_set():
                started = time.perf_counter()
                async with semantic.session("app-session", user_id="app") as session:
                    session.state["in_memory"]["messages"].append(Message(role="user", contents=["hi"]))
                commits.append((time.perf_counter() - started) * 1e3)
                await asyncio.sleep(0.05)

        beside = asyncio.create_task(app())
        started = time.perf_counter()
        done = await semantic.embeddings.backfill(batch_size=500)
        took = time.perf_counter() - started
        finished.set()
        await beside
    print(f"\n| backfill of {done:,} messages (wordllama, batches of 500) | |\n|---|---|")
    print(f"| time | {took:.0f} s ({done / took:,.0f} messages/s) |")
    print(f"| a batch's write transaction, p50 / max | {statistics.median(writes):.0f} / {max(writes):.0f} ms |")
    print(f"| an app's commit meanwhile, p50 / max ({len(commits)} commits) | {p50_p99(commits).split()[0]} / "
          f"{max(commits):.0f} ms |")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="postgresql+asyncpg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--messages", type=int, default=10_000_000)
    parser.add_argument("--backfill", type=int, default=1_000_000, help="0: no backfill")
    parser.add_argument("--reuse", action="store_true", help="search the database a previous run built")
    parser.add_argument("--embedder", choices=["wordllama", "e5"], default="wordllama",
                        help="the search's embedder (its query is embedded in each search; vectors of its size)")
    args = parser.parse_args()
    await search_at(args.url, args.messages, args.reuse, args.embedder)
    if args.backfill:
        await backfill_of(args.url, args.backfill)


if __name__ == "__main__":
    asyncio.run(main())
