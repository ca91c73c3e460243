"""A worker writing a run's journal, to be SIGKILLed mid-run (tests/test_journal.py).

``python tests/journal_writer.py URL WORKER STREAM``: starts the stream, writes events one by one, each flushed,
and prints the last written sequence number after each, until killed."""

from __future__ import annotations

import asyncio
import sys

from agent_store import Store


async def main(url: str, worker: str, stream: str) -> None:
    async with Store.from_url(url) as store:
        journal = store.journal(worker_id=worker, lease_s=1.5)
        writer = await journal.start(stream, user_id="u", kind="updates")
        n = 0
        while True:
            n = await writer.append({"type": "tool_result", "n": n + 1})
            await writer.flush()
            print(n, flush=True)
            await asyncio.sleep(0.02)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
