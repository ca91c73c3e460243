"""Issue 40, point 5: the framework's own VectorStoreHistoryProvider on agent_store (StoreVectorStore), its records
the store's messages (no copy of the history), on both backends, with the real Agent."""

from __future__ import annotations

import pytest
from agent_framework import Agent, AgentSession, Message
from agent_framework._vector_filters import Filter, FilterGroup
from agent_framework._vectors import VectorStoreCollectionDefinition, VectorStoreField, VectorStoreHistoryProvider
from agent_framework.exceptions import IntegrationException
from helpers import rows
from sqlalchemy import text

from agent_store import ConfigurationError, InvalidValueError, NotEmbeddedError, SessionNotFoundError, Store
from agent_store.agent_framework import StoreHistoryProvider
from agent_store.agent_framework.vector_history import StoreVectorStore
from agent_store.offline import OfflineChatClient

pytestmark = pytest.mark.filterwarnings("ignore::agent_framework._feature_stage.ExperimentalWarning")


def provider(store: Store, user: str = "alice", **options: object) -> VectorStoreHistoryProvider:
    return VectorStoreHistoryProvider(StoreVectorStore(store, user_id=user), application_id="app", **options)  # type: ignore[arg-type]


def agent(store: Store, user: str = "alice", **options: object) -> Agent:
    return Agent(client=OfflineChatClient(), name="Bot", context_providers=[provider(store, user, **options)])


async def stored(store: Store, session_id: str) -> list[tuple[object, ...]]:
    return await rows(store, "SELECT role, text FROM agent_messages WHERE session_id = :s ORDER BY seq", s=session_id)


async def test_the_framework_provider_remembers_across_restarts_in_the_store_s_own_rows(store: Store, url: str) -> None:
    await agent(store).run("我叫李明", session=AgentSession(session_id="v1"))
    async with Store.from_url(url) as again:  # another process, later
        reply = await agent(again).run("我叫什么名字？", session=AgentSession(session_id="v1"))
    assert reply.text == "你叫李明。"
    # The records are the store's messages, readable with plain SQL, once each: no copy anywhere.
    assert await stored(store, "v1") == [("user", "我叫李明"), ("assistant", "你好，李明！很高兴认识你。"),
                                         ("user", "我叫什么名字？"), ("assistant", "你叫李明。")]  # fmt: skip
    assert await rows(store, "SELECT user_id FROM agent_sessions WHERE id = 'v1'") == [("alice",)]
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(4,)]
    # And the store's own seams read the same history.
    assert [m.text for m in (await store.load("v1", user_id="alice")).history][-1] == "你叫李明。"


async def test_a_retried_save_stores_nothing_twice_and_keeps_the_order(store: Store) -> None:
    history = provider(store)
    said = [Message("user", [f"第{n}句"]) for n in range(5)]
    await history.save_messages("v2", said)
    await history.save_messages("v2", said)  # a retry: the same ids
    assert [text for _, text in await stored(store, "v2")] == [f"第{n}句" for n in range(5)]
    assert [m.text for m in await history.get_messages("v2")] == [f"第{n}句" for n in range(5)]
    assert [m.message_id for m in await history.get_messages("v2")] == [m.message_id for m in said]


async def test_another_user_reads_nothing_and_writes_nothing(store: Store) -> None:
    await provider(store).save_messages("v3", [Message("user", ["alice's secret"])])
    assert await provider(store, "bob").get_messages("v3") == []
    with pytest.raises(IntegrationException) as refused:
        await provider(store, "bob").save_messages("v3", [Message("user", ["bob was here"])])
    assert isinstance(refused.value.__cause__, SessionNotFoundError)
    assert await stored(store, "v3") == [("user", "alice's secret")]
    keys = [r["id"] for r in await provider(store)._collection.get(filter=provider(store)._scope_filter("v3"))]
    assert len(keys) == 1 and await provider(store, "bob")._collection.get(keys) == []


