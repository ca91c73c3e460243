"""A soak that looks like production: workers through PgBouncer, an automatic failover in the middle (issue 28).

    python bench/studies/failover_soak.py --minutes 10 --workers 32

It starts its own pg_auto_failover formation (tests/auto_failover.py: monitor, primary, secondary on free ports,
never the machine's server) and its own PgBouncer (transaction pooling) in front of the primary. Workers run turns
through one ``Store`` on PgBouncer's URL, each on sessions of its own, each turn under a run id it keeps for its
retries. Halfway, the primary's keeper and postgres are SIGKILLed. The monitor promotes the secondary; a watcher
(the operator's failover hook: PgBouncer does not follow a failover by itself) re-points PgBouncer at it and
RELOADs. Printed: per interval, the runs, p50/p99 of a turn (its retries included), the failed attempts, the
client's RSS and PgBouncer's server connections; then, checked on the new primary, that every acknowledged run is
there exactly once. ``tests/test_failover_soak.py`` runs one minute of it in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_framework import Agent
from soak import rss_mib
from sqlalchemy import text

from agent_store import StorageUnavailableError, Store
from agent_store.offline import OfflineChatClient

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from auto_failover import Bouncer, Formation

SESSIONS_PER_WORKER = 4


@dataclass
class Interval:
    start: float  # seconds since the soak began
    runs: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    failed_attempts: int
    rss_mib: float
    server_connections: int


@dataclass
class SoakReport:
    seconds: float
    intervals: list[Interval] = field(default_factory=list)
    acked: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # per session: turns acknowledged
    # Each failed attempt's error: (type name, whether retryable, message); not the exception, whose traceback
    # would keep the failed turn's frames alive.
    failures: list[tuple[str, bool, str]] = field(default_factory=list)
    kill_to_first_commit: float | None = None  # seconds
    stored_runs: dict[str, int] = field(default_factory=dict)  # per session, on the new primary
    stored_messages: dict[str, int] = field(default_factory=dict)
    stored_counters: dict[str, int] = field(default_factory=dict)
    pool_checked_out: int = -1

    def lost_or_doubled(self) -> list[str]:
        """Sessions whose stored runs, messages or counter differ from what was acknowledged."""

        def kept(s: str) -> bool:
            acked = self.acked.get(s)
            return (
                self.stored_runs.get(s) == acked == self.stored_counters.get(s) == self.stored_messages.get(s, 0) // 2
            )

        return sorted(s for s in set(self.acked) | set(self.stored_runs) if not kept(s))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3 if ordered else 0.0


async def turn(store: Store, agent: Agent, sid: str, run_id: str) -> None:
    run = await store.load(sid, user_id="soak", run_id=run_id, history_limit=20)
    await agent.run("soak", session=run.session)
    run.session.state["counter"] = run.session.state.get("counter", 0) + 1
    await run.commit()


async def watch(formation: Formation, bouncer: Bouncer, stop: asyncio.Event) -> None:
    """The failover hook: when another node is the formation's primary, PgBouncer is moved to it."""
    while not stop.is_set():
        states = await asyncio.to_thread(formation.states)
        for node, (reported, assigned) in states.items():
            port = formation.ports[node]
            if reported == assigned and reported in ("wait_primary", "primary") and port != bouncer.target_port:
                await asyncio.to_thread(bouncer.repoint, port)
        await asyncio.sleep(0.5)


