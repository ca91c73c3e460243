"""Deleting or restarting a base never takes a live branch's history, never orphans a branch (issue 58, findings 2
and 4), on both backends.

- ``load(..., if_expired="restart")`` of an expired base whose branch is alive is refused, nothing deleted; once
  every branch expired too, the restart replaces them all.
- A delete racing a branch's creation (PostgreSQL; forced by the locks, not timed): the delete waits for the
  branch's transaction, then deletes the branch with its base; no session is left naming a base that is gone.
"""

from __future__ import annotations

import asyncio

from agent_framework import Agent
from helpers import expire_now, lock_waiters, raw_connect, rows, until

from agent_store import SessionExpiredError, Store
from agent_store.offline import OfflineChatClient


async def talk(store: Store, session_id: str, *turns: str) -> None:
    agent = Agent(client=OfflineChatClient(), name="Bot")
    for turn in turns:
        async with store.session(session_id, user_id="u") as session:
            await agent.run(turn, session=session)


async def test_a_restart_never_deletes_a_live_branch(store: Store) -> None:
    await talk(store, "base", "我叫李明", "hello")
    await store.fork("base", user_id="u", at_seq=1, new_id="branch", share=True)
    await talk(store, "branch", "我叫什么名字？")
    before = [m.text for m in await store.messages("branch", user_id="u")]
    await expire_now(store, "base")
    try:
        await store.load("base", user_id="u", if_expired="restart")
        raise AssertionError("the restart went ahead")
    except SessionExpiredError as refused:
        assert "'branch' still reads its history" in str(refused)
    assert [m.text for m in await store.messages("branch", user_id="u")] == before
    assert await rows(store, "SELECT count(*) FROM agent_messages WHERE session_id = 'base'") == [(4,)]
    await expire_now(store, "branch")  # now nothing alive reads it: the restart replaces both
    restarted = await store.load("base", user_id="u", if_expired="restart")
    assert restarted.history == []
    await restarted.discard()
    assert await rows(store, "SELECT count(*) FROM agent_sessions") == [(0,)]


async def test_a_delete_racing_a_branchs_creation_leaves_no_orphan(pg_url: str) -> None:
    async with Store.from_url(pg_url) as store:
        await store.migrate()
        await talk(store, "base", "我叫李明")
        brancher = await raw_connect(pg_url)
        try:
            # A branch being made, as branching.branch makes one: its base FOR SHARE, its row, not committed yet.
            making = brancher.transaction()
            await making.start()
            await brancher.execute("SELECT id FROM agent_sessions WHERE id = 'base' FOR SHARE")
            await brancher.execute(
                "INSERT INTO agent_sessions (id, user_id, incarnation, version, next_seq, created_at, updated_at, "
                "base_id, base_seq, base_version, keeps_history) SELECT 'racer', user_id, 7, 0, 1, now(), now(), "
                "'base', 1, version, true FROM agent_sessions WHERE id = 'base'"
            )
            deleting = asyncio.create_task(store.delete("base", user_id="u"))

            async def waits() -> bool:  # the delete is blocked on the branch's lock: an observable state
                return deleting.done() or await lock_waiters(brancher) > 0

            await until(waits, "the delete to wait for the branch's transaction")
            await making.commit()
            assert await asyncio.wait_for(deleting, 60)
        finally:
            await brancher.close()
        orphans = await rows(store, "SELECT id FROM agent_sessions s WHERE base_id IS NOT NULL AND NOT EXISTS "
                                    "(SELECT 1 FROM agent_sessions b WHERE b.id = s.base_id)")  # fmt: skip
        assert orphans == [] and await rows(store, "SELECT count(*) FROM agent_sessions") == [(0,)]