async def test_scopes_and_collections_stay_apart_in_one_session(store: Store) -> None:
    await provider(store).save_messages("v4", [Message("user", ["from the app"])])
    await provider(store, source_id="other").save_messages("v4", [Message("user", ["from another source"])])
    named = provider(store, collection_name="history_msgpack_v1", contents_format="msgpack")
    await named.save_messages("v4", [Message("user", ["packed"])])
    await StoreHistoryProvider(store, user_id="alice").save_messages("v4", [Message("user", ["the store's own"])])
    assert [m.text for m in await provider(store).get_messages("v4")] == ["from the app"]
    assert [m.text for m in await provider(store, source_id="other").get_messages("v4")] == ["from another source"]
    assert [m.text for m in await named.get_messages("v4")] == ["packed"]
    assert len(await stored(store, "v4")) == 4
    names = await StoreVectorStore(store, user_id="alice").list_collection_names()
    assert names == sorted(["history_msgpack_v1", provider(store).collection_name])


async def test_a_changed_message_under_a_stored_id_is_refused_and_nothing_is_written(store: Store) -> None:
    history = provider(store)
    first = Message("user", ["the original"], message_id="m-1")
    await history.save_messages("v5", [first])
    with pytest.raises(InvalidValueError, match="another record"):
        await history.save_messages("v5", [Message("user", ["a rewrite"], message_id="m-1"),
                                           Message("user", ["new, in the same batch"])])  # fmt: skip
    assert await stored(store, "v5") == [("user", "the original")]


async def test_clear_deletes_the_session_s_records_but_never_a_message_it_did_not_name(store: Store) -> None:
    history = provider(store)
    await history.save_messages("v6", [Message("user", ["one"]), Message("assistant", ["two"])])
    await history.clear("v6")
    assert await stored(store, "v6") == [] and await history.get_messages("v6") == []
    await history.save_messages("v6", [Message("user", ["three"])])
    await StoreHistoryProvider(store, user_id="alice").save_messages("v6", [Message("user", ["not a record"])])
    with pytest.raises(IntegrationException) as refused:
        await history.clear("v6")
    assert isinstance(refused.value.__cause__, InvalidValueError) and "other messages" in str(refused.value)
    assert await stored(store, "v6") == [("user", "three"), ("user", "not a record")]


async def test_the_provider_s_own_vectors_and_search_tool_work_on_the_store(store: Store, url: str) -> None:
    """The provider embeds with the framework's real OpenAI embedding client (the tests' own server); its vectors
    are kept beside the messages in a profile of their own, and its search tool finds by meaning."""
    from agent_framework_openai import OpenAIEmbeddingClient
    from fake_openai import FakeOpenAI

    server = FakeOpenAI().start()
    try:
        client = OpenAIEmbeddingClient(model="text-embedding-test", api_key="k", base_url=server.base_url)
        options = {"collection_name": "hist", "embedding_generator": client, "include_search_tool": True,
                   "embedding_options": {"dimensions": 256}}  # fmt: skip
        history = provider(store, **options)
        said = [Message("user", [t]) for t in ("I booked a flight to Paris for Friday", "Buy milk", "My dog is sick")]
        await history.save_messages("v8", said)
        await history.save_messages("v8", said)  # a retry: nothing twice, no second vector
        profiles = "SELECT p.name, count(*) FROM agent_message_vectors v JOIN agent_embedding_profiles p ON p.id = "
        named = [("agent-framework:hist/256/given/q4", 3)]
        assert await rows(store, profiles + "v.profile_id GROUP BY p.name") == named
        found = await history._create_search_tool("v8").invoke(arguments={"query": "airplane ticket"})
        assert [c.text for c in found][:1] == ["[user] I booked a flight to Paris for Friday"] and len(found) == 3
        scope = history._scope_filter("v8")
        scored = [(h["record"]["message"], h["score"]) async for h in
                  (await history._collection.search("my pet is unwell", filter=scope, top=3)).results]  # fmt: skip
        assert scored[0][0] == said[2].to_json() and [s for _, s in scored] == sorted([s for _, s in scored])[::-1]
        best = await history._collection.search("my pet is unwell", filter=scope, score_threshold=scored[0][1])
        assert [h["record"]["id"] async for h in best.results] == [scored_id(scored[0][0], history)]
        hits = await provider(store, "bob", **options)._collection.search("my pet is unwell", filter=scope)
        assert [h async for h in hits.results] == []  # alice's session, searched by bob: nothing
        # A rewritten text loses its vector (the store's trigger): a vector never outlives the text it was made of.
        async with store.engine.begin() as conn:
            await conn.execute(text("UPDATE agent_messages SET text = 'Buy oat milk' WHERE seq = 1"))
        await history.save_messages("v8", [Message("user", ["The vet said rest"])])
        assert await rows(store, "SELECT seq FROM agent_message_vectors ORDER BY seq") == [(0,), (2,), (3,)]
        (first,) = await history._collection.get([scored_id(said[0].to_json(), history)])
        for wrong in ([float("nan")] * 256, [1e39] * 256, [0.1] * 255, "not a vector"):
            with pytest.raises(ValueError, match=r"finite numbers|dimensions"):  # the framework checks lengths first
                await history._collection.upsert([{**first, "id": "k-6", "embedding": wrong}], generate_vectors=False)
        assert len(await stored(store, "v8")) == 4  # nothing of a refused batch
        for query in ([float("nan")] * 256, [0.0] * 256):
            with pytest.raises(InvalidValueError, match=r"finite|zeros"):
                await history._collection.search(vector=query, filter=scope)
        # The store's own embedder meets these vectors: never compared with them, nor taken for its own.
        async with Store.from_url(url, embedder="wordllama") as semantic:
            with pytest.raises(NotEmbeddedError):
                await semantic.search("airplane ticket", user_id="alice", ranking="vector")
            assert await semantic.embeddings.backfill() == 4
            hits = (await semantic.search("airplane ticket", user_id="alice", ranking="vector")).items
            assert hits[0].seq == 0 and len(hits) == 4
        with pytest.raises(ConfigurationError, match="keys or a message_cipher"):
            async with Store.from_url(url, message_cipher=Reversing()) as ciphered:
                provider(ciphered, **options)
    finally:
        server.stop()


