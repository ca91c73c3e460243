"""1,000 streamed runs (issue 39's "done when"), on both backends: two writer processes stream 500 runs each while
readers follow them through one worker's Store, are cut off after a random number of events, and reconnect to
another worker's Store from the last event they saw: every run's every event arrives exactly once, in order."""

from __future__ import annotations

import asyncio
import os
import random
import sys
from pathlib import Path

from agent_store import Store, StreamNotFoundError
from agent_store.journal import Journal

HERE = Path(__file__).resolve().parent
RUNS, EVENTS = 500, 12  # per writer process


async def read_with_a_cut(first: Journal, second: Journal, stream_id: str, rng: random.Random) -> list[int]:
    """Follow through ``first`` until cut after a random number of events, then through ``second`` from there."""
    got: list[int] = []
    cut_at = rng.randint(1, EVENTS)
    for journal, limit in ((first, cut_at), (second, None)):
        while True:
            try:
                async for item in journal.follow(stream_id, user_id="u", after=got[-1] if got else 0):
                    assert item.event["n"] == item.seq and item.event["run"] == stream_id
                    got.append(item.seq)
                    if limit is not None and len(got) >= limit:
                        break  # the client goes away here
                break
            except StreamNotFoundError:
                await asyncio.sleep(0.02)  # its writer has not started it yet
    return got


async def test_a_thousand_runs_read_through_cuts_each_get_every_event_once(url: str) -> None:
    async with Store.from_url(url) as setup:
        await setup.migrate()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writers = [await asyncio.create_subprocess_exec(sys.executable, str(HERE / "journal_runs.py"), url, f"w{n}",
                                                    f"p{n}", str(RUNS), str(EVENTS), env=env)
               for n in range(2)]  # fmt: skip
    rng = random.Random(39)
    names = [f"p{n}-{i}" for i in range(RUNS) for n in range(2)]
    async with Store.from_url(url) as one_worker, Store.from_url(url) as another:
        first, second = one_worker.journal(poll_s=0.02), another.journal(poll_s=0.02)
        results: dict[str, list[int]] = {}
        gate = asyncio.Semaphore(50)

        async def one(name: str) -> None:
            async with gate:
                results[name] = await asyncio.wait_for(read_with_a_cut(first, second, name, rng), 120)

        await asyncio.gather(*(one(name) for name in names))
        for journal in (first, second):
            await journal.close()
    assert [await w.wait() for w in writers] == [0, 0]
    assert len(results) == 2 * RUNS
    wrong = {name: got for name, got in results.items() if got != list(range(1, EVENTS + 1))}
    assert not wrong, list(wrong.items())[:3]