async def failover_soak(formation: Formation, bouncer: Bouncer, *, seconds: float, workers: int,
                        interval: float) -> SoakReport:  # fmt: skip
    agent = Agent(client=OfflineChatClient(), name="Soak")
    report = SoakReport(seconds=seconds)
    # This interval's turn times and failed attempts, emptied by each sample: the harness keeps no growing record
    # of its own, so the RSS it prints is the store's.
    latencies: list[float] = []
    attempts_failed = [0]
    stop, killed_at = asyncio.Event(), [0.0]
    begin = time.monotonic()
    end = begin + seconds

    async with Store.from_url(bouncer.url(), pool_size=workers, max_overflow=0, connect_args={"timeout": 3}) as store:
        await store.migrate()

        async def worker(w: int) -> None:
            n = 0
            while time.monotonic() < end:
                sid, run_id, started = f"soak-{w}-{n % SESSIONS_PER_WORKER}", f"w{w}-{n}", time.monotonic()
                while True:  # a failed turn is retried with its run id until it lands (once)
                    try:
                        await turn(store, agent, sid, run_id)
                        break
                    except StorageUnavailableError as exc:
                        report.failures.append((type(exc).__name__, exc.retryable, str(exc)))
                        attempts_failed[0] += 1
                        if time.monotonic() > end + 120:
                            raise
                        await asyncio.sleep(0.1)
                now = time.monotonic()
                latencies.append(now - started)
                report.acked[sid] += 1
                if killed_at[0] and report.kill_to_first_commit is None and started > killed_at[0]:
                    report.kill_to_first_commit = now - killed_at[0]
                n += 1

        async def sampler() -> None:
            mark = begin
            while not stop.is_set():
                await asyncio.sleep(interval)
                now = time.monotonic()
                done, failed = latencies[:], attempts_failed[0]
                latencies.clear()
                attempts_failed[0] = 0
                gc.collect()
                connections = await asyncio.to_thread(bouncer.server_connections)
                times = (_pct(done, 0.5), _pct(done, 0.99), _pct(done, 1.0))
                report.intervals.append(Interval(round(mark - begin), len(done), *times, failed, round(rss_mib(), 1),
                                                 connections))  # fmt: skip
                mark = now

        async def kill_halfway() -> None:
            await asyncio.sleep(seconds / 2)
            await asyncio.to_thread(formation.kill, "node_1")
            killed_at[0] = time.monotonic()  # the node is dead: a turn started from now on lands on the new primary

        background = [asyncio.create_task(c) for c in (watch(formation, bouncer, stop), sampler(), kill_halfway())]
        try:
            await asyncio.gather(*(worker(w) for w in range(workers)))
        finally:
            stop.set()
            await asyncio.gather(*background, return_exceptions=True)
        report.pool_checked_out = store.engine.pool.checkedout()  # type: ignore[attr-defined]

    # Checked on the new primary alone, not through PgBouncer.
    async with Store.from_url(formation.node_url("node_2"), check_schema=False) as primary:
        async with primary.engine.connect() as conn:
            for name, sql in (
                ("stored_runs", "SELECT session_id, count(*) FROM agent_runs GROUP BY session_id"),
                ("stored_messages", "SELECT session_id, count(*) FROM agent_messages GROUP BY session_id"),
                ("stored_counters", "SELECT session_id, CAST(value AS TEXT) FROM agent_state WHERE key = 'counter'"),
            ):
                found: Any = (await conn.execute(text(sql))).all()
                setattr(report, name, {sid: int(value) for sid, value in found})
    return report


def print_report(report: SoakReport, workers: int) -> None:
    print(f"{workers} workers through PgBouncer for {report.seconds:.0f} s; the primary killed at "
          f"{report.seconds / 2:.0f} s; kill to the first commit on the new primary: "
          f"{report.kill_to_first_commit or float('nan'):.1f} s")  # fmt: skip
    print("\n| from s | runs | p50 ms | p99 ms | max ms | failed attempts | RSS MiB | PgBouncer server connections |")
    print("|---|---|---|---|---|---|---|---|")
    for i in report.intervals:
        print(f"| {i.start} | {i.runs} | {i.p50_ms:.1f} | {i.p99_ms:.1f} | {i.max_ms:.0f} | {i.failed_attempts} "
              f"| {i.rss_mib} | {i.server_connections} |")  # fmt: skip
    acked = sum(report.acked.values())
    print(f"\nacknowledged runs: {acked}; stored: {sum(report.stored_runs.values())}; sessions lost or doubled: "
          f"{report.lost_or_doubled() or 'none'}; failed attempts (all retryable, all retried): "
          f"{len(report.failures)}; store pool checked out at the end: {report.pool_checked_out}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--workers", type=int, default=32)
    args = parser.parse_args()

    async def soak() -> SoakReport:
        with Formation() as formation:
            bouncer = Bouncer(formation.ports["node_1"], pool_size=args.workers + 8)
            try:
                return await failover_soak(formation, bouncer, seconds=args.minutes * 60, workers=args.workers,
                                           interval=60 if args.minutes >= 5 else 10)  # fmt: skip
            finally:
                bouncer.destroy()

    report = asyncio.run(soak())
    print_report(report, args.workers)
    raise SystemExit(1 if report.lost_or_doubled() else 0)


if __name__ == "__main__":
    main()
