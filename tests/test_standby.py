"""A real primary and hot standby (tests/standby_pair.py): replica reads and their lag, and failover.

What a user sees: reads sent to ``replica_url`` may lag (and are shown lagging here, with replay paused), runs
never do (they load and commit on the primary). When the primary dies, replica reads go on, runs fail with a
retryable StorageUnavailableError and write nothing; once the standby is promoted, a store whose URL names both
hosts (``target_session_attrs=read-write``) finds it by itself, every acknowledged run is there, and a run
retried with its ``run_id`` lands once.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import asyncpg
import pytest
from agent_framework import Agent
from helpers import rows, until
from standby_pair import StandbyPair

from agent_store import SessionNotFoundError, StorageUnavailableError, Store


def both_hosts(pair: StandbyPair) -> str:
    """One URL naming the primary and the standby: asyncpg connects to whichever accepts writes."""
    hosts = f"host=127.0.0.1:{pair.primary.port}&host=127.0.0.1:{pair.standby.port}"
    return f"postgresql+asyncpg://postgres@/postgres?{hosts}&target_session_attrs=read-write"


async def turn(store: Store, agent: Agent, sid: str, text: str, run_id: str | None = None) -> int:
    """One run: the agent answers ``text``; the state counts the runs. Returns the new count."""
    run = await store.load(sid, user_id="u", run_id=run_id)
    await agent.run(text, session=run.session)
    run.session.state["turns"] = count = run.session.state.get("turns", 0) + 1
    await run.commit()
    return int(count)


async def test_replica_reads_lag_while_replay_is_paused_and_runs_do_not(
    standby_pair: StandbyPair, agent: Agent
) -> None:
    pair = standby_pair
    async with Store.from_url(pair.primary.url(), replica_url=pair.standby.url()) as store:
        await store.migrate()
        await turn(store, agent, "old", "我叫李明")
        await asyncio.to_thread(pair.wait_replayed)
        assert [s.id for s in (await store.list_sessions(user_id="u")).items] == ["old"]

        await asyncio.to_thread(pair.pause_replay)
        try:
            # Runs load and commit on the primary: each sees the one before, paused replica or not.
            assert await turn(store, agent, "old", "第二次") == 2
            assert await turn(store, agent, "old", "第三次") == 3
            await turn(store, agent, "new", "hello")
            # Reads from the replica show the state of the last replayed commit: the documented lag.
            listed = {s.id: s.message_count for s in (await store.list_sessions(user_id="u")).items}
            assert listed == {"old": 2}
            assert [m.seq for m in await store.messages("old", user_id="u")] == [0, 1]
            assert (await store.stats())["rows"]["agent_messages"] == 2
            assert [h.session_id for h in (await store.search("hello", user_id="u")).items] == []  # not replayed
            assert len((await store.search("第二次", user_id="u")).items) == 0
            exported = [line async for line in store.export(user_id="u")]
            assert not any('"new"' in line for line in exported)
            # What must be current (a run's view) is: the primary, through a store without replica_url.
            async with Store.from_url(pair.primary.url()) as fresh:
                assert {s.id for s in (await fresh.list_sessions(user_id="u")).items} == {"old", "new"}
        finally:
            await asyncio.to_thread(pair.resume_replay)
        await asyncio.to_thread(pair.wait_replayed)
        listed = {s.id: s.message_count for s in (await store.list_sessions(user_id="u")).items}
        assert listed == {"old": 6, "new": 2}
        assert {h.session_id for h in (await store.search("hello", user_id="u")).items} == {"new"}


async def test_failover_loses_no_acknowledged_run_and_retries_land_once(
    standby_pair: StandbyPair, agent: Agent
) -> None:
    pair = standby_pair
    workers, before, after = 4, 3, 3
    acked: dict[str, list[int]] = defaultdict(list)  # per session, the turns whose commit returned
    failures: list[StorageUnavailableError] = []
    warmed, failing, promoted = asyncio.Event(), asyncio.Event(), asyncio.Event()
    acked_at_stop: dict[str, list[int]] = {}

    async with Store.from_url(
        both_hosts(pair), replica_url=pair.standby.url(), connect_args={"timeout": 3}, pool_size=workers
    ) as store:
        await store.migrate()

        async def worker(sid: str) -> None:
            n = 0
            while not (promoted.is_set() and n >= len(acked_at_stop.get(sid, [])) + after):
                try:  # a failed turn is retried with its run_id: it lands once whether or not it had landed
                    await turn(store, agent, sid, f"{sid} turn {n}", run_id=f"{sid}-{n}")
                except StorageUnavailableError as exc:
                    failures.append(exc)
                    if len(failures) >= workers:
                        failing.set()
                    await asyncio.sleep(0.05)
                    continue
                acked[sid].append(n)
                n += 1
                if len(acked) == workers and min(len(a) for a in acked.values()) >= before:
                    warmed.set()

        sids = [f"s{i}" for i in range(workers)]
        tasks = [asyncio.create_task(worker(sid)) for sid in sids]
        await asyncio.wait_for(warmed.wait(), timeout=60)
        await asyncio.to_thread(pair.primary.stop, "immediate")  # a crash: runs are in flight
        acked_at_stop.update({sid: list(acked[sid]) for sid in sids})

        # The primary is gone, the standby not yet promoted: reads from the replica go on, from a store opened
        # now as well (it checks the schema on the replica, not on the dead primary) ...
        listed = {s.id for s in (await store.list_sessions(user_id="u")).items}
        assert listed <= set(sids) and len(listed) >= 1
        async with Store.from_url(pair.primary.url(), replica_url=pair.standby.url()) as opened_now:
            assert {s.id for s in (await opened_now.list_sessions(user_id="u")).items} == listed
        # ... and runs fail, retryably, until the promotion.
        await asyncio.wait_for(failing.wait(), timeout=60)
        assert all(exc.retryable for exc in failures)
        assert "password" not in " ".join(str(exc) for exc in failures)
        await asyncio.to_thread(pair.promote)
        promoted.set()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)

    # Checked on the promoted standby alone: every acknowledged turn once, in order, with its reply; no half run.
    async with Store.from_url(pair.standby.url()) as promoted_store:
        for sid in sids:
            assert acked[sid][: len(acked_at_stop[sid])] == acked_at_stop[sid]
            turns = len(acked[sid])
            texts = [m.text for m in await promoted_store.messages(sid, user_id="u", limit=1000)]
            assert texts[0::2] == [f"{sid} turn {n}" for n in range(turns)]
            assert len(texts) == 2 * turns and all(t.startswith("收到：") for t in texts[1::2])
            state: Any = await rows(promoted_store, "SELECT value FROM agent_state WHERE session_id = :s", s=sid)
            assert state == [(turns,)]
        duplicated = await rows(
            promoted_store,
            "SELECT run_id FROM agent_runs WHERE outcome = 'committed' GROUP BY run_id HAVING count(*) > 1",
        )
        assert duplicated == []
        assert await turn(promoted_store, agent, "after", "hello") == 1  # the promoted server's own URL works too


async def test_a_first_run_lost_with_the_primary_is_retried_by_loading_it_again(
    standby_pair: StandbyPair, agent: Agent
) -> None:
    """The COMMIT that would create a session reaches the primary but not the standby (stopped: the commit waits
    for it), the primary dies, the standby is promoted. The Run's own retry cannot tell "never landed" from
    "landed, then deleted": it refuses and says how to retry; loading again with the run_id lands it once."""
    pair = standby_pair
    async with Store.from_url(both_hosts(pair), connect_args={"timeout": 3}) as store:
        await store.migrate()
        await asyncio.to_thread(pair.standby.stop)
        run = await store.load("new", user_id="u", run_id="request-1")
        await agent.run("我叫李明", session=run.session)
        commit = asyncio.create_task(run.commit())
        watcher = await asyncpg.connect(pair.primary.dsn())
        try:  # the COMMIT is sent and waits for the synchronous standby

            async def waits_for_the_standby() -> bool:
                return commit.done() or bool(await watcher.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"))  # fmt: skip

            await until(waits_for_the_standby, "the commit to wait for the standby")
        finally:
            await watcher.close()
        assert not commit.done()
        await asyncio.to_thread(pair.primary.stop, "immediate")
        with pytest.raises(StorageUnavailableError) as lost:
            await commit
        assert lost.value.retryable
        await asyncio.to_thread(pair.standby.start)
        await asyncio.to_thread(pair.promote)
        with pytest.raises(SessionNotFoundError, match=r"store\.load\(\.\.\., run_id=\.\.\.\)"):
            await run.commit()
        again = await store.load("new", user_id="u", run_id="request-1")
        await agent.run("我叫李明", session=again.session)
        await again.commit()
        again = await store.load("new", user_id="u", run_id="request-1")  # once more: lands nothing new
        await agent.run("我叫李明", session=again.session)
        await again.commit()
        assert [m.text for m in await store.messages("new", user_id="u")][0::2] == ["我叫李明"]
