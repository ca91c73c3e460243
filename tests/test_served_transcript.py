"""One transcript (issue 58 item 5): a conversation served by the self-hosted Responses server, over its real HTTP
route (agentserver_route.py), is in the store's own messages: the README's SQL, `agent-store sessions` / `show` /
`search`, the browser, search by meaning, and erasure see it, while the server keeps its items byte for byte. A
chain is one session, a second continuation of a response the store's branch, a conversation its own session;
a turn a process failed to transcribe is written once by `agent-store transcribe`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_framework import Message
from agentserver_route import ask, text_of
from cli_support import cli, ok
from helpers import doc_block, rows

from agent_store import Store
from agent_store.agent_framework import served_transcripts as transcripts

SQL = doc_block("README.md", "matching").replace("'u1'", "'u'").strip().rstrip(";")


async def _transcript(store: Store) -> list[tuple[Any, ...]]:
    return await rows(store, "SELECT session_id, seq, role, text FROM agent_transcript WHERE user_id = 'u' "
                             "ORDER BY session_id, seq")  # fmt: skip


async def test_a_served_chain_its_branch_and_a_conversation_are_in_the_transcript(
    store: Store, url: str, tmp_path: Path
) -> None:  # fmt: skip
    first = await ask(url, "u", {"input": "我叫李明"})
    second = await ask(url, "u", {"input": "我叫什么名字？", "previous_response_id": first["id"]})
    assert text_of(second) == "你叫李明。"
    await ask(url, "u", {"input": "我叫王芳", "previous_response_id": first["id"]})  # first is not the head: a branch
    for words in ("hello there", "again"):
        await ask(url, "u", {"input": words, "conversation": "conv_1"})
    await ask(url, "v", {"input": "我叫李明 too"})  # another user's
    chain, conv = (transcripts.session_id_for("u", transcripts.key_of(i)) for i in (first["id"], "conv_1"))
    seen = await _transcript(store)
    said = ["我叫李明", "你好，李明！很高兴认识你。", "我叫什么名字？", "你叫李明。"]
    assert [(s, n, t) for s, n, _, t in seen if s == chain] == [(chain, n, t) for n, t in enumerate(said)]
    (branch,) = {s for s, *_ in seen if s not in (chain, conv)}
    assert [t for s, _, _, t in seen if s == branch] == ["我叫王芳", "你好，王芳！很高兴认识你。"]  # its own turn
    assert await rows(store, "SELECT base_id, base_seq FROM agent_sessions WHERE id = :b", b=branch) == [(chain, 2)]
    assert [t for s, _, _, t in seen if s == conv][::2] == ["hello there", "again"]
    assert {r[0] for r in await rows(store, SQL.replace("李明", "王芳"))} == {branch}  # the README's SQL
    # the CLI: sessions, show (the branch with what it reads of its base), search
    listed = ok(cli("sessions", "--user", "u", "--json", url=url, cwd=tmp_path))
    titled = {s["id"]: s["title"] for s in json.loads(listed)["items"]}
    assert titled[chain] == first["id"] and titled[conv] == "conv_1" and branch in titled  # titled as served
    shown = [line for line in ok(cli("show", branch, "--user", "u", url=url, cwd=tmp_path)).splitlines()
             if not line.startswith("title: ")]  # (titled with the response it began with)
    own = ["我叫王芳", "你好，王芳！很高兴认识你。"]
    assert [line.split()[-1] for line in shown[1:]] == ["--", *said[:2], "--", *own]
    assert f"its base {chain}" in shown[1] and "its own" in shown[4]
    found = ok(cli("search", "王芳", "--user", "u", url=url, cwd=tmp_path))
    assert branch in found and "served:" in found and "too" not in found  # never v's
    # the browser
    from agent_store.browser.app import create_app

    transport = httpx.ASGITransport(app=create_app(store))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        page = (await client.get("/session", params={"id": chain, "user": "u"})).text
        seen_by_branch = (await client.get("/session", params={"id": branch, "user": "u"})).text
    assert "我叫什么名字？" in page and "你叫李明。" in page
    assert "我叫李明" in seen_by_branch and "its base" in seen_by_branch and "我叫王芳" in seen_by_branch
    # the server's own items are as it stored them, and erasure takes both
    assert (await rows(store, "SELECT count(*) FROM agent_hosted_items WHERE user_id = 'u'"))[0][0] >= 10
    await store.erase_user("u")
    assert await _transcript(store) == []
    assert await rows(store, "SELECT count(*) FROM agent_hosted_items WHERE user_id = 'u'") == [(0,)]


async def test_search_by_meaning_finds_a_served_turn(url: str, store: Store) -> None:
    from test_hybrid_search import EMBEDDER

    await ask(url, "u", {"input": "I booked a flight to Paris for Friday"})
    async with Store.from_url(url, embedder=EMBEDDER) as semantic:
        assert await semantic.embeddings.backfill() >= 2
        page = await semantic.search("airplane ticket", user_id="u", ranking="vector", limit=3)
    assert page.items[0].session_id.startswith(transcripts.PREFIX) and "Paris" in page.items[0].snippet


async def test_a_turn_left_out_is_written_once_by_the_sweep(
    url: str, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    async def fails(*args: Any) -> bool:
        raise RuntimeError("the process stopped here")

    monkeypatch.setattr(transcripts, "transcribe", fails)
    said = await ask(url, "u", {"input": "我叫李明", "conversation": "conv_9"})
    assert text_of(said) == "你好，李明！很高兴认识你。"  # the caller was answered from the server's own rows
    monkeypatch.undo()
    assert await _transcript(store) == []
    assert "transcribed 1 served responses" in ok(cli("transcribe", url=url, cwd=tmp_path))
    once = await _transcript(store)
    assert [t for *_, t in once] == ["我叫李明", "你好，李明！很高兴认识你。"]
    # its turn written, its mark lost (a process that died between the two): written again, there once
    await rows(store, "SELECT 1")  # (the store's engine is warm)
    async with store.engine.begin() as conn:
        from sqlalchemy import text

        await conn.execute(text("UPDATE agent_hosted_responses SET transcribed = false"))
    assert await transcripts.transcribe_pending(store) == 1
    assert await _transcript(store) == once
    assert await transcripts.transcribe_pending(store) == 0


async def test_a_host_whose_agent_sessions_hold_the_messages_shows_each_turn_once(url: str, store: Store) -> None:
    """history_source="agent": the agent's own sessions hold the turns, and the provider (transcript=False, as
    docs/serving.md says) writes no second copy."""
    first = await ask(url, "u", {"input": "我叫李明"}, "agent")
    await ask(url, "u", {"input": "我叫什么名字？", "previous_response_id": first["id"]}, "agent")
    seen = await _transcript(store)
    assert [t for *_, t in seen] == ["我叫李明", "你好，李明！很高兴认识你。", "我叫什么名字？", "你叫李明。"]
    assert len({s for s, *_ in seen}) == 1  # the agent's one session, each turn once
    assert await transcripts.transcribe_pending(store) == 0  # (found by an outside review: the sweep wrote them)
    assert await rows(store, "SELECT count(*) FROM agent_sessions WHERE id LIKE 'served:%'") == [(0,)]


async def test_two_users_one_conversation_id_and_an_apps_own_session_stay_apart(url: str, store: Store) -> None:
    """Found by an outside review: session ids are one namespace, so the second user's conv_1 was never written,
    and an app's own session named like the transcript's took the served turns."""
    async with store.session("served:conv_1", user_id="alice") as session:
        session.state["in_memory"]["messages"].append(Message(role="user", contents=["the app's own note"]))
    await ask(url, "alice", {"input": "alice says alpha", "conversation": "conv_1"})
    await ask(url, "bob", {"input": "bob says bravo", "conversation": "conv_1"})
    long = await ask(url, "bob", {"input": "a long id", "conversation": "c" * 250})
    assert long.get("status") == "completed"
    by_user = await rows(store, "SELECT user_id, session_id, text FROM agent_transcript WHERE role = 'user' "
                                "ORDER BY user_id, session_id, seq")  # fmt: skip
    assert [(u, t) for u, s, t in by_user if s == "served:conv_1"] == [("alice", "the app's own note")]
    assert sorted((u, t) for u, s, t in by_user if s != "served:conv_1") == [
        ("alice", "alice says alpha"), ("bob", "a long id"), ("bob", "bob says bravo")]
    assert await rows(store, "SELECT count(*) FROM agent_hosted_responses WHERE NOT transcribed") == [(0,)]


async def test_turns_left_out_are_written_in_the_order_served_and_one_failure_holds_up_nothing(
    url: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    """Found by an outside review: a sweep wrote a left-out turn after the later ones, split a chain whose first
    turn was left out, and stopped at the first response it could not write."""
    from agentserver_route import host

    async def fails(*args: Any, **kwargs: Any) -> bool:
        raise RuntimeError("the process stopped here")

    app = host(store, "agent_server")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as http:

        async def post(body: dict[str, Any], *, lost: bool = False) -> dict[str, Any]:
            with monkeypatch.context() as patch:
                if lost:
                    patch.setattr(transcripts, "transcribe", fails)
                answer = await http.post("/responses", json={"model": "offline", **body},
                                         headers={"x-agent-user-id": "u"}, timeout=60)  # fmt: skip
            return dict(answer.json())

        await post({"input": "turn 1", "conversation": "conv_o"})
        await post({"input": "turn 2", "conversation": "conv_o"}, lost=True)
        await post({"input": "turn 3", "conversation": "conv_o"})
        r1 = await post({"input": "chain 1"}, lost=True)
        await post({"input": "chain 2", "previous_response_id": r1["id"]})
    said = [(s, t) for s, _, role, t in await _transcript(store) if role == "user"]
    conv, chain = (transcripts.session_id_for("u", transcripts.key_of(i)) for i in ("conv_o", r1["id"]))
    assert [t for s, t in said if s == conv] == ["turn 1", "turn 2", "turn 3"]
    assert [t for s, t in said if s == chain] == ["chain 1", "chain 2"]
    assert await transcripts.transcribe_pending(store) == 0


async def test_sweeps_at_once_write_each_turn_once_and_leave_no_empty_branch(
    url: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    """Found by an outside review: two sweeps writing one left-out chain left empty branches behind."""
    import asyncio

    async def fails(*args: Any, **kwargs: Any) -> bool:
        raise RuntimeError("the process stopped here")

    with monkeypatch.context() as patch:
        patch.setattr(transcripts, "transcribe", fails)
        previous: dict[str, Any] = {}
        for n in range(4):
            previous = await ask(url, "u", {"input": f"chain {n}", **({"previous_response_id": previous["id"]}
                                                                    if previous else {})})  # fmt: skip
    sweepers = [Store.from_url(url) for _ in range(3)]
    try:
        written = await asyncio.gather(*(transcripts.transcribe_pending(s) for s in sweepers))
    finally:
        for sweeper in sweepers:
            await sweeper.close()
    assert sum(written) >= 4 - 1  # each written by one sweep (a sweep may find one another wrote meanwhile)
    said = [(s, t) for s, _, role, t in await _transcript(store) if role == "user"]
    assert [t for _, t in said] == [f"chain {n}" for n in range(4)] and len({s for s, _ in said}) == 1
    assert await rows(store, "SELECT count(*) FROM agent_sessions WHERE base_id IS NOT NULL") == [(0,)]
    assert await rows(store, "SELECT count(*) FROM agent_hosted_responses WHERE NOT transcribed") == [(0,)]


def test_items_become_the_frameworks_messages_and_a_message_without_text_says_what_it_held() -> None:
    made = transcripts.to_messages([
        {"type": "message", "id": "i1", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]},
        {"type": "message", "id": "i2", "role": "developer", "content": "be brief"},
        {"type": "function_call", "id": "i3", "call_id": "c1", "name": "weather", "arguments": "{}"},
        {"type": "function_call_output", "id": "i4", "call_id": "c1", "output": "晴"},
        {"type": "reasoning", "id": "i5", "summary": []},
    ])  # fmt: skip
    assert [(m.role, m.text, m.message_id) for m in made] == [
        ("user", "[input_image]", "i1"), ("system", "be brief", "i2"), ("assistant", "", "i3"), ("tool", "", "i4")]
    assert made[2].contents[0].name == "weather" and made[3].contents[0].result == "晴"


async def test_a_turn_the_store_refuses_holds_up_nothing_after_it(url: str, store: Store) -> None:
    """Found by an outside review: a turn over the store's max_value_bytes blocked every later turn of its
    conversation and chain, and a page of such rows every sweep. It is a line saying so; the server keeps it."""
    from agentserver_route import host

    async with Store.from_url(url, max_value_bytes=64 * 1024) as small:
        app = host(small, "agent_server")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as http:

            async def post(body: dict[str, Any]) -> dict[str, Any]:
                said = await http.post("/responses", json={"model": "offline", **body},
                                       headers={"x-agent-user-id": "u"}, timeout=60)  # fmt: skip
                return dict(said.json())

            await post({"input": "turn 1", "conversation": "cb"})
            big = await post({"input": "long paste " + "x" * 100_000, "conversation": "cb"})
            await post({"input": "turn 3", "conversation": "cb"})
            first = await post({"input": "chain big " + "y" * 100_000})
            await post({"input": "chain 2", "previous_response_id": first["id"]})
        said = [t for *_, role, t in await _transcript(small) if role == "user"]
    assert big["status"] == "completed" and "turn 3" in said and "chain 2" in said
    assert sum("over this store's max_value_bytes" in t for t in said) == 2  # the two long ones, said to be
    assert await rows(small, "SELECT count(*) FROM agent_hosted_responses WHERE NOT transcribed") == [(0,)]


async def test_a_long_chain_left_out_is_one_session_and_a_sweep_reads_past_what_fails(
    url: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    """Found by an outside review: a chain of over 100 left-out responses split in two, and a page of rows that
    cannot be written stopped every sweep before the others."""
    real = transcripts._write

    async def fails(*args: Any, **kwargs: Any) -> bool:
        raise RuntimeError("the process stopped here")

    monkeypatch.setattr(transcripts, "_write", fails)
    previous: dict[str, Any] = {}
    for n in range(105):
        body = {"input": f"chain {n}", **({"previous_response_id": previous["id"]} if previous else {})}
        previous = await ask(url, "u", body)
    monkeypatch.setattr(transcripts, "PAGE", 10)
    blocked = {previous["id"]}  # the newest: cannot be written at all (a sweep must read on past a page of such)

    async def some(store_: Store, user: str, rid: str) -> bool:
        if rid in blocked:
            raise RuntimeError("cannot be written")
        return await real(store_, user, rid)

    monkeypatch.setattr(transcripts, "_write", some)
    await ask(url, "v", {"input": "v's own", "conversation": "other"})  # after them all
    assert await transcripts.transcribe_pending(store) >= 1
    said = [(s, t) for s, _, role, t in await _transcript(store) if role == "user"]
    assert [t for s, t in said if t.startswith("chain")] == [f"chain {n}" for n in range(104)]
    assert len({s for s, t in said if t.startswith("chain")}) == 1
    assert await rows(store, "SELECT user_id FROM agent_hosted_responses WHERE NOT transcribed") == [("u",)]
