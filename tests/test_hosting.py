"""Served conversations (issue 38): Agent Framework's hosting-responses route, unchanged, on StoreSessionStore.

A ``previous_response_id`` names a snapshot that never changes; requests may branch from it, each under a new
response id, and see that snapshot, not each other. A ``conversation`` names a head that moves. Another user's
response id is never their history. Each request is a new Store (another worker); some run in a new process.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agent_framework import AgentSession, Message
from helpers import rows
from hosting_route import serve, text_of

from agent_store import InvalidValueError, SessionNotFoundError, Store
from agent_store.agent_framework import StoreSessionStore

HERE = Path(__file__).resolve().parent


async def ask(url: str, words: str, *, after: str | None = None, user: str = "u", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "offline", "input": words, **extra}
    if after is not None:
        body["previous_response_id"] = after
    return await serve(url, user, body)


async def test_a_chain_of_responses_remembers_and_branches_see_their_snapshot_only(store: Store, url: str) -> None:
    first = await ask(url, "我叫李明")
    second = await ask(url, "我叫什么名字？", after=first["id"])
    assert text_of(second) == "你叫李明。"
    # Two requests branch from the first response at once: each sees that snapshot, not the other.
    wang, zhang = await asyncio.gather(ask(url, "我叫王芳", after=first["id"]), ask(url, "我叫张伟", after=first["id"]))
    assert {text_of(wang), text_of(zhang)} == {"你好，王芳！很高兴认识你。", "你好，张伟！很高兴认识你。"}
    assert text_of(await ask(url, "我叫什么名字？", after=wang["id"])) == "你叫王芳。"
    assert text_of(await ask(url, "我叫什么名字？", after=zhang["id"])) == "你叫张伟。"
    assert text_of(await ask(url, "我叫什么名字？", after=second["id"])) == "你叫李明。"
    # The first response is what it was: one user message, whatever continued from it.
    assert text_of(await ask(url, "hello", after=first["id"])) == "收到：hello（第 2 条用户消息）"


async def test_a_snapshot_never_changes_state_and_messages_included(store: Store, url: str) -> None:
    sessions = StoreSessionStore(store, user_id="u")
    session = AgentSession(session_id="r0")
    await sessions.set("r0", session)
    seen: dict[str, tuple[list[str], dict[str, Any]]] = {}
    previous = "r0"
    for n in range(1, 6):  # a chain r1..r5, each turn a message and a counter
        loaded = await sessions.get(previous)
        assert loaded is not None
        loaded.state.setdefault("in_memory", {}).setdefault("messages", []).append(
            Message(role="user", contents=[f"turn {n}"])
        )
        loaded.state["n"] = loaded.state.get("n", 0) + 1
        loaded.state[f"only_{n}"] = True
        await sessions.set(f"r{n}", loaded)
        previous = f"r{n}"
    for n in range(0, 6):
        got = await sessions.get(f"r{n}")
        assert got is not None
        seen[f"r{n}"] = ([m.text for m in got.state["in_memory"]["messages"]],
                         {k: v for k, v in got.state.items() if k != "in_memory"})  # fmt: skip
        assert seen[f"r{n}"][0] == [f"turn {i}" for i in range(1, n + 1)]
        assert seen[f"r{n}"][1] == ({"n": n, **{f"only_{i}": True for i in range(1, n + 1)}} if n else {})
    # branch from r2 twice, delete a key in one branch; every recorded point reads the same as before
    for name in ("b1", "b2"):
        loaded = await sessions.get("r2")
        assert loaded is not None
        loaded.state.pop("only_1")
        loaded.state["n"] = 100
        await sessions.set(name, loaded)
    for key, (texts, state) in seen.items():
        got = await sessions.get(key)
        assert got is not None and [m.text for m in got.state["in_memory"]["messages"]] == texts
        assert {k: v for k, v in got.state.items() if k != "in_memory"} == state, key
    b1 = await sessions.get("b1")
    assert b1 is not None and b1.state["n"] == 100 and "only_1" not in b1.state and b1.session_id == "r0"
    # a point is set once
    with pytest.raises(InvalidValueError, match="already names a point"):
        again = await sessions.get("r1")
        assert again is not None
        again.state["x"] = 1
        await sessions.set("r3", again)


async def test_branching_writes_no_copy_of_the_history(store: Store, url: str) -> None:
    previous = None
    ids = []
    for n in range(12):
        reply = await ask(url, f"turn {n}", after=previous)
        previous = reply["id"]
        ids.append(previous)
    assert await rows(store, "SELECT count(*), count(DISTINCT session_id) FROM agent_messages") == [(24, 1)]
    for _ in range(3):  # three branches from the middle: their own turn each, the history read through the base
        branch = await ask(url, "and then", after=ids[5])
        assert text_of(branch) == "收到：and then（第 7 条用户消息）"
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(24 + 3 * 2,)]
    assert await rows(store, "SELECT count(*) FROM agent_sessions WHERE base_id IS NOT NULL") == [(3,)]
    assert await rows(store, "SELECT count(*) FROM agent_responses") == [(12 + 3,)]


async def test_a_conversation_head_moves(store: Store, url: str) -> None:
    first = await ask(url, "我叫李明", conversation="conv_1")
    assert first["conversation"]["id"] == "conv_1" if isinstance(first.get("conversation"), dict) else True
    assert text_of(await ask(url, "我叫什么名字？", conversation="conv_1")) == "你叫李明。"
    assert text_of(await ask(url, "hello", conversation="conv_1")) == "收到：hello（第 3 条用户消息）"
    assert await rows(store, "SELECT count(*) FROM agent_messages WHERE session_id = 'conv_1'") == [(6,)]


async def test_another_users_response_id_is_never_their_history(store: Store, url: str) -> None:
    mine = await ask(url, "我叫李明", user="alice")
    assert await StoreSessionStore(store, user_id="mallory").get(mine["id"]) is None
    with pytest.raises(SessionNotFoundError):  # continuing from it: refused, nothing of alice's is read
        await ask(url, "我叫什么名字？", after=mine["id"], user="mallory")
    assert await rows(
        store, "SELECT DISTINCT user_id FROM agent_messages JOIN agent_sessions s ON s.id = session_id"
    ) == [("alice",)]


async def test_the_streaming_route_chains_and_branches(store: Store, url: str) -> None:
    first = await ask(url, "我叫李明", stream=True)
    assert first["status"] == "completed" and text_of(first) == "你好，李明！很高兴认识你。"
    assert text_of(await ask(url, "我叫什么名字？", after=first["id"], stream=True)) == "你叫李明。"
    other = await ask(url, "我叫王芳", after=first["id"], stream=True)
    assert text_of(await ask(url, "我叫什么名字？", after=other["id"], stream=True)) == "你叫王芳。"


def test_each_request_in_a_process_of_its_own(url: str, tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "agent_store", "upgrade", "--url", url], check=True, capture_output=True)

    def request(words: str, after: str | None = None) -> dict[str, Any]:
        body = {"model": "offline", "input": words, **({"previous_response_id": after} if after else {})}
        done = subprocess.run([sys.executable, str(HERE / "hosting_route.py"), url, "u", json.dumps(body)],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))

    first = request("我叫李明")
    assert text_of(request("我叫什么名字？", first["id"])) == "你叫李明。"
    branch = request("我叫王芳", first["id"])
    assert text_of(request("我叫什么名字？", branch["id"])) == "你叫王芳。"
    assert text_of(request("hello", first["id"])) == "收到：hello（第 2 条用户消息）"
