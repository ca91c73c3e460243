"""What the second outside review of hybrid search (issue 40) confirmed, each a test now: on PostgreSQL the
backfill's row locks waited for writers and deadlocked with a transaction updating several messages; ranking by
meaning before any backfill answered an empty page (vector) or words passed off as hybrid, with no hint."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from helpers import lock_waits, raw_connect, until
from test_hybrid_search import EMBEDDER, keys, vector_count
from test_search import say

from agent_store import NotEmbeddedError, Store

HOLD_ROW_1 = "UPDATE agent_messages SET excluded = excluded WHERE session_id = 'long' AND seq = 1"


async def six_messages(pg_url: str) -> None:
    async with Store.from_url(pg_url) as store:
        await store.migrate()
        await say(store, "long", *(f"message {i} about flights and hotels" for i in range(6)))


@asynccontextmanager
async def writer_holding(pg_url: str, seq: int) -> AsyncIterator[tuple[asyncpg.Connection, Any]]:
    """A raw connection whose open transaction holds message ``seq``'s row, and that transaction."""
    writer = await raw_connect(pg_url)
    try:
        holding = writer.transaction()
        await holding.start()
        await writer.execute(HOLD_ROW_1.replace("seq = 1", f"seq = {seq}"))
        yield writer, holding
    finally:
        await writer.close()


async def test_the_backfill_waits_for_no_writer(pg_url: str) -> None:
    """A writer holds message 1's row (a commit rewriting its marks, in flight): the backfill passes it by and
    finishes at once; the next backfill, after the writer's commit, takes it."""
    await six_messages(pg_url)
    async with writer_holding(pg_url, 1) as (_, holding), Store.from_url(pg_url, embedder=EMBEDDER) as store:
        written = await asyncio.wait_for(store.embeddings.backfill(batch_size=3), timeout=30)
        assert written == 5 and await store.embeddings.pending() == 1
        await holding.commit()
        assert await store.embeddings.backfill() == 1 and await vector_count(store) == 6


async def test_a_writer_updating_several_messages_never_deadlocks_with_the_backfill(pg_url: str) -> None:
    """The writer holds message 3, the backfill starts, then the writer updates message 1 too and commits. Before,
    the backfill held 0-2 waiting for 3 while the writer waited for 1: PostgreSQL rolled one of them back."""
    await six_messages(pg_url)
    async with writer_holding(pg_url, 3) as (writer, holding), Store.from_url(pg_url, embedder=EMBEDDER) as store, \
            lock_waits(pg_url) as waiting:  # fmt: skip
        backfill = asyncio.create_task(store.embeddings.backfill(batch_size=6))

        async def passed_or_stuck() -> bool:  # now: passed message 3 by and done, or (before) waiting for it
            return backfill.done() or await waiting() > 0

        await until(passed_or_stuck, "the backfill to finish or to wait for message 3")
        await asyncio.wait_for(writer.execute(HOLD_ROW_1), timeout=30)  # a deadlock raises here or in the backfill
        await holding.commit()
        assert await asyncio.wait_for(backfill, timeout=30) == 5
        assert await store.embeddings.backfill() == 1 and await store.embeddings.pending() == 0


async def test_ranking_by_meaning_before_any_backfill_says_so(url: str, store: Store, tmp_path: Path) -> None:
    import httpx
    from cli_support import cli

    from agent_store.browser.app import create_app

    await say(store, "trip", "I booked a flight to Paris for Friday", "Buy milk for the flight")
    async with Store.from_url(url, embedder=EMBEDDER) as semantic:
        with pytest.raises(NotEmbeddedError, match="agent-store embed"):
            await semantic.search("airplane ticket", user_id="u", ranking="vector")
        page = await semantic.search("flight", user_id="u", ranking="hybrid")
        assert page.ranking == "keyword" and {h.seq for h in page.items} == {0, 1}  # words only, and it says so
        assert all(h.similarity is None for h in page.items)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(semantic)),
                                     base_url="http://127.0.0.1", headers={"host": "127.0.0.1"}) as web:  # fmt: skip
            shown = await web.get("/search", params={"user": "u", "q": "flight"})
            assert shown.status_code == 200 and "Ranked by words only" in shown.text
        words = cli("search", "flight", "--user", "u", "--ranking", "hybrid", url=url, cwd=tmp_path)
        assert words.returncode == 0 and "Paris" in words.stdout and "ranked by words only" in words.stderr
        refused = cli("search", "flight", "--user", "u", "--ranking", "vector", url=url, cwd=tmp_path)
        assert refused.returncode != 0 and "agent-store embed" in refused.stderr
        await semantic.embeddings.backfill()
        page = await semantic.search("airplane ticket", user_id="u", ranking="hybrid")
        assert page.ranking == "hybrid" and page.items[0].seq == 0
        assert await keys(semantic, "airplane ticket", "vector", user_id="nobody") == []  # vectors, none in scope


async def test_vectors_only_in_another_profile_are_refused_even_after_an_empty_backfill(url: str, store: Store) -> None:
    """Found by the third review: once this embedder's profile row existed with no vectors (a backfill that
    wrote none), the other profile's vectors were no longer named; hybrid quietly ranked by words."""
    from test_hybrid_search import OtherModel

    from agent_store import EmbeddingProfileError

    await say(store, "trip", "I booked a flight to Paris for Friday")
    async with Store.from_url(url, embedder=OtherModel()) as other:
        assert await other.embeddings.backfill() == 1
    async with Store.from_url(url, embedder=EMBEDDER) as semantic:
        for ranking in ("vector", "hybrid"):
            with pytest.raises(EmbeddingProfileError):
                await semantic.search("airplane", user_id="u", ranking=ranking)
        assert await semantic.embeddings.backfill(limit=0) == 0  # makes this profile's row, writes nothing
        for ranking in ("vector", "hybrid"):
            with pytest.raises(EmbeddingProfileError):
                await semantic.search("airplane", user_id="u", ranking=ranking)
