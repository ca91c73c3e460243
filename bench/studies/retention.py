"""Retention at 10,000,000 rows: batched deletes against dropping daily partitions (issue 28). PostgreSQL; outside CI.

    python bench/studies/retention.py                # 100,000 checkpoints, then 10,000,000 (about 40 minutes here)
    python bench/studies/retention.py --scales 100000 1000000

Checkpoints are the one table agent_store purges by age (`purge_checkpoints`); the run log and the usage ledger
go with their session (`purge_expired`, measured by ten_million.py). For each scale, a fresh database at head holds
that many checkpoints: 100 per workflow, 10 workflows a user, saved over the last 30 days, with a JSON payload of
about 300 bytes. Beside the store's `agent_checkpoints`, the same rows go into `agent_checkpoints_by_day`, a copy
partitioned by day with pg_partman (`postgresql-15-partman`). Its keys must include `saved_at`: PostgreSQL has no
unique index across partitions.

Then the oldest day goes, both ways:

- pg_partman's retention (`run_maintenance` with `retention = '29 days'`): the day's partition is dropped;
- `store.purge_checkpoints(older_than=...)`: the same rows, by the store's batched deletes (500 a transaction),
  then the VACUUM that makes their space reusable (autovacuum would do it; here it is timed).

For each: the wall time, the WAL written, and what a client working beside it saw (p50/p99 of reading a workflow's
latest checkpoint, reading one checkpoint by id, saving one). The same client also runs on a quiet database first:
reads by id are what partitions cost every day, since without `saved_at` every partition's index is probed.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import sys
import time
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the suite's scenarios.py, floor.py, peers.py

import asyncpg
from scenarios import pct

from agent_store import Store

DAYS = 30
FILL = """
INSERT INTO agent_checkpoints (user_id, checkpoint_id, workflow_name, seq, previous_checkpoint_id, timestamp,
                               iteration_count, saved_at, payload)
SELECT 'user-' || (w / 10), 'cp-' || w || '-' || s, 'workflow-' || w, s,
       CASE WHEN s > 0 THEN 'cp-' || w || '-' || (s - 1) END, 'bulk', s,
       $1::timestamptz + (s * $2 / 100.0) * interval '1 day' + (w % 3600 + 0.5) * interval '1 second',
       json_build_object('workflow', 'workflow-' || w, 'step', s, 'state', repeat('x', 240))
