"""Search by meaning (issue 40): recall@10 of keyword, vector and hybrid search on the generated paraphrase set
(tests/paraphrases.py: 540 queries sharing no word with their message, English, Chinese, Japanese, each
among its speaker's 462 messages), for each offline embedder, on SQLite and PostgreSQL; beside it, what the
backfill does a second and what a vector adds a message on disk.

    python bench/studies/recall.py                                   # SQLite, and PostgreSQL at the URL below
    python bench/studies/recall.py --url postgresql+asyncpg://postgres@127.0.0.1:5432/test --embedders wordllama e5

Each side gets a fresh database (peers.fresh_url). Recall is a count, not a timing: one run says it.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the suite's scenarios.py, floor.py, peers.py
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from paraphrases import LANGUAGES, history
from peers import fresh_url
from sqlalchemy import text
from test_search_recall import recall_table

from agent_store import Store


async def vector_bytes(store: Store) -> float:
    """Bytes on disk per vector row: the table and its key's index (PostgreSQL), or the table's pages (SQLite)."""
    async with store.engine.connect() as conn:
        rows = (await conn.execute(text("SELECT count(*) FROM agent_message_vectors"))).scalar_one()
        if conn.dialect.name == "postgresql":
            await conn.execute(text("COMMIT"))
            await conn.execute(text("VACUUM agent_message_vectors"))
            size = (await conn.execute(text("SELECT pg_total_relation_size('agent_message_vectors')"))).scalar_one()
        else:
            size = (await conn.execute(text(
                "SELECT sum(pgsize) FROM dbstat WHERE name = 'agent_message_vectors'"))).scalar_one()  # fmt: skip
    return size / rows


async def side(url: str, embedder: str) -> list[str]:
    async with Store.from_url(url, embedder=embedder) as store:
        await store.migrate()
        started = time.perf_counter()
        table = await recall_table(store)  # stores the history, backfills it, asks every query three ways
        per_vector = await vector_bytes(store)
        many = [f"message number {i} about something else entirely" for i in range(2000)]
        async with store.session("more", user_id="en") as session:
            from agent_framework import Message

            session.state["in_memory"]["messages"].extend(Message(role="user", contents=[t]) for t in many)
        tick = time.perf_counter()
        await store.embeddings.backfill(batch_size=500)
        rate = len(many) / (time.perf_counter() - tick)
        times = []
        for query in ("airplane ticket", "宠物不舒服", "歯科検診") * 20:
            tick = time.perf_counter()
            await store.search(query, user_id="en", ranking="hybrid", limit=10)
            times.append((time.perf_counter() - tick) * 1000)
    backend = url.split("+")[0]
    lines = [f"| {backend} | {embedder} | {ranking} | " + " | ".join(f"{table[ranking, lang]:.3f}" for lang in
             LANGUAGES) + f" | {sum(table[ranking, lang] for lang in LANGUAGES) / 3:.3f} |"
             for ranking in ("keyword", "vector", "hybrid")]  # fmt: skip
    lines.append(f"|   {backend} {embedder}: backfill {rate:,.0f} messages/s; {per_vector:.0f} bytes a vector; "
                 f"hybrid search of {len(history('en')) + len(many):,} messages p50 {statistics.median(times):.1f} ms; "
                 f"whole side {time.perf_counter() - started:.0f} s |")  # fmt: skip
    return lines


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="postgresql+asyncpg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--embedders", nargs="+", default=["wordllama", "e5"])
    args = parser.parse_args()
    print("| backend | embedder | ranking | " + " | ".join(LANGUAGES) + " | all |")
    print("|---|---|---|" + "---|" * (len(LANGUAGES) + 1))
    with tempfile.TemporaryDirectory() as folder:
        for base in (f"sqlite+aiosqlite:///{folder}/bench.db", args.url):
            for embedder in args.embedders:
                for line in await side(await fresh_url(base, f"recall_{embedder}"), embedder):
                    print(line, flush=True)


if __name__ == "__main__":
    asyncio.run(main())
