"""Where S2's tail goes (issue 43): each run of S2 (200 sessions x 10 turns, 32 workers, a 32-connection pool
opened before timing) split into the parts it waits on, for all runs and for the slowest 1%.

    python bench/studies/s2_tail.py     # a private PostgreSQL server (initdb in a temp dir) with pg_stat_statements

Each run's time on the client, in parts that add up to it:
- pool: in agent_store's ``checkout`` (SQLAlchemy's pool handing over a connection);
- load trip / commit trip: the load's statement and the commit's one call, from sending to the task resuming
  with the reply (the server's work, the network, and the event loop getting round to the task);
- load rest / commit rest: the rest of ``load()`` and ``commit()``: decoding, building the payload, handing the
  connection back, and waiting for the event loop after each of those awaits;
- other: the run's own few lines between them.
Across those parts: the collector's pauses that fell inside the run (gen0-gen2; every task waits through them).
And the whole: the client's CPU per run and how busy it was (with 32 runs in flight on one event loop, a run
mostly waits for the other 31: Little's law), the server's own statement times (``pg_stat_statements``: mean
and max, lock waits included) and a sampler of lock requests not granted (``pg_locks``, every 5 ms).

The wrapping of ``checkout`` and ``DriverPath.fetch`` is this script's instrumentation: it times the library's
own calls, it changes none of them.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the suite's scenarios.py, floor.py, peers.py

import asyncpg
from scenarios import USAGE, messages, pct

import agent_store.db.database as database
from agent_store import Store
from agent_store.db.driver_path import DriverPath

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from throwaway_pg import ThrowawayCluster

PARTS = ("pool", "load trip", "load rest", "commit trip", "commit rest", "other")
pauses: list[tuple[float, float, int]] = []  # the collector's pauses: start, end, generation
# The machine's server settings that matter here (the throwaway's defaults are for fault tests: fsync off).
SERVER = ("-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all -c fsync=on "
          "-c shared_buffers=128MB -c max_connections=100")  # fmt: skip
current: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar("current", default=None)
phase: contextvars.ContextVar[str] = contextvars.ContextVar("phase", default="other")


def instrument() -> None:
    checkout, fetch = database.checkout, DriverPath.fetch

    async def timed_checkout(engine: Any) -> Any:
        started = time.perf_counter()
        try:
            return await checkout(engine)
        finally:
            if (record := current.get()) is not None:
                record[f"{phase.get()} pool"] = record.get(f"{phase.get()} pool", 0.0) + time.perf_counter() - started

    async def timed_fetch(self: DriverPath, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await fetch(self, *args, **kwargs)
        finally:
            if (record := current.get()) is not None:
                record[f"{phase.get()} trip"] += time.perf_counter() - started

    database.checkout = timed_checkout  # type: ignore[assignment]
    DriverPath.fetch = timed_fetch  # type: ignore[method-assign]


async def one_run(store: Store, sid: str, n: int) -> dict[str, float]:
    record = dict.fromkeys(PARTS, 0.0)
    current.set(record)
    began = time.perf_counter()
    phase.set("load")
    run = await store.load(sid, user_id=f"user-{sid}", history_limit=20)
    loaded = time.perf_counter()
    phase.set("other")
    run.history.extend(messages(n))
    run.add_usage(USAGE)
    run.session.state["counter"] = n
    run.session.state["user:last_seen"] = n
    phase.set("commit")
    committing = time.perf_counter()
    await run.commit()
    ended = time.perf_counter()
    load_pool, commit_pool = record.pop("load pool", 0.0), record.pop("commit pool", 0.0)
    record["pool"] = load_pool + commit_pool
    record["load rest"] = loaded - began - load_pool - record["load trip"]
    record["commit rest"] = ended - committing - commit_pool - record["commit trip"]
    record["total"] = ended - began
    record["other"] = record["total"] - sum(record[p] for p in PARTS if p != "other")
    record["began"], record["ended"] = began, ended
    return record


def collector_timer() -> None:
    started = [0.0]

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((started[0], time.perf_counter(), info["generation"]))

    gc.callbacks.append(timed)


def in_pauses(record: dict[str, float], generation: int) -> float:
    """Seconds of the collector's pauses (of this generation) inside the run: every task waits through them."""
    return sum(max(0.0, min(e, record["ended"]) - max(b, record["began"])) for b, e, g in pauses if g == generation)


