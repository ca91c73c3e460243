"""What an outside review of served conversations broke (issue 38, eighteenth session), on both backends: a
conversation's first response id is also its session's id, and must keep naming its point, or nothing, after a
cut or a delete; a branch's own id names its head; a run that began from no history never lands on another's;
two requests starting one conversation: the second conflicts having written nothing."""

from __future__ import annotations

import asyncio

import pytest
from agent_framework import AgentSession, Message
from helpers import rows, until

from agent_store import Store
from agent_store.agent_framework import StoreSessionStore
from agent_store.agentserver.foundry import ConversationSessionStore


def said(session: AgentSession, text: str) -> AgentSession:
    session.state.setdefault("in_memory", {}).setdefault("messages", []).append(Message(role="user", contents=[text]))
    return session


def texts(session: AgentSession | None) -> list[str] | None:
    return None if session is None else [m.text for m in session.state["in_memory"]["messages"]]


async def _chain(store: Store) -> StoreSessionStore:
    """first (two messages) -> second -> third (one each): first is also the conversation's session id."""
    sessions = StoreSessionStore(store, user_id="u")
    await sessions.set("first", said(said(AgentSession(session_id="first"), "a0"), "a0b"))
    for key, parent, text in (("second", "first", "a1"), ("third", "second", "a2")):
        session = await sessions.get(parent)
        assert session is not None
        await sessions.set(key, said(session, text))
    return sessions


@pytest.mark.parametrize("cut", ["truncate", "clear"])
async def test_a_first_response_id_cut_away_names_nothing_never_the_head(store: Store, cut: str) -> None:
    sessions = await _chain(store)
    await store.truncate("first", 2, user_id="u")  # keeps a0, a0b, a1: first and second still name their points
    assert texts(await sessions.get("first")) == ["a0", "a0b"]
    assert texts(await sessions.get("second")) == ["a0", "a0b", "a1"]
    if cut == "truncate":
        await store.truncate("first", 0, user_id="u")  # keeps a0 only: first's point (a0, a0b) is cut away
        assert await sessions.get("first") is None and await sessions.get("second") is None
        async with store.session("first", user_id="u") as head:  # the head goes on; first still names nothing
            head.state["in_memory"]["messages"].append(Message(role="user", contents=["later"]))
        assert await sessions.get("first") is None
    else:
        await store.clear("first", user_id="u")
        assert await sessions.get("first") is None and await sessions.get("second") is None
        # A request that continues from it anyway starts from no history (the route's fresh session, under the
        # same id): its response is a branch of nothing, never the turns of the session's head before it.
        async with store.session("first", user_id="u") as head:
            head.state["in_memory"] = {"messages": [Message(role="user", contents=["on the head"])]}
        await sessions.set("fourth", said(AgentSession(session_id="first"), "fresh"))
        assert texts(await sessions.get("fourth")) == ["fresh"]
        head_run = await store.load("first", user_id="u")
        assert [m.text for m in head_run.history] == ["on the head"]
        await head_run.discard()


async def test_deleting_a_first_response_id_deletes_its_point_only(store: Store) -> None:
    sessions = await _chain(store)
    await sessions.delete("first")
    assert await sessions.get("first") is None
    assert texts(await sessions.get("second")) == ["a0", "a0b", "a1"]
    assert texts(await sessions.get("third")) == ["a0", "a0b", "a1", "a2"]
    assert await rows(store, "SELECT count(*) FROM agent_sessions") == [(1,)]
    tree = await store.tree("first", user_id="u")  # what is gone is not listed
    assert "first" not in [node.response_id for node in tree]


async def test_a_branchs_own_id_names_its_head_turn_after_turn(store: Store) -> None:
    sessions = await _chain(store)
    branched = await sessions.get("first")  # its head moved past: a turn from it branches
    assert branched is not None
    await sessions.set("b1", said(branched, "b1"))
    (branch,), = await rows(store, "SELECT id FROM agent_sessions WHERE base_id IS NOT NULL")
    for turn in range(3):
        session = await StoreSessionStore(store, user_id="u").get(branch)
        assert session is not None
        await StoreSessionStore(store, user_id="u").set(branch, said(session, f"t{turn}"))
    assert texts(await sessions.get(branch)) == ["a0", "a0b", "b1", "t0", "t1", "t2"]
    assert texts(await sessions.get("b1")) == ["a0", "a0b", "b1"]
    keyed = await rows(store, "SELECT response_id FROM agent_responses")
    assert branch not in [key for (key,) in keyed] and keyed  # no key row under the branch's own id


async def test_a_run_from_no_history_never_lands_on_a_session_made_since(store: Store) -> None:
    """Two requests find no session "c0" and each stores its response: the second's is its own turn only."""
    a, b = StoreSessionStore(store, user_id="u"), StoreSessionStore(store, user_id="u")
    assert await a.get("c0") is None and await b.get("c0") is None
    await a.set("ra", said(AgentSession(session_id="c0"), "A"))
    await b.set("rb", said(AgentSession(session_id="c0"), "B"))
    assert texts(await a.get("ra")) == ["A"] and texts(await a.get("rb")) == ["B"]


async def test_two_requests_starting_one_conversation_the_second_writes_nothing(url: str) -> None:
    """As ResponsesHostServer drives it: set(response id), then set(conversation id), each worker a Store."""
    async with Store.from_url(url) as store:
        await store.migrate()
    gate, read = asyncio.Event(), []

    async def worker(name: str) -> str:
        async with Store.from_url(url) as store:
            sessions = ConversationSessionStore(store, user_id="u")
            session = await sessions.get("conv_X") or AgentSession()
            read.append(name)
            await gate.wait()
            session.state["_foundry_source_conversation"] = "conv_X"
            try:
                await sessions.set(f"resp_{name}", said(session, f"turn {name}"))
                await sessions.set("conv_X", session)
            except RuntimeError as exc:
                return str(exc)
            return "ok"

    tasks = [asyncio.create_task(worker(name)) for name in "AB"]
    await until(lambda: len(read) == 2 or any(t.done() for t in tasks), "both requests to have read")
    gate.set()
    results = await asyncio.gather(*tasks)
    assert sorted(results) == ["Another request advanced this agent session; reload before writing.", "ok"]
    won = "AB"[results.index("ok")]
    async with Store.from_url(url) as store:
        sessions = ConversationSessionStore(store, user_id="u")
        assert texts(await sessions.get("conv_X")) == [f"turn {won}"]
        assert await sessions.get(f"resp_{'AB'.replace(won, '')}") is None
        assert await rows(store, "SELECT count(*) FROM agent_sessions") == [(1,)]
