"""Every walk of a chain of bases takes a step only to the base a branch was made on (db/chains.py, issue 58 item 2):
its id, its user, its incarnation. However a branch came to outlive its base (a hand edit, a partial restore, a
bug yet unfound), a session that later takes the freed id is never read as the branch's history."""

from __future__ import annotations

import pytest
from agent_framework import Message
from helpers import rows
from sqlalchemy import text

from agent_store import InvalidValueError, Store


async def _say(store: Store, session_id: str, user: str, *words: str) -> None:
    async with store.session(session_id, user_id=user) as session:
        session.state["in_memory"]["messages"].extend(Message(role="user", contents=[w]) for w in words)


async def _texts(store: Store, session_id: str, user: str) -> list[str]:
    async with store.session(session_id, user_id=user) as session:
        return [m.text for m in session.state["in_memory"]["messages"]]


async def _orphan(store: Store) -> None:
    """A base removed under its live branch, as no operation of the store does (its deletes keep branches whole)."""
    async with store.engine.begin() as conn:
        await conn.execute(text("DELETE FROM agent_messages WHERE session_id = 'base'"))
        await conn.execute(text("DELETE FROM agent_sessions WHERE id = 'base'"))


@pytest.mark.parametrize("taker", ["alice", "mallory"])
async def test_a_branch_never_reads_a_session_that_took_its_bases_id(store: Store, taker: str) -> None:
    await _say(store, "base", "alice", "alice one", "alice two")
    await store.fork("base", user_id="alice", at_seq=0, new_id="branch", share=True)
    assert await _texts(store, "branch", "alice") == ["alice one"]
    await _orphan(store)
    await _say(store, "base", taker, f"{taker} secret one", f"{taker} secret two")  # a new incarnation of the id
    with pytest.raises(InvalidValueError, match="a base that is gone"):
        await _texts(store, "branch", "alice")
    tree = await store.tree("base", user_id=taker)
    assert [node.session_id for node in tree] == ["base"]  # the branch is not the new session's either
    assert await _texts(store, "base", taker) == [f"{taker} secret one", f"{taker} secret two"]


async def test_a_branch_records_the_incarnation_it_was_made_on(store: Store) -> None:
    await _say(store, "base", "u", "one")
    await store.fork("base", user_id="u", new_id="branch", share=True)
    (made,) = await rows(store, "SELECT b.base_incarnation, s.incarnation FROM agent_sessions b "
                                "JOIN agent_sessions s ON s.id = b.base_id WHERE b.id = 'branch'")  # fmt: skip
    assert made[0] is not None and made[0] == made[1]
    async with store.engine.begin() as conn:  # the same id, the same user, another incarnation
        await conn.execute(text("UPDATE agent_sessions SET incarnation = incarnation + 1 WHERE id = 'base'"))
    with pytest.raises(InvalidValueError, match="a base that is gone"):
        await _texts(store, "branch", "u")
    async with store.engine.begin() as conn:  # a branch made before 0027 (no incarnation): checked by id and user
        await conn.execute(text("UPDATE agent_sessions SET base_incarnation = NULL WHERE id = 'branch'"))
    assert await _texts(store, "branch", "u") == ["one"]


async def test_an_export_of_an_orphan_is_not_grafted_onto_a_session_that_took_the_id(store: Store) -> None:
    await _say(store, "base", "alice", "alice one")
    await store.fork("base", user_id="alice", new_id="branch", share=True)
    await _orphan(store)
    await _say(store, "base", "alice", "another one")
    lines = [line async for line in store.export(user_id="alice", session_id="branch")]
    async with store.engine.begin() as conn:
        await conn.execute(text("DELETE FROM agent_sessions WHERE id = 'branch'"))
    with pytest.raises(InvalidValueError, match=r"base_history|not the one it was exported with"):
        await store.import_lines(lines)


async def test_the_upgrade_gives_a_branch_that_outlived_its_base_no_base(store: Store) -> None:
    """Found by an outside review: 0027's backfill left such a branch without an incarnation, which every walk
    then checked by id and user only, so the next session of that id became its base (and deleted it)."""
    await _say(store, "base", "alice", "alice one", "alice two")
    await store.fork("base", user_id="alice", at_seq=0, new_id="branch", share=True)
    await store.fork("base", user_id="alice", at_seq=0, new_id="whole", share=True)
    await store.downgrade("0026")
    async with store.engine.begin() as conn:  # the orphan of a partial restore, at 0026
        await conn.execute(text("UPDATE agent_sessions SET base_id = 'gone' WHERE id = 'branch'"))
    await store.migrate()
    assert await _texts(store, "whole", "alice") == ["alice one"]  # a branch whose base is there: its incarnation
    await _say(store, "gone", "alice", "NEW SESSION one", "NEW SESSION two")
    with pytest.raises(InvalidValueError, match="a base that is gone"):
        await _texts(store, "branch", "alice")
    assert [node.session_id for node in await store.tree("gone", user_id="alice")] == ["gone"]
    await store.delete("gone", user_id="alice")
    assert await rows(store, "SELECT id FROM agent_sessions WHERE id = 'branch'") == [("branch",)]


async def test_an_import_refuses_a_base_rewritten_under_the_same_message_ids(store: Store) -> None:
    """Found by an outside review: the branch's digest was of message ids alone, and a client can send a stored
    message (its id with it) again after a truncate: the import grafted the branch onto other texts."""
    await _say(store, "b", "alice", "one", "two", "three")
    await store.fork("b", user_id="alice", at_seq=1, new_id="br", share=True)
    await _say(store, "br", "alice", "branch turn")
    lines = [line async for line in store.export(user_id="alice", session_id="br")]
    async with store.session("b", user_id="alice") as session:
        two = session.state["in_memory"]["messages"][1]
    await store.delete("br", user_id="alice")
    await store.truncate("b", 0, user_id="alice")
    async with store.session("b", user_id="alice") as session:  # "two" again, under its id, with another text
        session.state["in_memory"]["messages"].append(
            Message(role="user", contents=["CHANGED TWO"], additional_properties=dict(two.additional_properties)))
    (stored,) = await rows(store, "SELECT message_id FROM agent_messages WHERE session_id = 'b' AND seq = 1")
    assert stored[0] == two.additional_properties["agent_store_id"]  # the id was taken again
    with pytest.raises(InvalidValueError, match="not the one it was exported with"):
        await store.import_lines(lines)
    assert await rows(store, "SELECT id FROM agent_sessions WHERE id = 'br'") == []


async def test_an_export_from_before_texts_were_digested_still_imports_onto_its_base(store: Store) -> None:
    import json

    from agent_store.operations import import_trees

    await _say(store, "b", "alice", "one", "two")
    await store.fork("b", user_id="alice", at_seq=0, new_id="br", share=True)
    async with store.engine.connect() as conn:
        ids_only = await import_trees.inherited(conn, "br", texts=False)
    lines = [line async for line in store.export(user_id="alice", session_id="br")]
    session = json.loads(lines[1])
    assert session["row"]["base_history"].startswith(import_trees.WITH_TEXTS)
    session["row"]["base_history"] = ids_only  # as an earlier release wrote it
    lines[1] = json.dumps(session)
    await store.delete("br", user_id="alice")
    report = await store.import_lines(lines)
    assert report.imported == 1 and await _texts(store, "br", "alice") == ["one"]