async def sampler(dsn: str, stop: asyncio.Event, seen: list[int]) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        while not stop.is_set():
            seen.append(await conn.fetchval("SELECT count(*) FROM pg_locks WHERE NOT granted"))
            await asyncio.sleep(0.005)
    finally:
        await conn.close()


async def main() -> None:
    with ThrowawayCluster(SERVER) as pg:
        pg.create_database("tail")
        url = pg.url("tail")
        async with Store.from_url(url) as store:
            await store.migrate()
        admin = await asyncpg.connect(pg.dsn("tail"))
        await admin.execute("CREATE EXTENSION pg_stat_statements")
        instrument()
        async with Store.from_url(url, pool_size=32, max_overflow=0) as store:
            await store.warm_up()
            for n in range(3):  # the statements prepared and planned on the pool's connections, as in S2's warm-up
                await one_run(store, "warm", n)
            await admin.execute("SELECT pg_stat_statements_reset()")
            jobs: asyncio.Queue[int] = asyncio.Queue()
            for n in range(200):
                jobs.put_nowait(n)
            records: list[dict[str, float]] = []

            async def worker() -> None:
                while not jobs.empty():
                    n = jobs.get_nowait()
                    for turn in range(10):
                        records.append(await one_run(store, f"s2-{n}", turn))

            stop, locks = asyncio.Event(), []
            watching = asyncio.create_task(sampler(pg.dsn("tail"), stop, locks))
            collector_timer()
            cpu, wall = time.process_time(), time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(32)))
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            stop.set()
            await watching
        server = await admin.fetch(
            "SELECT calls, mean_exec_time, max_exec_time, left(regexp_replace(query, '\\s+', ' ', 'g'), 60) AS q "
            "FROM pg_stat_statements WHERE calls >= 1000 ORDER BY total_exec_time DESC LIMIT 4"
        )
        await admin.close()
    for record in records:
        for generation in (0, 1, 2):
            record[f"gen{generation}"] = in_pauses(record, generation)
    totals = sorted(r["total"] for r in records)
    cut = pct(totals, 0.99)
    tail = [r for r in records if r["total"] >= cut]
    waiting = sum(1 for s in locks if s)
    print(f"S2 on a private PostgreSQL server: {len(records)} runs in {wall:.2f} s ({len(records) / wall:.0f} runs/s), "
          f"p50 {pct(totals, 0.5) * 1e3:.1f} ms, p99 {cut * 1e3:.1f} ms")
    print(f"- the client: {cpu / len(records) * 1e3:.2f} ms of CPU a run, busy {cpu / wall:.0%} of the time: with 32 "
          f"runs in flight, a run waits for the others' CPU (Little's law: 32 / throughput = "
          f"{32 / (len(records) / wall) * 1e3:.1f} ms, against a mean of {statistics.mean(totals) * 1e3:.1f})")
    print(f"- lock requests not granted on the server: {waiting} of {len(locks)} samples (every 5 ms)")
    gen2 = [e - b for b, e, g in pauses if g == 2]
    print(f"- full collections during S2: {len(gen2)}, {sum(gen2) * 1e3:.0f} ms in all\n")
    print("| part (client side) | mean ms, all runs | mean ms, slowest 1% | share of the slowest 1% |")
    print("|---|---|---|---|")
    for part in (*PARTS, "total", "gen0", "gen1", "gen2"):
        every, slow = statistics.mean(r[part] for r in records), statistics.mean(r[part] for r in tail)
        share = slow / statistics.mean(r["total"] for r in tail)
        print(f"| {part} | {every * 1e3:.2f} | {slow * 1e3:.2f} | {share:.0%} |")
    print("\n| statement (server) | calls | mean ms | max ms |\n|---|---|---|---|")
    for row in server:
        print(f"| `{row['q']}` | {row['calls']} | {row['mean_exec_time']:.2f} | {row['max_exec_time']:.2f} |")


if __name__ == "__main__":
    asyncio.run(main())
