"""A reduced soak (the full one is `bench/studies/soak.py`, 10,000 runs): zero errors, no leaked connection, flat
memory."""

from __future__ import annotations

import gc
import sys
import weakref
from pathlib import Path

from agent_framework import Agent

from agent_store import Store

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench" / "studies"))
from soak import soak


async def test_a_reduced_soak(url: str) -> None:
    report = await soak(url, runs=1500, sessions=30, workers=16)
    assert report.errors == []
    assert (report.messages, report.counter_total) == (3000, 1500)
    assert report.pool_checked_out == 0 and report.pool_checked_in > 0
    assert 0 < report.p99_ms < report.seconds * 1e3  # measured, per run
    # As many connections as workers: a run holds one at a time, so a checkout finds the pool full only in the
    # moment a finished run's connection is still on its way back (a leak or a second connection per run: every run)
    assert report.pool_waits <= report.runs // 100, report.pool_waits
    middle, last = report.rss_mib[len(report.rss_mib) // 2][1], report.rss_mib[-1][1]
    assert last - middle < 15, report.rss_mib  # MiB over the second half of the runs


async def test_a_finished_session_is_freed(store: Store, agent: Agent) -> None:
    async with store.session("s", user_id="u") as session:
        await agent.run("hi", session=session)
    alive = weakref.ref(session)
    del session
    gc.collect()
    assert alive() is None  # the run <-> session link does not pin sessions (the soak found that leak)
