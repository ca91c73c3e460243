"""Hybrid search (issue 40), a third outside review's findings (twenty-seventh session), on both backends: the
backfill's ``limit`` and ``progress`` checked before anything is written; an embedder's profile checked before
its row is written, the same way on both backends; and two spaces that would share a profile's name refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from sqlalchemy import text
from test_hybrid_search import EMBEDDER, vector_count
from test_search import say

from agent_store import EmbeddingProfileError, InvalidValueError, Store
from agent_store.search.embedders import EmbeddingProfile


class Model:
    """An embedder of any profile: a vector from each text's length (enough to rank; never a model call)."""

    def __init__(self, model: Any, dimensions: Any, version: Any) -> None:
        self.profile = EmbeddingProfile(model, dimensions, version)

    async def embed(self, texts: list[str]) -> np.ndarray:
        size = self.profile.dimensions
        return np.array([[len(t) + i for i in range(size)] for t in texts], np.float32)


async def profile_rows(store: Store) -> list[str]:
    async with store.engine.connect() as conn:
        return [r[0] for r in await conn.execute(text("SELECT name FROM agent_embedding_profiles ORDER BY name"))]


@pytest.mark.parametrize("bad", [{"limit": 2.5}, {"limit": "3"}, {"limit": -1}, {"limit": True},
                                 {"progress": "x"}, {"progress": 42}])  # fmt: skip
async def test_the_backfills_limit_and_progress_are_checked_before_anything_is_written(
    url: str, store: Store, bad: dict[str, Any]
) -> None:
    async with Store.from_url(url, embedder=EMBEDDER) as semantic:
        await say(semantic, "a", "the flight to Beijing", "a train to Paris", "milk and bread")
        with pytest.raises(InvalidValueError, match=r"^(limit|progress) must be"):
            await semantic.embeddings.backfill(batch_size=1, **bad)
        assert await vector_count(semantic) == 0
        seen: list[int] = []
        assert await semantic.embeddings.backfill(batch_size=1, limit=2, progress=seen.append) == 2  # good ones do
        assert sum(seen) == 2  # each batch's count


@pytest.mark.parametrize("profile", [("m0", 0, "1"), ("mneg", -3, "1"), ("mstr", "256", "1"), ("mbool", True, "1"),
                                     ("", 8, "1"), ("m", 8, ""), ("m", 8, "v" * 65), ("m" * 300, 8, "1"),
                                     (None, 8, "1"), ("m", 8, 2)])  # fmt: skip
async def test_a_bad_profile_is_refused_on_both_backends_before_its_row_is_written(
    url: str, store: Store, profile: tuple[Any, Any, Any]
) -> None:
    with pytest.raises(InvalidValueError, match="profile"):
        Store.from_url(url, embedder=Model(*profile))
    assert await profile_rows(store) == []


async def test_two_spaces_never_share_a_profile_name(url: str, store: Store) -> None:
    """A model named like a hub's id may hold '/', a version may not: read from the right, a name is one profile."""
    async with Store.from_url(url, embedder=Model("acme/8/1", 8, "2")) as first:
        await say(first, "s", "the flight to Beijing", "a train to Paris")
        assert await first.embeddings.backfill() == 2
    assert await profile_rows(store) == ["acme/8/1/8/2/q4"]
    with pytest.raises(InvalidValueError, match="without '/'"):  # model acme, version 1/8/2: the same name
        Store.from_url(url, embedder=Model("acme", 8, "1/8/2"))
    # A row whose name matches but whose model or version does not (written by other code): refused, not compared.
    async with store.engine.begin() as conn:
        await conn.execute(text("UPDATE agent_embedding_profiles SET model = 'acme', version = '1/8/2'"))
    async with Store.from_url(url, embedder=Model("acme/8/1", 8, "2")) as again:
        with pytest.raises(EmbeddingProfileError, match="stored as 'acme'"):
            await again.search("plane", user_id="u", ranking="vector")
