"""An import grafts a branch only onto the history it was exported reading (issue 58 finding 5), on both backends:
a base truncated and written again to the same length since the export is refused, nothing imported; the base as
it was takes it, and the branch then reads what it read before."""

from __future__ import annotations

import pytest
from agent_framework import Agent

from agent_store import InvalidValueError, Store
from agent_store.offline import OfflineChatClient


async def talk(store: Store, session_id: str, *turns: str) -> None:
    agent = Agent(client=OfflineChatClient(), name="Bot")
    for turn in turns:
        async with store.session(session_id, user_id="u") as session:
            await agent.run(turn, session=session)


async def texts(store: Store, session_id: str) -> list[str]:
    run = await store.load(session_id, user_id="u")
    try:
        return [m.text for m in run.history]
    finally:
        await run.discard()


async def test_a_branch_is_grafted_only_onto_the_history_it_read(store: Store) -> None:
    await talk(store, "base", "我叫李明", "hello")
    await store.fork("base", user_id="u", at_seq=3, new_id="branch", share=True)
    await talk(store, "branch", "我叫什么名字？")
    seen = await texts(store, "branch")
    whole = [line async for line in store.export(user_id="u")]  # the base, then the branch
    branch_only = [line async for line in store.export(user_id="u", session_id="branch")]
    assert any('"base_history": "' in line for line in branch_only)
    assert await store.delete("branch", user_id="u")
    await store.truncate("base", 0, user_id="u")  # the base, written again to the same length: other messages
    await talk(store, "base", "我叫王芳", "bye")
    assert len(await store.messages("base", user_id="u")) >= 4
    try:
        await store.import_lines(branch_only)
        raise AssertionError("the branch was grafted onto a history it never read")
    except InvalidValueError as refused:
        assert "not the one it was exported with" in str(refused)
    assert [s.id for s in (await store.list_sessions(user_id="u")).items] == ["base"]
    assert await store.delete("base", user_id="u")  # the base as it was takes it: a whole export of the user
    await store.import_lines(whole)
    assert await texts(store, "branch") == seen


async def test_a_branch_line_without_its_base_history_or_reading_through_itself_is_refused(store: Store) -> None:
    """Found by an outside review: the check could be skipped by removing the digest, and a branch whose base is
    itself was imported (its delete then never ended)."""
    import json

    await talk(store, "base", "我叫李明", "hello")
    await store.fork("base", user_id="u", at_seq=3, new_id="branch", share=True)
    exported = [line async for line in store.export(user_id="u", session_id="branch")]
    assert await store.delete("branch", user_id="u")

    def edited(change: dict[str, object]) -> list[str]:
        out = []
        for line in exported:
            record = json.loads(line)
            if '"base_history"' in line:
                target = record.get("row", record)
                for key, value in change.items():
                    if value is None:
                        target.pop(key, None)
                    else:
                        target[key] = value
            out.append(json.dumps(record, ensure_ascii=False))
        return out

    for change, said in (({"base_history": None}, "must carry base_history"),
                         ({"id": "loop", "base_id": "loop"}, "not the one it was exported with")):  # fmt: skip
        with pytest.raises(InvalidValueError, match=said):
            await store.import_lines(edited(change))
        assert [s.id for s in (await store.list_sessions(user_id="u")).items] == ["base"]