def scored_id(message_json: str, history: VectorStoreHistoryProvider) -> str:
    return history._record_id("v8", Message.from_json(message_json).message_id or "")


class Reversing:
    def encrypt(self, value: str) -> str:
        return value[::-1]

    def decrypt(self, value: str) -> str:
        return value[::-1]


async def test_what_it_cannot_do_is_refused_by_name(store: Store) -> None:
    with pytest.raises(ConfigurationError, match="history records"):
        StoreVectorStore(store, user_id="alice").get_collection(dict, collection_name="c", definition=(
            VectorStoreCollectionDefinition([VectorStoreField("key", name="id", type_="str"),
                                             VectorStoreField("vector", name="embedding", type_="float", dimensions=4)])
        ))  # fmt: skip
    with pytest.raises(ConfigurationError, match="history records"):
        StoreVectorStore(store, user_id="alice").get_collection(dict, collection_name="c", definition=(
            VectorStoreCollectionDefinition([VectorStoreField("key", name="id", type_="str"),
                                             VectorStoreField("data", name="title", type_="str")])
        ))  # fmt: skip
    collection = provider(store)._collection
    with pytest.raises(NotImplementedError, match="session_id"):
        await collection.get(filter=Filter("application_id", "eq", "app"))
    with pytest.raises(NotImplementedError, match="starts_with"):
        await collection.get(filter=FilterGroup("and", [Filter("session_id", "eq", "v7"),
                                                        Filter("agent_id", "starts_with", "a")]))  # fmt: skip
    with pytest.raises(InvalidValueError):
        StoreVectorStore(store, user_id="")
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(0,)]


async def test_a_fork_s_copies_are_not_records_and_clearing_the_fork_leaves_the_original(store: Store) -> None:
    """The outside review's A: a fork copies messages with their ids; clearing it deleted the original's."""
    history = provider(store)
    await history.save_messages("v9", [Message("user", ["one"]), Message("assistant", ["two"])])
    await store.fork("v9", user_id="alice", new_id="v9-fork")
    assert await history.get_messages("v9-fork") == []  # their keys name v9: not the fork's records
    await history.clear("v9-fork")
    assert [t for _, t in await stored(store, "v9")] == ["one", "two"]
    assert [t for _, t in await stored(store, "v9-fork")] == ["one", "two"]
    keys = [r["id"] for r in await history._collection.get(filter=history._scope_filter("v9"))]
    assert len(await history._collection.get(keys)) == 2  # once each, not once a session