FROM generate_series(0, 99) s, generate_series(0, $3 / 100 - 1) w"""  # in the order they were saved
PARTITIONED = [
    "CREATE TABLE agent_checkpoints_by_day (LIKE agent_checkpoints INCLUDING DEFAULTS) PARTITION BY RANGE (saved_at)",
    "ALTER TABLE agent_checkpoints_by_day ADD PRIMARY KEY (user_id, checkpoint_id, saved_at)",
    "CREATE UNIQUE INDEX ON agent_checkpoints_by_day (user_id, workflow_name, seq, saved_at)",
    "CREATE INDEX ON agent_checkpoints_by_day (user_id, previous_checkpoint_id)",
    "CREATE SCHEMA partman",
    "CREATE EXTENSION pg_partman SCHEMA partman",
]
CREATE_PARENT = """SELECT partman.create_parent('public.agent_checkpoints_by_day', 'saved_at', 'native', 'daily',
                                                p_premake := 4, p_start_partition := $1)"""
RETAIN = """UPDATE partman.part_config SET retention = '29 days', retention_keep_table = false
            WHERE parent_table = 'public.agent_checkpoints_by_day'"""
BULK_ROWS = "SELECT count(*) FROM agent_checkpoints_by_day WHERE timestamp = 'bulk'"  # not the client's saves
MAINTAIN = "SELECT partman.run_maintenance('public.agent_checkpoints_by_day')"  # drops what retention says
WAL = "SELECT pg_current_wal_lsn()"
WAL_SINCE = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1)"
# What a client does beside the purge, on one table (the table name is one of two constants).
LATEST = "SELECT payload FROM {} WHERE user_id = $1 AND workflow_name = $2 ORDER BY seq DESC LIMIT 1"
BY_ID = "SELECT payload FROM {} WHERE user_id = $1 AND checkpoint_id = $2"
SAVE = """INSERT INTO {} (user_id, checkpoint_id, workflow_name, seq, timestamp, iteration_count, saved_at, payload)
          VALUES ($1, $2, $3, $4, 'probe', 0, now(), '{{}}')"""
TABLES = ("agent_checkpoints", "agent_checkpoints_by_day")
VACUUM = "VACUUM agent_checkpoints"
Step = tuple[float, float, Any, str]  # seconds, WAL bytes, what the work returned, the client's figures
SAVES = itertools.count(1000)  # every save its own id and seq, across clients


class Client:
    """One connection reading and saving checkpoints in a loop until stopped; milliseconds per kind of call."""

    def __init__(self, url: str, table: str, workflows: int) -> None:
        self.url, self.workflows = url, workflows
        self.sql = {name: sql.format(table) for name, sql in (("latest", LATEST), ("by id", BY_ID), ("save", SAVE))}
        self.times: dict[str, list[float]] = {name: [] for name in self.sql}
        self.stop = asyncio.Event()

    async def run(self) -> None:
        conn, pick = await asyncpg.connect(self.url), random.Random(3)
        try:
            while not self.stop.is_set():
                w = pick.randrange(self.workflows)
                user, workflow, save = f"user-{w // 10}", f"workflow-{w}", next(SAVES)
                for name, args in (
                    ("latest", (user, workflow)),
                    ("by id", (user, f"cp-{w}-{pick.randrange(100)}")),
                    ("save", (user, f"probe-{save}", workflow, save)),
                ):
                    started = time.perf_counter()
                    await (conn.execute if name == "save" else conn.fetchrow)(self.sql[name], *args)
                    self.times[name].append((time.perf_counter() - started) * 1e3)
                await asyncio.sleep(0.005)
        finally:
            await conn.close()

    def figures(self) -> str:
        return " · ".join(f"{n} {statistics.median(t):.1f} / {pct(t, 0.99):.1f}" for n, t in self.times.items() if t)


async def beside(url: str, table: str, workflows: int, work: asyncio.Future[object] | None = None) -> Client:
    """Run a client on ``table`` while ``work`` runs (or for 5 s on a quiet database)."""
    client = Client(url, table, workflows)
    task = asyncio.create_task(client.run())
    await (work if work is not None else asyncio.sleep(5))
    client.stop.set()
    await task
    return client


async def measured(conn: asyncpg.Connection, raw: str, table: str, workflows: int, work: Awaitable[Any]) -> Step:
    """``work`` after a CHECKPOINT (each step starts with the same full-page-write state), a client beside it."""
    await conn.execute("CHECKPOINT")
    wal, started = await conn.fetchval(WAL), time.perf_counter()
    running = asyncio.ensure_future(work)
    client = await beside(raw, table, workflows, running)
    return time.perf_counter() - started, await conn.fetchval(WAL_SINCE, wal), running.result(), client.figures()


async def build(url: str, checkpoints: int, start: datetime) -> float:
    started = time.perf_counter()
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(FILL, start, float(DAYS), checkpoints)
        for statement in PARTITIONED:
            await conn.execute(statement)
        await conn.execute(CREATE_PARENT, start.strftime("%Y-%m-%d"))
        await conn.execute("INSERT INTO agent_checkpoints_by_day SELECT * FROM agent_checkpoints")
        await conn.execute("VACUUM ANALYZE agent_checkpoints, agent_checkpoints_by_day")
    finally:
        await conn.close()
    return time.perf_counter() - started


async def one_scale(pg_url: str, checkpoints: int) -> dict[str, object]:
    name = f"agent_store_retention_{checkpoints}"
    admin = await asyncpg.connect(pg_url.replace("+asyncpg", ""))
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = pg_url.rsplit("/", 1)[0] + "/" + name
    raw = url.replace("+asyncpg", "")
    store = Store.from_url(url, pool_size=2)
    found: dict[str, object] = {}
    try:
        await store.migrate()
        start = (datetime.now(UTC) - timedelta(days=DAYS)).replace(hour=0, minute=0, second=0, microsecond=0)
        found["built in s"] = await build(raw, checkpoints, start)
        workflows = checkpoints // 100
        for table in TABLES:
            found[f"quiet: {table}"] = (await beside(raw, table, workflows)).figures()
        conn = await asyncpg.connect(raw)
        try:
            size = "SELECT pg_total_relation_size('agent_checkpoints')"
            found["table + indexes, MB"] = await conn.fetchval(size) / 2**20
            before = await conn.fetchval(BULK_ROWS)
            await conn.execute(RETAIN)
            seconds, wal, _, client = await measured(conn, raw, TABLES[1], workflows, conn.execute(MAINTAIN))
            found["drop partitions"] = (seconds, wal, before - await conn.fetchval(BULK_ROWS), client)
            # The same rows from the store's table: everything before the first day kept (no row is saved at
            # midnight exactly: the purge's cutoff, a few ms past it, takes no row of that day).
            kept_from = await conn.fetchval("SELECT date_trunc('day', min(saved_at)) FROM agent_checkpoints_by_day")
            purge = store.purge_checkpoints(datetime.now(UTC) - kept_from)
            found["batched deletes"] = await measured(conn, raw, TABLES[0], workflows, purge)
            seconds, wal, _, client = await measured(conn, raw, TABLES[0], workflows, conn.execute(VACUUM))
            found["their VACUUM"] = (seconds, wal, 0, client)
        finally:
            await conn.close()
    finally:
        await store.close()
        await admin.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg-url", default="postgresql+asyncpg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--scales", type=int, nargs="+", default=[100_000, 10_000_000], help="checkpoints")
    args = parser.parse_args()
    for checkpoints in args.scales:
        found = asyncio.run(one_scale(args.pg_url, checkpoints))
        print(f"\n{checkpoints:,} checkpoints ({found['table + indexes, MB']:.0f} MB with indexes), "
              f"built in {found['built in s']:.0f} s; one day is about {checkpoints // DAYS:,} rows")  # fmt: skip
        for table in TABLES:
            print(f"  quiet client on {table}, p50 / p99 ms: {found[f'quiet: {table}']}")
        print("\n| the oldest day, by | rows | seconds | rows/s | WAL MB | client beside it, p50 / p99 ms |")
        print("|---|---|---|---|---|---|")
        for how in ("drop partitions", "batched deletes", "their VACUUM"):
            seconds, wal, rows, client = found[how]  # type: ignore[misc]
            rate = f"{rows / seconds:,.0f}" if rows else ""
            print(f"| {how} | {rows:,} | {seconds:.2f} | {rate} | {wal / 2**20:.1f} | {client} |")


if __name__ == "__main__":
    main()
