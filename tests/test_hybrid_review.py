"""What the outside review of hybrid search (issue 40) confirmed, each a test now: on PostgreSQL a text change or a
delete in flight while the backfill writes (a stale vector kept for good; the whole backfill failed on a foreign
key); embedder output that slipped past the check (an object array, float64 beyond float32); the hybrid limit
off by one; concurrent backfills' counts; a refusal naming profiles that hold no vectors."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from helpers import lock_waiters, raw_connect, until
from sqlalchemy import text
from test_hybrid_search import EMBEDDER, OtherModel, vector_count
from test_search import say

from agent_store import EmbeddingProfileError, InvalidValueError, Store
from agent_store.search.embedders import EmbeddingProfile
from agent_store.search.vectors import Embeddings


class ChangesWhileEmbedding:
    """The offline embedder, but while it embeds another connection changes (or deletes) message 0 in a
    transaction it commits only once the backfill's write of these texts has come (done, or waiting for the
    change): the backfill's write comes while that change is in flight. ``wrote()`` counts the backfill's writes
    (the test wraps them)."""

    profile = EMBEDDER.profile

    def __init__(self, url: str, statement: str) -> None:
        self.url, self.statement = url, statement  # the PgBouncer pass's URL too
        self.done: asyncio.Task[None] | None = None
        self.writes = 0

    def wrote(self) -> None:
        self.writes += 1

    async def embed(self, texts: list[str]) -> np.ndarray:
        other = await raw_connect(self.url)
        transaction = other.transaction()
        await transaction.start()
        await other.execute(self.statement)

        before = self.writes

        async def commit_later() -> None:
            async def written_or_waiting() -> bool:
                return self.writes > before or await lock_waiters(other) > 0

            try:
                await until(written_or_waiting, "the backfill's write")
                await transaction.commit()
            finally:
                await other.close()

        self.done = asyncio.create_task(commit_later())
        return await EMBEDDER.embed(texts)


@pytest.mark.parametrize("change", ["UPDATE agent_messages SET text = 'banana bread recipe' WHERE seq = 0",
                                    "DELETE FROM agent_messages WHERE seq = 0"])  # fmt: skip
async def test_a_change_in_flight_during_the_write_leaves_no_stale_vector(
    pg_url: str, change: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Store.from_url(pg_url) as store:
        await store.migrate()
        await say(store, "s1", "I booked a plane to Beijing", "my dog is named Rex")
    embedder, write = ChangesWhileEmbedding(pg_url, change), Embeddings._write

    async def counted(self: Embeddings, *args: Any) -> int:
        try:
            return await write(self, *args)
        finally:
            embedder.wrote()

    monkeypatch.setattr(Embeddings, "_write", counted)
    async with Store.from_url(pg_url, embedder=embedder) as store:
        assert await store.embeddings.backfill() == 1  # message 1 only: 0 changed (or went) under it
        assert embedder.done is not None
        await embedder.done
        async with store.engine.connect() as conn:
            kept = (await conn.execute(text("SELECT seq FROM agent_message_vectors"))).scalars().all()
        assert kept == [1]
        assert await store.embeddings.pending() == (1 if change.startswith("UPDATE") else 0)
        async with Store.from_url(pg_url, embedder=EMBEDDER) as again:
            assert await again.embeddings.backfill() == (1 if change.startswith("UPDATE") else 0)  # the new text


class Strange(OtherModel):
    def __init__(self, make: Any) -> None:
        self.make = make

    async def embed(self, texts: list[str]) -> np.ndarray:
        return self.make(len(texts))


@pytest.mark.parametrize("make", [lambda n: np.array([["x"] * 256] * n, dtype=object),
                                  lambda n: np.full((n, 256), 1e300),  # finite in float64, inf in float32
                                  lambda n: np.full((n, 256), "1.0")])  # fmt: skip
async def test_embedder_output_that_is_not_finite_float32_is_refused(store: Store, url: str, make: Any) -> None:
    await say(store, "a", "the flight to Beijing")
    async with Store.from_url(url, embedder=Strange(make)) as strange:
        with pytest.raises(InvalidValueError, match="finite"):
            await strange.embeddings.backfill()
    assert await vector_count(store) == 0


async def test_limits_counts_and_the_refusal_say_what_is_true(store: Store, url: str) -> None:
    await say(store, "a", *[f"message {i} about trains" for i in range(300)])
    async with Store.from_url(url, embedder=EMBEDDER) as one, Store.from_url(url, embedder=EMBEDDER) as two:
        counts = await asyncio.gather(one.embeddings.backfill(batch_size=7), two.embeddings.backfill(batch_size=11))
        assert sum(counts) == 300 == await vector_count(store)  # each vector counted by the backfill that wrote it
        assert len((await one.search("trains", user_id="u", ranking="hybrid", limit=100)).items) == 100
        with pytest.raises(InvalidValueError, match="1 to 100"):
            await one.search("trains", user_id="u", ranking="hybrid", limit=101)
    empty = EmbeddingProfile("never-written", 256, "1")

    class Failing(OtherModel):
        profile = empty

        async def embed(self, texts: list[str]) -> np.ndarray:
            raise RuntimeError("the model server is down")

    async with Store.from_url(url, embedder=Failing()) as failing:
        with pytest.raises(RuntimeError):
            await failing.embeddings.backfill()
    async with Store.from_url(url, embedder=OtherModel()) as other:
        with pytest.raises(EmbeddingProfileError) as refused:
            await other.search("trains", user_id="u", ranking="vector")
    assert "wordllama" in str(refused.value) and "never-written" not in str(refused.value)
