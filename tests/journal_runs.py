"""A worker streaming many runs into the journal (tests/test_journal_many.py).

``python tests/journal_runs.py URL WORKER PREFIX RUNS EVENTS``: RUNS runs named PREFIX-0, PREFIX-1, ..., 25 at a
time, each EVENTS events a few milliseconds apart, then exits."""

from __future__ import annotations

import asyncio
import random
import sys

from agent_store import Store


async def one(journal: object, stream_id: str, events: int) -> None:
    async with await journal.start(stream_id, user_id="u", kind="updates") as writer:  # type: ignore[attr-defined]
        for n in range(1, events + 1):
            await writer.append({"run": stream_id, "n": n})
            if random.random() < 0.3:
                await asyncio.sleep(random.uniform(0.001, 0.01))


async def main(url: str, worker: str, prefix: str, runs: int, events: int) -> None:
    async with Store.from_url(url) as store:
        journal = store.journal(worker_id=worker, batch_events=8, batch_ms=5)
        names = [f"{prefix}-{n}" for n in range(runs)]
        for start in range(0, runs, 25):
            await asyncio.gather(*(one(journal, name, events) for name in names[start : start + 25]))
        await journal.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])))
