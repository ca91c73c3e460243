"""Conversation trees under the operator's commands (issue 38): a branch reads its history through its base, so a
base outlives its branches (purge), takes them along (delete), is never cut under them (truncate, clear); and a
point's model view never changes, with compaction too (the framework's in-memory session, copied at each turn,
is the reference)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from agent_framework import AgentSession, Message
from differential import STRATEGIES, Scenario, _agent
from helpers import expire_now, rows

from agent_store import InvalidValueError, Store
from agent_store.agent_framework import StoreSessionStore


async def _tree(store: Store) -> StoreSessionStore:
    """r0 -> r1 -> r2 -> r3 on one session, and a branch b1 from r2 (its session moved on to r3)."""
    sessions = StoreSessionStore(store, user_id="u")
    await sessions.set("r0", AgentSession(session_id="r0"))
    for key, parent in (("r1", "r0"), ("r2", "r1"), ("r3", "r2"), ("b1", "r2")):
        session = await sessions.get(parent)
        assert session is not None
        session.state.setdefault("in_memory", {}).setdefault("messages", []).append(
            Message(role="user", contents=[f"to {key}"])
        )
        await sessions.set(key, session)
    return sessions


async def test_deleting_a_base_deletes_its_branches_and_purge_keeps_a_base_with_one(store: Store) -> None:
    sessions = await _tree(store)
    branch = (await rows(store, "SELECT id FROM agent_sessions WHERE base_id IS NOT NULL"))[0][0]
    await expire_now(store, "r0")
    assert await store.purge_expired() == 0  # r0 expired, but the branch reads it
    assert await sessions.get("b1") is not None
    await expire_now(store, branch)
    assert await store.purge_expired() == 2  # the branch first, then its base
    assert await rows(store, "SELECT count(*) FROM agent_sessions") == [(0,)]
    sessions = await _tree(store)
    assert await store.delete("r0", user_id="u")
    assert await rows(store, "SELECT count(*), (SELECT count(*) FROM agent_messages) FROM agent_sessions") == [(0, 0)]
    assert await sessions.get("b1") is None


async def test_a_base_is_never_cut_under_its_branches(store: Store) -> None:
    sessions = await _tree(store)
    with pytest.raises(InvalidValueError, match="has a branch"):
        await store.truncate("r0", 0, user_id="u")  # the branch continues after seq 0
    with pytest.raises(InvalidValueError, match="has branches"):
        await store.clear("r0", user_id="u")
    branch = (await rows(store, "SELECT id FROM agent_sessions WHERE base_id IS NOT NULL"))[0][0]
    with pytest.raises(InvalidValueError, match="branch of a served conversation"):
        await store.fork(branch, user_id="u")
    with pytest.raises(InvalidValueError, match="cannot be truncated there"):
        await store.truncate(branch, 0, user_id="u")
    b1 = await sessions.get("b1")
    assert b1 is not None and [m.text for m in b1.state["in_memory"]["messages"]] == ["to r1", "to r2", "to b1"]
    assert await store.truncate("r0", 1, user_id="u") == 1  # "to r3" goes, and r3 with it; the branch's base stays
    assert await sessions.get("r3") is None and await sessions.get("r2") is not None
    b1 = await sessions.get("b1")
    assert b1 is not None and [m.text for m in b1.state["in_memory"]["messages"]] == ["to r1", "to r2", "to b1"]


@pytest.mark.parametrize("seed", range(6))
async def test_a_points_model_view_is_the_in_memory_sessions_at_that_turn(store: Store, seed: int) -> None:
    """A chain of turns through response ids, with a compaction strategy; then, from random earlier points, one more
    turn each: its request is the one the framework's in-memory session made from its copy of that turn."""
    r = random.Random(seed)
    scenario = Scenario.draw(seed)
    scenario.strategy = r.choice([s for s in STRATEGIES if s != "none"])
    scenario.phase, scenario.reused_ids, scenario.race_at = "after", False, None
    turns = [f"{r.choice(['call weather', 'hello there', 'tell me more', 'why?'])} #{n}" for n in range(7)]
    reference, copies = AgentSession(session_id="c"), {}
    for n, words in enumerate(turns):
        await _agent(scenario, []).run(words, session=reference)
        copies[n] = AgentSession.from_dict(reference.to_dict())
    sessions = StoreSessionStore(store, user_id="u")
    previous = None
    for n, words in enumerate(turns):
        session = (await sessions.get(previous)) if previous else AgentSession(session_id="c")
        assert session is not None
        await _agent(scenario, []).run(words, session=session)
        await sessions.set(f"r{n}", session)
        previous = f"r{n}"
    for n in sorted(r.sample(range(len(turns)), 3)):
        expected: list[Any] = []
        await _agent(scenario, expected).run("where were we?", session=AgentSession.from_dict(copies[n].to_dict()))
        got: list[Any] = []
        session = await sessions.get(f"r{n}")
        assert session is not None
        await _agent(scenario, got).run("where were we?", session=session)
        assert got == expected, (seed, scenario.strategy, n)
        await sessions.set(f"again-{n}", session)  # a branch (or the head moving on), then the next point


