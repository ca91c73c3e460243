"""Automatic failover under load, with a real pg_auto_failover formation (tests/auto_failover.py; issue 28).

Workers run turns through one store whose URL names both data nodes (``target_session_attrs=read-write``). The
primary's machine is lost mid-load: its keeper and its postgres are SIGKILLed together. Nobody promotes by hand:
the monitor sees the node gone and promotes the secondary, and the store finds it without a restart. Every run
acknowledged as committed is there exactly once; every run that failed raised a retryable
``StorageUnavailableError`` and, retried with its run id, landed once; no session is half-written. The time from
the kill to the first committed run on the new primary is printed. The killed node's keeper, run again, brings it
back as the new primary's secondary, and commits (synchronous again) go on.

The kill takes the keeper with its postgres: a postgres killed alone is started again by its own keeper, which is
a restart in place, not the failover this rehearses.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from typing import Any

import pytest
from agent_framework import Agent
from auto_failover import Formation
from helpers import rows, until

from agent_store import StorageUnavailableError, Store

WORKERS, BEFORE, AFTER = 6, 3, 4  # sessions at once; turns each acknowledged before the kill, and after it


async def turn(store: Store, agent: Agent, sid: str, n: int) -> None:
    """Turn ``n`` of session ``sid``, under the run id a caller would keep for its retries."""
    run = await store.load(sid, user_id="u", run_id=f"{sid}-{n}")
    await agent.run(f"{sid} turn {n}", session=run.session)
    run.session.state["turns"] = run.session.state.get("turns", 0) + 1
    await run.commit()


async def test_the_orchestrator_fails_over_by_itself_and_no_acknowledged_run_is_lost(
    formation: Formation, agent: Agent, capsys: pytest.CaptureFixture[str]
) -> None:
    acked: dict[str, list[tuple[int, float]]] = defaultdict(list)  # per session: (turn, when its commit returned)
    failures: list[BaseException] = []
    warmed, killed = asyncio.Event(), asyncio.Event()
    acked_at_kill: dict[str, int] = {}

    async with Store.from_url(formation.url(), connect_args={"timeout": 3}, pool_size=WORKERS) as store:
        await store.migrate()

        async def worker(sid: str) -> None:
            n = 0
            while not (killed.is_set() and n >= acked_at_kill[sid] + AFTER):
                try:
                    await turn(store, agent, sid, n)
                except StorageUnavailableError as exc:  # retried below with the same run id
                    failures.append(exc)
                    await asyncio.sleep(0.1)
                    continue
                acked[sid].append((n, time.monotonic()))
                n += 1
                if len(acked) == WORKERS and min(len(a) for a in acked.values()) >= BEFORE:
                    warmed.set()

        sids = [f"s{i}" for i in range(WORKERS)]
        tasks = [asyncio.create_task(worker(sid)) for sid in sids]
        await asyncio.wait_for(warmed.wait(), timeout=60)
        await asyncio.to_thread(formation.kill, "node_1")  # runs are in flight
        # Counted once the node is dead (kill waits for it): a run acknowledged later is on the new primary.
        killed_at = time.monotonic()
        acked_at_kill.update({sid: len(acked[sid]) for sid in sids})
        killed.set()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=180)
        after_kill = [at for sid in sids for _, at in acked[sid][acked_at_kill[sid] :]]
        with capsys.disabled():
            print(f"\n[auto failover] kill to the first run committed on the new primary: "
                  f"{min(after_kill) - killed_at:.1f} s; {len(failures)} retryable failures on the way")  # fmt: skip
        await asyncio.to_thread(formation.wait_for, {"node_2": "wait_primary"})

        # The old primary's keeper, run again: it rejoins as the secondary, and commits wait for it again.
        await asyncio.to_thread(formation.rejoin, "node_1")
        await asyncio.to_thread(formation.wait_for, {"node_2": "primary", "node_1": "secondary"})
        await turn(store, agent, "after-rejoin", 0)

    assert failures, "the kill happened under load: some runs must have failed and been retried"
    odd = [repr(exc) for exc in failures if not (isinstance(exc, StorageUnavailableError) and exc.retryable)]
    assert not odd, odd[:3]
    assert "password" not in " ".join(str(exc) for exc in failures)
    # Checked on the new primary alone: every acknowledged turn once, in order, with its reply; no half run.
    async with Store.from_url(formation.node_url("node_2")) as promoted:
        for sid in sids:
            turns = [n for n, _ in acked[sid]]
            assert turns == list(range(len(turns)))
            texts = [m.text for m in await promoted.messages(sid, user_id="u", limit=1000)]
            assert texts[0::2] == [f"{sid} turn {n}" for n in turns]
            assert len(texts) == 2 * len(turns) and all(t.startswith("收到：") for t in texts[1::2])
            state: Any = await rows(promoted, "SELECT value FROM agent_state WHERE session_id = :s", s=sid)
            assert state == [(len(turns),)]
        runs: Any = await rows(promoted, "SELECT session_id, count(*) FROM agent_runs GROUP BY session_id")
        assert dict(runs) == {sid: len(acked[sid]) for sid in sids} | {"after-rejoin": 1}
    # The rejoined secondary has it all (it had flushed the last commit before that commit was acknowledged; its
    # replay follows within moments).
    async with Store.from_url(formation.node_url("node_1"), check_schema=False) as secondary:
        every_run = [(sum(len(a) for a in acked.values()) + 1,)]

        async def replayed() -> bool:
            return bool(await rows(secondary, "SELECT count(*) FROM agent_runs") == every_run)

        await until(replayed, "the rejoined secondary to replay every run")
