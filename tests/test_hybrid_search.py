"""Hybrid search (issue 40) on both backends, with the offline embedder: what it finds that words miss, its
scoping, the vectors' lifecycle (erasure, delete, rewrite), profiles never compared across, and bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from agent_framework import Message
from helpers import until
from sqlalchemy import text
from test_search import say

from agent_store import EmbeddingProfileError, InvalidValueError, Store
from agent_store.errors import ConfigurationError
from agent_store.search.embedders import EmbeddingProfile, WordLlamaEmbedder, pack, unpack

EMBEDDER = WordLlamaEmbedder()  # loaded once: about a second


@pytest.fixture
async def semantic(url: str, store: Store) -> Any:
    """The test database, opened again with the offline embedder."""
    async with Store.from_url(url, embedder=EMBEDDER) as opened:
        yield opened


async def keys(store: Store, query: str, ranking: str, **scope: Any) -> list[tuple[str, int]]:
    page = await store.search(query, user_id=scope.pop("user_id", "u"), ranking=ranking, **scope)
    return [(h.session_id, h.seq) for h in page.items]


async def vector_count(store: Store) -> int:
    async with store.engine.connect() as conn:
        return int((await conn.execute(text("SELECT count(*) FROM agent_message_vectors"))).scalar_one())


async def test_meaning_finds_what_words_miss_and_stays_in_scope(semantic: Store) -> None:
    await say(semantic, "trip", "I booked a flight to Paris for Friday", "My dog is sick again", "Buy milk")
    await say(semantic, "theirs", "airplane tickets to Rome", user_id="intruder")
    assert await semantic.embeddings.pending() == 4
    assert await semantic.embeddings.backfill(batch_size=2) == 4
    assert await semantic.embeddings.pending() == 0
    assert await keys(semantic, "airplane ticket", "keyword") == []  # no word shared
    found = await keys(semantic, "airplane ticket", "hybrid")
    assert found[0] == ("trip", 0) and all(sid == "trip" for sid, _ in found)  # never the other user's
    page = await semantic.search("airplane ticket", user_id="u")  # auto: hybrid, with an embedder
    assert page.items[0].similarity is not None and page.items[0].score is not None and page.next_cursor is None
    assert sorted(await keys(semantic, "airplane -Paris", "hybrid")) == [("trip", 1), ("trip", 2)]  # exclusions hold
    assert await keys(semantic, "airplane", "vector", session_id="nowhere") == []
    both = await keys(semantic, "dog", "hybrid")
    assert both[0] == ("trip", 1)  # found by its word and by meaning: first
    assert await keys(semantic, "airplane ticket", "hybrid", user_id="intruder") == [("theirs", 0)]


async def test_erased_deleted_and_rewritten_messages_leave_no_vector(semantic: Store, url: str) -> None:
    await say(semantic, "a", "the flight to Beijing", "a second message")
    await say(semantic, "b", "my plane ticket", user_id="gone")
    await semantic.embeddings.backfill()
    assert await vector_count(semantic) == 3
    await semantic.erase_user("gone")
    assert await vector_count(semantic) == 2
    assert await keys(semantic, "airplane", "vector", user_id="gone") == []
    async with semantic.engine.begin() as conn:  # an operator's plain SQL rewrites a text: its vector goes
        await conn.execute(text("UPDATE agent_messages SET text = 'about cooking' WHERE session_id = 'a' AND seq = 0"))
    assert await vector_count(semantic) == 1 and await semantic.embeddings.pending() == 1
    await semantic.embeddings.backfill()
    assert await vector_count(semantic) == 2
    assert await semantic.delete("a", user_id="u")
    assert await vector_count(semantic) == 0


async def test_a_message_changed_while_it_was_embedded_gets_no_vector(semantic: Store, monkeypatch: Any) -> None:
    await say(semantic, "a", "first words", "second words")
    real = semantic.embeddings._write

    async def rewritten_first(pid: int, rows: list[Any], blobs: list[bytes]) -> int:
        async with semantic.engine.begin() as conn:  # between the read and the write
            await conn.execute(text("UPDATE agent_messages SET text = 'changed' WHERE session_id = 'a' AND seq = 0"))
        return await real(pid, rows, blobs)

    monkeypatch.setattr(semantic.embeddings, "_write", rewritten_first)
    assert await semantic.embeddings.backfill(batch_size=10) == 2  # the unchanged one, then a sweep for the new text
    monkeypatch.undo()
    assert await semantic.embeddings.pending() == 0
    async with semantic.engine.connect() as conn:
        first = (await conn.execute(text("SELECT vec FROM agent_message_vectors WHERE seq = 0"))).scalar_one()
    assert bytes(first) == pack(await EMBEDDER.embed(["changed"]))[0]  # never the vector of the old text


class OtherModel:
    profile = EmbeddingProfile("another-model", 256, "1")

    async def embed(self, texts: list[str]) -> np.ndarray:
        return np.ones((len(texts), 256), np.float32)


class BrokenModel(OtherModel):
    async def embed(self, texts: list[str]) -> np.ndarray:
        return np.full((len(texts), 256), np.nan, np.float32)


async def test_a_query_in_another_profile_is_refused_not_compared(semantic: Store, url: str) -> None:
    await say(semantic, "a", "the flight to Beijing")
    await semantic.embeddings.backfill()
    async with Store.from_url(url, embedder=OtherModel()) as other:
        with pytest.raises(EmbeddingProfileError, match="wordllama"):
            await other.search("plane", user_id="u", ranking="hybrid")
        assert [h.seq for h in (await other.search("flight", user_id="u", ranking="keyword")).items] == [0]
    async with Store.from_url(url, embedder=BrokenModel()) as broken:
        with pytest.raises(InvalidValueError, match="finite"):
            await broken.embeddings.backfill()
    assert await vector_count(semantic) == 1  # nothing of theirs was written


async def test_without_an_embedder_search_is_keyword_search(store: Store) -> None:
    await say(store, "a", "the flight to Beijing")
    assert [h.seq for h in (await store.search("flight", user_id="u")).items] == [0]
    assert (await store.search("flight", user_id="u")).items[0].similarity is None
    with pytest.raises(ConfigurationError, match="no embedder"):
        await store.search("flight", user_id="u", ranking="hybrid")


@pytest.mark.parametrize("bad", [{"ranking": "semantic"}, {"ranking": "hybrid", "cursor": "x"},
                                 {"ranking": "hybrid", "limit": 1000}])  # fmt: skip
async def test_bad_search_options_are_typed_errors(semantic: Store, bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidValueError):
        await semantic.search("flight", user_id="u", **bad)


async def test_bad_embedders_and_a_cipher_are_refused(url: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="wordllama"):
        Store.from_url(url, embedder="bert")
    with pytest.raises(ConfigurationError, match="embed"):
        Store.from_url(url, embedder=object())

    class Reversing:
        def encrypt(self, value: str) -> str:
            return value[::-1]

        def decrypt(self, value: str) -> str:
            return value[::-1]

    async with Store.from_url(url, embedder=EMBEDDER, message_cipher=Reversing()) as ciphered:
        with pytest.raises(ConfigurationError, match="cipher"):
            await ciphered.embeddings.backfill()


def test_four_bit_vectors_keep_their_direction() -> None:
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((200, 256)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    blobs = pack(vectors)
    assert {len(b) for b in blobs} == {128}
    back = unpack(blobs, 256)
    assert float(np.min(np.sum(back * vectors, axis=1))) > 0.97  # cosine to the original
    assert np.allclose(unpack(pack(np.zeros((1, 256), np.float32)), 256), 0)


async def test_messages_written_by_a_run_are_embedded_by_the_pass_not_the_commit(semantic: Store) -> None:
    async with semantic.session("a", user_id="u") as session:
        session.state["in_memory"]["messages"].append(Message(role="user", contents=["hello"]))
    assert await vector_count(semantic) == 0  # the commit embeds nothing
    assert await semantic.embeddings.backfill() == 1


async def test_the_agents_search_tool_ranks_by_meaning_with_embeddings(semantic: Store) -> None:
    from agent_framework import Agent

    from agent_store.agent_framework import SearchHistoryProvider
    from agent_store.offline import OfflineChatClient

    await say(semantic, "last-week", "I booked a flight to Paris for Friday")
    await say(semantic, "stranger", "airplane tickets to Rome", user_id="someone-else")
    await semantic.embeddings.backfill()
    agent = Agent(client=OfflineChatClient(), name="Bot",
                  context_providers=[SearchHistoryProvider(embeddings=semantic.embeddings)])  # fmt: skip
    async with semantic.session("today", user_id="u") as session:
        reply = await agent.run("search airplane ticket", session=session)
    assert "[last-week]" in reply.text and "Paris" in reply.text and "Rome" not in reply.text
    words_only = Agent(client=OfflineChatClient(), name="Bot", context_providers=[SearchHistoryProvider()])
    async with semantic.session("today", user_id="u") as session:
        assert "no earlier message matches" in (await words_only.run("search airplane ticket", session=session)).text


async def test_the_cli_embeds_then_searches_by_meaning(semantic: Store, url: str, tmp_path: Path) -> None:
    from cli_support import cli, ok

    await say(semantic, "trip", "I booked a flight to Paris for Friday", "Buy milk")
    assert "embedded 2 messages (0 without a vector left)" in ok(cli("embed", url=url, cwd=tmp_path))
    found = ok(cli("search", "airplane ticket", "--user", "u", "--ranking", "hybrid", "--json", url=url, cwd=tmp_path))
    assert '"seq": 0' in found.split('"seq": 1')[0]  # the flight first
    words = cli("search", "airplane ticket", "--user", "u", "--ranking", "keyword", url=url, cwd=tmp_path)
    assert words.returncode == 0 and "Paris" not in words.stdout and "--ranking hybrid" in words.stderr  # a hint
    assert "Paris" in ok(cli("search", "airplane ticket", "--user", "u", url=url, cwd=tmp_path))  # auto: by meaning


async def test_a_backfill_killed_midway_resumes_and_writes_each_vector_once(semantic: Store, url: str,
                                                                             tmp_path: Path) -> None:  # fmt: skip
    import os
    import signal
    import subprocess
    import sys

    texts = [f"message {i}: {'flights hotels trains cats dogs'.split()[i % 5]} and more" for i in range(3000)]
    await say(semantic, "long", *texts)
    env = {**os.environ, "AGENT_STORE_URL": url}
    slow = subprocess.Popen([sys.executable, "-m", "agent_store", "embed", "--batch-size", "1"], env=env, cwd=tmp_path,  # noqa: ASYNC220
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip

    async def two_hundred_written() -> bool:  # (or the process has ended: the assertion below says so)
        return slow.poll() is not None or await vector_count(semantic) >= 200

    try:
        await until(two_hundred_written, "the embed process's first 200 vectors")
        slow.send_signal(signal.SIGKILL)  # no clean-up of any kind
    finally:
        slow.wait(30)
    killed_at = await vector_count(semantic)
    assert 200 <= killed_at < len(texts), "the kill came too late to test a resume"
    assert await semantic.embeddings.backfill(batch_size=500) == len(texts) - killed_at
    assert await semantic.embeddings.pending() == 0 and await vector_count(semantic) == len(texts)
    async with semantic.engine.connect() as conn:
        stored = (await conn.execute(text("SELECT seq, vec FROM agent_message_vectors ORDER BY seq"))).all()
    assert [bytes(row.vec) for row in stored] == pack(await EMBEDDER.embed(texts))  # each the vector of its own text


async def test_the_browser_searches_by_meaning_with_an_embedder(semantic: Store, store: Store) -> None:
    import httpx

    from agent_store.browser.app import create_app

    await say(semantic, "trip", "I booked a flight to Paris for Friday", "Buy milk")
    await semantic.embeddings.backfill()
    for opened, meaning in ((semantic, True), (store, False)):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(opened)), base_url="http://127.0.0.1",
                                     headers={"host": "127.0.0.1"}) as web:  # fmt: skip
            page = await web.get("/search", params={"user": "u", "q": "airplane ticket"})
            assert page.status_code == 200
            assert ("Paris" in page.text) is meaning and ('id="ranking"' in page.text) is meaning
            assert (await web.get("/search", params={"user": "u", "q": "x", "ranking": "nope"})).status_code == 400


async def test_the_frameworks_openai_embedding_client_is_an_embedder(url: str, store: Store) -> None:
    """FrameworkEmbedder over the framework's real OpenAIEmbeddingClient, pointed at the tests' own server."""
    from agent_framework_openai import OpenAIEmbeddingClient
    from fake_openai import FakeOpenAI

    from agent_store.search.embedders import FrameworkEmbedder

    server = FakeOpenAI().start()
    try:
        client = OpenAIEmbeddingClient(model="text-embedding-test", api_key="k", base_url=server.base_url)
        embedder = FrameworkEmbedder(client, model="text-embedding-test", dimensions=256)
        await say(store, "trip", "I booked a flight to Paris for Friday", "Buy milk", "My dog is sick")
        async with Store.from_url(url, embedder=embedder) as remote:
            assert await remote.embeddings.backfill() == 3
            found = await keys(remote, "airplane ticket", "hybrid")
        assert found[0] == ("trip", 0)
        assert [r["path"] for r in server.requests] == ["/v1/embeddings"] * 2  # one batch, then the query
    finally:
        server.stop()
    with pytest.raises(ConfigurationError, match="get_embeddings"):
        FrameworkEmbedder(object(), model="m", dimensions=3)
