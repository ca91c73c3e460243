"""A connection's first commits against its later ones, after `store.warm_up()` (issue 26's tail). Outside CI.

    python bench/studies/first_commit.py                       # PostgreSQL and SQLite, 21 fresh connections each

Each repetition opens a store with a pool of one connection, warms it up, then makes three turns of a new
session (its create, then a second run on it), each with two messages, a model call, and a state key of the session
and one of the user, as bench.py's turns do. Medians over the repetitions, by position on the connection: a first
commit that costs more than the later ones is a cost every new pooled connection pays once, in a burst all at once
(S2's first second in bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid

from agent_framework import Message

from agent_store import Store

USAGE = {"input_token_count": 1200, "output_token_count": 80, "total_token_count": 1280}
TURNS = 3


async def commit_times(url: str) -> list[float]:
    """Milliseconds of each commit on one new connection, in order: new session, its second run, and so on."""
    times = []
    async with Store.from_url(url, pool_size=1, max_overflow=0) as store:
        await store.warm_up(1)
        for turn in range(TURNS):
            sid = f"first-commit-{uuid.uuid4().hex}"
            for again in (False, True):
                run = await store.load(sid, user_id="user-1", history_limit=20)
                run.history.extend([Message(role="user", contents=[f"hi {turn}"]), Message(role="assistant",
                                    contents=["hello"])])  # fmt: skip
                run.add_usage(USAGE)
                run.session.state["counter" if not again else "again"] = turn
                run.session.state["user:last_seen"] = turn if not again else -turn
                started = time.perf_counter()
                await run.commit()
                times.append((time.perf_counter() - started) * 1e3)
    return times


async def one_backend(url: str, reps: int) -> list[float]:
    async with Store.from_url(url) as store:
        await store.migrate()
    runs = [await commit_times(url) for _ in range(reps)]
    return [statistics.median(run[k] for run in runs) for k in range(2 * TURNS)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("AGENT_STORE_BENCH_PG_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"),
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        found = {
            "PostgreSQL": asyncio.run(one_backend(args.pg_url, args.reps)),
            "SQLite": asyncio.run(one_backend(f"sqlite+aiosqlite:///{tmp}/first_commit.db", args.reps)),
        }
    print(f"\nMedian ms of {args.reps} new connections, each warmed up, by commit on the connection:\n")
    print("| commit | " + " | ".join(found) + " |")
    print("|---|" + "---|" * len(found))
    for k in range(2 * TURNS):
        what = f"{k + 1}: {'a new session' if k % 2 == 0 else 'its second run'}"
        print(f"| {what} | " + " | ".join(f"{times[k]:.2f}" for times in found.values()) + " |")


if __name__ == "__main__":
    main()