async def test_export_and_import_keep_every_point_branch_and_earlier_mark(store: Store, url: str) -> None:
    """The whole tree goes out and comes back: each response id reads the same history and state, and a cut at an
    earlier message still finds the marks a later compaction replaced (issue 37's review: they were lost)."""
    sessions = await _tree(store)
    r1 = await sessions.get("r1")
    assert r1 is not None
    first = r1.state["in_memory"]["messages"][0]
    first.additional_properties.update(_excluded=True, _group={"id": "g0", "kind": "user", "index": 0})
    r1.state["n"] = 1
    await sessions.set("marked", r1)  # a branch from r1 (the head is r3): excludes its base's first message
    async with store.session("r0", user_id="u") as head:  # the head excludes it too, and then includes it again
        head.state["in_memory"]["messages"][0].additional_properties.update(_excluded=True)
    async with store.session("r0", user_id="u") as head:
        head.state["in_memory"]["messages"][0].additional_properties.update(_excluded=False)

    async def views() -> dict[str, Any]:
        out = {}
        for key in ("r0", "r1", "r2", "r3", "b1", "marked"):
            session = await StoreSessionStore(store, user_id="u").get(key)
            assert session is not None, key
            out[key] = ([(m.text, m.additional_properties.get("_excluded")) for m in session.state["in_memory"]
                         ["messages"]], {k: v for k, v in session.state.items() if k != "in_memory"})  # fmt: skip
        return out

    before = await views()
    assert before["marked"][0][0] == ("to r1", True) and before["r1"][0][0] == ("to r1", None)
    lines = [line async for line in store.export(user_id="u")]
    assert await store.delete("r0", user_id="u")  # the tree goes with its root
    assert await rows(store, "SELECT count(*) FROM agent_sessions") == [(0,)]
    report = await store.import_lines(lines)
    assert report.imported == 3  # the root and two branches
    assert await views() == before
    await store.truncate("r0", 1, user_id="u")  # a cut before the head's two rewrites puts the marks back
    cut = await store.load("r0", user_id="u")
    assert [m.additional_properties.get("_excluded") for m in cut.history] == [None, None]
    await cut.discard()


async def test_a_shared_fork_branches_at_any_message_and_the_tree_lists_it(store: Store, url: str) -> None:
    """store.fork(share=True): edit a message or regenerate a reply from any point, without copying the history;
    store.tree and `agent-store tree` list the branches and response ids."""
    sessions = await _tree(store)
    edited = await store.fork("r0", user_id="u", at_seq=0, new_id="edit", share=True)  # keep "to r1" only
    async with store.session(edited, user_id="u") as session:
        assert [m.text for m in session.state["in_memory"]["messages"]] == ["to r1"]
        session.state["in_memory"]["messages"].append(Message(role="user", contents=["edited"]))
    assert [m.text for m in (await store.load(edited, user_id="u")).history] == ["to r1", "edited"]
    assert await rows(store, "SELECT count(*) FROM agent_messages WHERE session_id = 'edit'") == [(1,)]  # no copy
    nodes = await store.tree("r0", user_id="u")
    assert [(n.depth, n.session_id == "r0") for n in nodes][:4] == [(0, True)] * 4  # r0's four points
    assert {n.session_id for n in nodes if n.depth == 1} >= {"edit"} and len({n.session_id for n in nodes}) == 3
    branch = next(n.session_id for n in nodes if n.depth == 1 and n.base_seq == 2)  # b1's, from r2
    with pytest.raises(InvalidValueError, match="in the history"):
        await store.fork(branch, user_id="u", at_seq=0, share=True)  # seq 0 is its base's history, not its own
    assert await sessions.get("b1") is not None
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "agent_store", "tree", "r0", "--user", "u", "--json", "--url", url],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [n["session_id"] for n in json.loads(done.stdout)] == [n.session_id for n in nodes]


async def test_a_windowed_store_reads_a_points_tail(store: Store) -> None:
    """StoreSessionStore(history_limit=N): a point read back is its last N messages (pair-safe), in a branch too."""
    await _tree(store)
    windowed = StoreSessionStore(store, user_id="u", history_limit=2)
    for key, expected in (("r3", ["to r2", "to r3"]), ("r1", ["to r1"]), ("b1", ["to r2", "to b1"])):
        session = await windowed.get(key)
        assert session is not None and [m.text for m in session.state["in_memory"]["messages"]] == expected, key
