"""Response keys are checked like every id, and a chain past its depth limit is a typed error, never an empty
history (issue 58 findings 9 and 10), on both backends."""

from __future__ import annotations

import pytest
from agent_framework import AgentSession, Message
from helpers import rows
from sqlalchemy import text

from agent_store import InvalidValueError, Store
from agent_store.agent_framework import StoreSessionStore
from agent_store.db.cut_points import CHAIN_MAX


@pytest.mark.parametrize("key", [pytest.param("r\ud800", id="lone-surrogate"), pytest.param("r" * 300, id="300-chars"),
                                 pytest.param("r\x00", id="nul")])  # fmt: skip
async def test_a_response_key_is_checked_like_an_id(store: Store, key: str) -> None:
    sessions = StoreSessionStore(store, user_id="u")
    await sessions.set("r0", AgentSession(session_id="r0"))
    session = await sessions.get("r0")
    assert session is not None
    session.state.setdefault("in_memory", {}).setdefault("messages", []).append(Message(role="user", contents=["hi"]))
    for call in (lambda: sessions.set(key, session), lambda: sessions.get(key), lambda: sessions.delete(key)):
        with pytest.raises(InvalidValueError, match="at most 255 characters"):
            await call()
    assert await rows(store, "SELECT count(*) FROM agent_responses WHERE length(response_id) > 255") == [(0,)]


async def test_a_branch_deeper_than_the_limit_is_refused_not_read_empty(store: Store) -> None:
    sessions = StoreSessionStore(store, user_id="u")
    session = AgentSession(session_id="b0")
    session.state["in_memory"] = {"messages": [Message(role="user", contents=["the first words"])]}
    await sessions.set("b0", session)
    deep = [{"id": f"b{n}", "base": f"b{n - 1}"} for n in range(1, CHAIN_MAX + 2)]  # one base past the limit
    async with store.engine.begin() as conn:
        await conn.execute(text(
            "INSERT INTO agent_sessions (id, user_id, incarnation, version, next_seq, created_at, updated_at, "
            "base_id, base_seq, base_version, keeps_history) VALUES (:id, 'u', 7, 0, 1, CURRENT_TIMESTAMP, "
            "CURRENT_TIMESTAMP, :base, 1, 1, true)"), deep)  # fmt: skip
    near = await sessions.get(f"b{CHAIN_MAX}")  # exactly at the limit: read whole
    assert near is not None and [m.text for m in near.state["in_memory"]["messages"]] == ["the first words"]
    with pytest.raises(InvalidValueError, match=f"more than {CHAIN_MAX} bases"):
        await sessions.get(f"b{CHAIN_MAX + 1}")
