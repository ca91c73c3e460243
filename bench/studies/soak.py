"""Soak: many runs over a few sessions with many workers; zero errors, no leaked connections, flat memory.

    python bench/studies/soak.py --url postgresql+asyncpg://postgres@127.0.0.1:5432/soak \
        --runs 10000 --sessions 100 --workers 32

Each run loads a session, runs the real Agent with the offline client (2 messages), increments a per-session
counter through retry_on_conflict, and commits. Afterwards every message and counter is accounted for.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import time
from dataclasses import dataclass, field
from typing import Any

from agent_framework import Agent, AgentSession
from sqlalchemy import text

from agent_store import Store, retry_on_conflict
from agent_store.offline import OfflineChatClient


def rss_mib() -> float:
    with open(f"/proc/{os.getpid()}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class SoakReport:
    runs: int
    seconds: float
    errors: list[str]
    retries: int
    rss_mib: list[tuple[int, float]] = field(default_factory=list)  # (runs done, RSS) samples
    pool_checked_out: int = -1
    pool_checked_in: int = -1
    messages: int = 0
    counter_total: int = 0
    p99_ms: float = 0.0  # one run's latency (conflict retries included)
    pool_wait_ms: float = 0.0  # total time runs waited for a pooled connection
    pool_waits: int = 0  # checkouts that found every pooled connection busy (structural, not timed)


async def soak(url: str, *, runs: int, sessions: int, workers: int, fresh: bool = True) -> SoakReport:
    agent = Agent(client=OfflineChatClient(), name="Soak")
    report = SoakReport(runs=runs, seconds=0.0, errors=[], retries=0)
    jobs: asyncio.Queue[int] = asyncio.Queue()
    for n in range(runs):
        jobs.put_nowait(n % sessions)
    done = 0
    attempts = 0

    async with Store.from_url(url, pool_size=workers, max_overflow=0) as store:
        await store.migrate()
        if fresh:
            async with store.engine.begin() as conn:
                await conn.execute(text("DELETE FROM agent_sessions WHERE id LIKE 'soak-%'"))

        async def one_run(session: AgentSession) -> None:
            nonlocal attempts
            attempts += 1
            session.state["counter"] = session.state.get("counter", 0) + 1
            await agent.run("soak", session=session)

        latencies: list[float] = []
        pool = store.engine.sync_engine.pool
        waiting = pool._do_get  # type: ignore[attr-defined]  # where QueuePool waits for a free connection

        def timed_get() -> Any:
            # Counted by the pool's state, not by time: on a busy machine a checkout that opens a connection or
            # meets a garbage collection takes milliseconds without waiting for anyone.
            report.pool_waits += pool.checkedin() == 0 and pool.checkedout() >= pool.size()
            started = time.perf_counter()
            try:
                return waiting()
            finally:
                report.pool_wait_ms += (time.perf_counter() - started) * 1e3

        pool._do_get = timed_get  # type: ignore[attr-defined]

        async def worker() -> None:
            nonlocal done
            while not jobs.empty():
                n = jobs.get_nowait()
                started = time.perf_counter()
                try:
                    await retry_on_conflict(store, f"soak-{n}", one_run, user_id="soak", history_limit=20, attempts=100)
                except Exception as exc:  # counted and reported: the soak's verdict is "zero errors"
                    report.errors.append(f"{type(exc).__name__}: {exc}")
                latencies.append(time.perf_counter() - started)
                done += 1
                if done % max(1, runs // 10) == 0:
                    gc.collect()
                    report.rss_mib.append((done, round(rss_mib(), 1)))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(workers)))
        report.seconds = time.perf_counter() - started
        report.retries = attempts - runs
        report.p99_ms = sorted(latencies)[int(0.99 * (len(latencies) - 1))] * 1e3
        pool = store.engine.pool
        report.pool_checked_out, report.pool_checked_in = pool.checkedout(), pool.checkedin()  # type: ignore[attr-defined]
        async with store.engine.connect() as conn:
            report.messages = (await conn.execute(
                text("SELECT count(*) FROM agent_messages WHERE session_id LIKE 'soak-%'"))).scalar_one()  # fmt: skip
            values = await conn.execute(
                text("SELECT value FROM agent_state WHERE key = 'counter' AND session_id LIKE 'soak-%'")
            )
            report.counter_total = sum(int(v) for (v,) in values.all())
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=os.environ.get("AGENT_STORE_URL", "sqlite+aiosqlite:///soak.db"))
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--workers", type=int, default=32)
    args = parser.parse_args()
    r = asyncio.run(soak(args.url, runs=args.runs, sessions=args.sessions, workers=args.workers))
    print("| runs | sessions | workers | seconds | runs/s | p99 ms/run | pool ms (checkouts that found it full) | "
          "retries | errors | messages | counters | pool out/in |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    cells = [r.runs, args.sessions, args.workers, f"{r.seconds:.1f}", f"{r.runs / r.seconds:.0f}", f"{r.p99_ms:.1f}",
             f"{r.pool_wait_ms:.0f} ({r.pool_waits})", r.retries, len(r.errors), r.messages, r.counter_total,
             f"{r.pool_checked_out}/{r.pool_checked_in}"]  # fmt: skip
    print("| " + " | ".join(map(str, cells)) + " |")
    print("\nRSS (MiB) after N runs: " + ", ".join(f"{n}: {m}" for n, m in r.rss_mib))
    for error in r.errors[:10]:
        print("error:", error)
    ok = not r.errors and r.messages == 2 * r.runs and r.counter_total == r.runs and r.pool_checked_out == 0
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
