"""StoreResponseProvider against ResponseProviderProtocol's docstrings (azure-ai-agentserver-responses), on both
backends: envelopes, items stored once, history through the chain and the conversation, partitions by user,
many writers, erasure, bad input."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from azure.ai.agentserver.responses import PlatformContext, ResponseProviderProtocol
from azure.ai.agentserver.responses.store import ResponseAlreadyExistsError
from helpers import lock_waits, rows, until

from agent_store import InvalidValueError, Store
from agent_store.agentserver.history import MAX_HOPS
from agent_store.agentserver.responses import StoreResponseProvider

ALICE, BOB = PlatformContext(user_id_key="alice"), PlatformContext(user_id_key="bob")


def response(rid: str, *, output: list[str] = (), status: str = "completed", conversation: str | None = None,
             previous: str | None = None) -> dict[str, Any]:  # fmt: skip
    body: dict[str, Any] = {"id": rid, "object": "response", "status": status, "store": True,
                            "output": [said(i, f"answer {i}") for i in output]}  # fmt: skip
    if conversation is not None:
        body["conversation"] = {"id": conversation}
    if previous is not None:
        body["previous_response_id"] = previous
    return body


def said(item_id: str, text: str = "hello", role: str = "assistant") -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"id": item_id, "type": "message", "role": role, "content": [{"type": kind, "text": text}]}


@pytest.fixture
async def provider(store: Store) -> StoreResponseProvider:
    return StoreResponseProvider(store)


async def turn(p: StoreResponseProvider, rid: str, previous: str | None, *, conversation: str | None = None,
               context: PlatformContext | None = None, limit: int = 100) -> list[str]:  # fmt: skip
    """One turn as the server makes it: the history it reads, then the response with an input and an output."""
    history = await p.get_history_item_ids(previous, conversation, limit, context=context)
    await p.create_response(response(rid, output=[f"{rid}-out"], conversation=conversation, previous=previous),
                            [said(f"{rid}-in", role="user")], history, context=context)  # fmt: skip
    return history


async def test_it_is_the_protocol_and_round_trips_a_response(provider: StoreResponseProvider) -> None:
    assert isinstance(provider, ResponseProviderProtocol)
    await provider.create_response(response("r1", output=["o1", "o2"], status="in_progress"), [said("i1")], None)
    got = await provider.get_response("r1")
    assert got["status"] == "in_progress" and [o["id"] for o in got["output"]] == ["o1", "o2"]
    got["status"] = "mutated"  # a copy: the store is not changed through it
    assert (await provider.get_response("r1"))["status"] == "in_progress"
    with pytest.raises(ResponseAlreadyExistsError) as raised:
        await provider.create_response(response("r1"), None, None)
    assert raised.value.response_id == "r1"
    await provider.update_response(response("r1", output=["o2", "o3"], status="completed"))
    got = await provider.get_response("r1")
    assert got["status"] == "completed" and [o["id"] for o in got["output"]] == ["o2", "o3"]
    assert [i and i["id"] for i in await provider.get_items(["o3", "nope", "i1", "o1"])] == ["o3", None, "i1", "o1"]


async def test_missing_and_deleted_are_key_errors_and_input_items_value_errors(provider: StoreResponseProvider) -> None:
    for call in (provider.get_response("nope"), provider.delete_response("nope"),
                 provider.update_response(response("nope")), provider.get_input_items("nope"),
                 provider.get_response("x" * 1000)):  # fmt: skip
        with pytest.raises(KeyError):
            await call
    await provider.create_response(response("r1"), [said("i1")], None)
    await provider.delete_response("r1")
    with pytest.raises(KeyError):
        await provider.get_response("r1")
    with pytest.raises(KeyError):
        await provider.delete_response("r1")
    with pytest.raises(KeyError):
        await provider.update_response(response("r1"))
    with pytest.raises(ValueError, match="deleted"):
        await provider.get_input_items("r1")
    assert (await provider.get_items(["i1"]))[0]["id"] == "i1"  # items stay: later histories hold them
    await provider.create_response(response("r1", status="again"), None, None)  # created again after a delete
    assert (await provider.get_response("r1"))["status"] == "again"


async def test_input_items_page_history_then_input(provider: StoreResponseProvider) -> None:
    await provider.create_response(response("r0"), [said("h0"), said("h1")], None)
    await provider.create_response(response("r1"), [said(f"i{n}") for n in range(4)], ["h0", "h1"])

    async def ids(**kwargs: Any) -> list[str]:
        return [i["id"] for i in await provider.get_input_items("r1", **kwargs)]

    assert await ids() == ["i3", "i2", "i1", "i0", "h1", "h0"]
    assert await ids(ascending=True, limit=3) == ["h0", "h1", "i0"]
    assert await ids(ascending=True, after="h1", before="i3") == ["i0", "i1", "i2"]
    assert await ids(after="h0") == [] and await ids(limit=0) == ["i3"] and len(await ids(limit=500)) == 6
    assert await ids(after="unknown", limit=1) == ["i3"]


async def test_history_follows_the_chain_and_the_conversation(provider: StoreResponseProvider) -> None:
    assert await turn(provider, "a1", None) == []
    assert await turn(provider, "a2", "a1") == ["a1-in", "a1-out"]
    assert await turn(provider, "a3", "a2") == ["a1-in", "a1-out", "a2-in", "a2-out"]
    branch = await turn(provider, "b2", "a1")  # a branch from a1 sees a1, not a2
    assert branch == ["a1-in", "a1-out"]
    assert await provider.get_history_item_ids("b2", None, -1) == ["a1-in", "a1-out", "b2-in", "b2-out"]
    assert await provider.get_history_item_ids("a3", None, 3) == ["a2-out", "a3-in", "a3-out"]
    assert await provider.get_history_item_ids("a3", None, 0) == [] and await provider.get_history_item_ids(
        None, None, 10) == []  # fmt: skip
    for n in range(3):
        await turn(provider, f"c{n}", None, conversation="conv")
    assert await provider.get_history_item_ids(None, "conv", -1) == [f"c{n}-{k}" for n in range(3) for k in ("in",
                                                                                                            "out")]
    both = await provider.get_history_item_ids("a2", "conv", -1)  # the chain's first, then the conversation's
    assert both == ["a1-in", "a1-out", "a2-in", "a2-out"] + [f"c{n}-{k}" for n in range(3) for k in ("in", "out")]
    await provider.delete_response("c2")  # (as the package's own stores: c2's history still names c1's items)
    assert await provider.get_history_item_ids(None, "conv", -1) == ["c0-in", "c0-out", "c1-in", "c1-out"]
    await provider.delete_response("a2")
    assert await provider.get_history_item_ids("a2", None, -1) == []  # a deleted response has no history
    assert await provider.get_history_item_ids("a3", None, -1) == ["a1-in", "a1-out", "a2-in", "a2-out", "a3-in",
                                                                    "a3-out"]  # fmt: skip  # but a3 still does


async def test_a_chain_stores_each_item_once_and_no_history_rows(provider: StoreResponseProvider, store: Store) -> None:
    """50 chained turns with the server's window of 20: two item links per response, each item once, and a window
    of history rows only every MAX_HOPS responses (a reading follows at most MAX_HOPS pointers)."""
    previous = None
    for n in range(50):
        history = await turn(provider, f"r{n}", previous, limit=20)
        assert len(history) == min(2 * n, 20)
        previous = f"r{n}"
    assert await rows(store, "SELECT kind, count(*) FROM agent_hosted_links GROUP BY kind ORDER BY kind") == [
        ("h", 20 * (49 // MAX_HOPS)), ("i", 50), ("o", 50)]  # fmt: skip
    assert await rows(store, "SELECT count(*) FROM agent_hosted_items") == [(100,)]
    assert await provider.get_history_item_ids("r49", None, 4) == ["r48-in", "r48-out", "r49-in", "r49-out"]
    listed = await provider.get_input_items("r49", limit=100, ascending=True)
    assert [i["id"] for i in listed] == [f"r{n}-{k}" for n in range(39, 49) for k in ("in", "out")] + ["r49-in"]


async def test_a_history_never_changes_when_what_it_points_at_does(provider: StoreResponseProvider) -> None:
    """A later response points at r1's list; r1's output changes, r1 is deleted and created again: r2 still
    reads what it was created with."""
    await turn(provider, "r1", None)
    await turn(provider, "r2", "r1")
    before = [i["id"] for i in await provider.get_input_items("r2", ascending=True)]
    assert before == ["r1-in", "r1-out", "r2-in"]
    await provider.update_response(response("r1", output=["other"]))
    await provider.delete_response("r1")
    await provider.create_response(response("r1", output=["new"]), [said("new-in")], None)
    assert [i["id"] for i in await provider.get_input_items("r2", ascending=True)] == before
    assert await provider.get_history_item_ids("r2", None, -1) == ["r1-in", "r1-out", "r2-in", "r2-out"]


async def test_partitions_never_meet(provider: StoreResponseProvider) -> None:
    """Alice's, Bob's and the unscoped partition (no context): none reads, lists or deletes another's responses,
    items or history; one id in two partitions is two responses; a user id sent empty is refused."""
    await turn(provider, "secret", None, context=ALICE)
    await turn(provider, "local", None)
    for context in (BOB, None):
        with pytest.raises(KeyError):
            await provider.get_response("secret", context=context)
        with pytest.raises(KeyError):
            await provider.delete_response("secret", context=context)
        with pytest.raises(KeyError):
            await provider.get_input_items("secret", context=context)
        assert await provider.get_history_item_ids("secret", None, -1, context=context) == []
        assert await provider.get_items(["secret-in", "secret-out"], context=context) == [None, None]
    with pytest.raises(KeyError):
        await provider.get_response("local", context=ALICE)
    assert await provider.get_items(["local-in"], context=ALICE) == [None]
    await turn(provider, "same", None, context=ALICE)
    await turn(provider, "same", None, context=BOB)
    await provider.delete_response("same", context=BOB)
    assert (await provider.get_response("same", context=ALICE))["id"] == "same"
    assert await provider.get_history_item_ids("secret", None, -1, context=ALICE) == ["secret-in", "secret-out"]
    with pytest.raises(InvalidValueError, match="empty"):
        await provider.get_response("secret", context=PlatformContext(user_id_key=""))


async def test_erase_user_takes_their_responses_only(provider: StoreResponseProvider, store: Store) -> None:
    await turn(provider, "r1", None, context=ALICE)
    await turn(provider, "r2", "r1", context=ALICE)
    await turn(provider, "r1", None, context=BOB)
    report = await store.erase_user("alice")
    assert report.hosted_responses == 2
    assert await rows(store, "SELECT user_id FROM agent_hosted_items UNION SELECT user_id FROM agent_hosted_links "
                             "UNION SELECT user_id FROM agent_hosted_responses") == [("bob",)]  # fmt: skip
    with pytest.raises(KeyError):
        await provider.get_response("r2", context=ALICE)
    assert (await provider.get_response("r1", context=BOB))["id"] == "r1"


async def test_many_writers_one_create_wins(url: str) -> None:
    """Eight Store objects (eight workers, each its own connections) create the same response id at once: one
    succeeds, seven are told it exists, and one response with its items is stored."""

    async def worker(n: int) -> str:
        async with Store.from_url(url) as store:
            try:
                await StoreResponseProvider(store).create_response(
                    response("same", output=[f"o{n}"]), [said(f"i{n}")], None, context=ALICE)
            except ResponseAlreadyExistsError:
                return "exists"
            return "created"

    async with Store.from_url(url) as store:
        await store.migrate()
        outcomes = await asyncio.gather(*(worker(n) for n in range(8)))
        assert sorted(outcomes) == ["created"] + ["exists"] * 7
        assert await rows(store, "SELECT count(*) FROM agent_hosted_responses") == [(1,)]
        assert await rows(store, "SELECT count(*) FROM agent_hosted_links") == [(2,)]


async def test_bad_input_is_a_typed_error_and_writes_nothing(provider: StoreResponseProvider, store: Store) -> None:
    with pytest.raises(InvalidValueError, match="response 'r1'"):
        await provider.create_response({**response("r1"), "metadata": {"when": object()}}, None, None)
    with pytest.raises(InvalidValueError, match="item"):
        await provider.create_response(response("r1"), [said("i1", "nul \x00 char")], None)
    with pytest.raises(InvalidValueError, match="response id"):
        await provider.create_response(response(""), None, None)
    with pytest.raises(InvalidValueError, match="a mapping"):
        await provider.create_response(["not", "a", "response"], None, None)
    assert await rows(store, "SELECT count(*) FROM agent_hosted_responses") == [(0,)]
    assert await rows(store, "SELECT count(*) FROM agent_hosted_items") == [(0,)]


async def test_a_response_created_while_its_parent_changes_keeps_what_it_was_given(
    provider: StoreResponseProvider, store: Store
) -> None:
    """The parent's output changes in a transaction still open (update_response's) while a child is created from
    its old list: the child waits for it (PostgreSQL: a share lock on the parent; SQLite: the writer's lock), so it
    never points at a list that is not the one it was given."""
    from sqlalchemy import text

    await turn(provider, "p", None)
    given = await provider.get_history_item_ids("p", None, -1)
    async with store.engine.connect() as other:
        await other.begin()
        if other.dialect.name == "postgresql":
            await other.execute(text("SELECT 1 FROM agent_hosted_responses WHERE response_id = 'p' FOR UPDATE"))
        await other.execute(text("UPDATE agent_hosted_links SET item_id = 'changed' WHERE response_id = 'p' AND "
                                 "kind = 'o'"))  # fmt: skip
        async with lock_waits(store) as waiting:
            child = asyncio.create_task(provider.create_response(response("c", previous="p"), [said("c-in")], given))
            await until(lambda: child.done() or waiting(), "the child to wait for the parent's transaction")
            assert not child.done()  # it waits for the parent's transaction
        await other.commit()
    await child
    assert await provider.get_history_item_ids("c", None, -1) == [*given, "c-in"]