async def test_a_key_taken_in_its_session_is_refused_not_skipped(store: Store) -> None:
    """The outside review's B and D: a second collection's record, or a store message, under a key taken in its
    session; one key twice in a batch as two records; another scope under a stored key."""
    said = Message("user", ["shared"], message_id="m-2")
    await provider(store).save_messages("v10", [said])
    other = provider(store, collection_name="other_v1")
    with pytest.raises(InvalidValueError, match="not a record of collection 'other_v1'"):
        await other.save_messages("v10", [Message("user", ["shared"], message_id="m-2")])
    collection, scope = provider(store)._collection, provider(store)._scope_filter("v10")
    (first,) = await collection.get(filter=scope)
    with pytest.raises(InvalidValueError, match="given twice"):
        changed = Message("user", ["x"]).to_json()
        await collection.upsert([{**first, "id": "k-3"}, {**first, "id": "k-3", "message": changed}])
    with pytest.raises(InvalidValueError, match="stored as another record"):
        await collection.upsert([{**first, "source_id": "elsewhere"}])
    mine = Message("user", ["the store's own"], message_id="x-1")
    await StoreHistoryProvider(store, user_id="alice").save_messages("v10", [mine])
    (own,) = [r for _, r in await rows(store, "SELECT seq, message_id FROM agent_messages WHERE seq = 1")]
    with pytest.raises(InvalidValueError, match="not a record"):
        await collection.upsert([{**first, "id": own}])
    assert [t for _, t in await stored(store, "v10")] == ["shared", "the store's own"]


async def test_a_save_after_erasure_of_what_was_read_before_it_is_refused(store: Store) -> None:
    """The outside review's C: the erasure fence dates a save from this process's first read of its session."""
    import asyncio

    history = provider(store)
    await history.save_messages("v11", [Message("user", ["before"])])
    assert [m.text for m in await history.get_messages("v11")] == ["before"]  # the run's read
    await store.erase_user("alice")
    await asyncio.sleep(1.2)  # a slow model call: past the fence's margin
    with pytest.raises(IntegrationException):
        await history.save_messages("v11", [Message("user", ["before"]), Message("assistant", ["after"])])
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(0,)]


async def test_hostile_records_are_typed_errors_and_round_trips_are_exact(store: Store) -> None:
    """The outside review's E, F and G."""
    history = provider(store)
    collection = history._collection
    good = Message("user", ["hello"], message_id="m-4", additional_properties={"agent_store_id": "mine"})
    await history.save_messages("v12", [good])
    (record,) = await collection.get(filter=history._scope_filter("v12"))
    assert record["contents"] == history._serialize_contents(good)  # the provider's own encoding
    assert Message.from_json(record["message"]).additional_properties == {"agent_store_id": "mine"}
    await history.save_messages("v12", [good])  # a retry of a message carrying its own store id: nothing twice
    role5 = Message("user", ["x"]).to_json().replace('"user"', "5")
    for change in ({"message": "[1, 2]"}, {"message": "null"}, {"id": "~x"}, {"created_at": 2**70},
                   {"message": role5}, {"contents": None}):  # fmt: skip
        with pytest.raises((InvalidValueError, TypeError)):
            await collection.upsert([{**record, "id": "k-5", **change}])
    assert len(await stored(store, "v12")) == 1
    with pytest.raises(TypeError, match="boolean"):
        await collection.get(filter=history._scope_filter("v12"), order_by={"created_at": 1})
    await StoreHistoryProvider(store, user_id="alice").save_messages(
        "v12", [Message("user", ["spoof"], additional_properties={"agent_store_record": {"foo": 1}})])
    assert await StoreVectorStore(store, user_id="alice").list_collection_names() == [history.collection_name]
    assert len(await stored(store, "v12")) == 2
