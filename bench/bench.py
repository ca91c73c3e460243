"""agent_store against a raw-driver floor, side by side in one run, on SQLite and PostgreSQL. Prints a table.

    python bench/bench.py                      # both backends (PostgreSQL at $AGENT_STORE_BENCH_PG_URL or local)
    python bench/bench.py --reps 5 --backends postgresql

Every figure is the median of ``--reps`` repetitions and is shown with its ratio to the floor of the same run.
The work of S1-S4 is in scenarios.py; S5 is bytes on disk per message (and in parts, space.py); CPU is Python
CPU time per run (S1); round trips are counted on the wire (peers.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sqlite3
import statistics
import tempfile
from pathlib import Path

import asyncpg
from floor import TABLES as FLOOR_TABLES
from floor import Floor
from peers import fresh_url, peers_for, round_trips_per_run
from scenarios import Sides, open_floor, open_store, s1, s2, s3, s4_floor, s4_store, texts
from space import PARTS, postgres_parts, sqlite_parts
from sqlalchemy import text

from agent_store import Store

STORE_TABLES = ["agent_sessions", "agent_messages", "agent_state", "agent_runs", "agent_tool_calls"]


async def table_bytes(store: Store, tables: list[str], sqlite_file: Path | None) -> int:
    async with store.engine.connect() as conn:
        if sqlite_file is None:
            # VACUUM first, as autovacuum would on its own schedule: dead row versions left by the state
            # upserts of the last seconds are not bytes a message keeps (they made both sides' figures vary).
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            for table in tables:
                await conn.exec_driver_sql("VACUUM " + table)  # the bench's own table names
            return sum(
                [(await conn.execute(text("SELECT pg_total_relation_size(:t)"), {"t": t})).scalar_one() for t in tables]
            )
        await conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
    return os.path.getsize(sqlite_file)  # noqa: ASYNC240 - one stat() after the benchmark


async def one_rep(
    url: str, floor_url: str, rep: int, workers: int, sqlite_files: tuple[Path, Path] | None
) -> dict[str, dict[str, float]]:
    async with Store.from_url(url, pool_size=workers, max_overflow=0) as store:
        await store.warm_up()  # every side's pool is open before timing (the floor's and the peers' too)
        floor = await Floor.open(floor_url, workers if url.startswith("postgresql") else 8)
        sides = Sides(store, floor)
        out: dict[str, dict[str, float]] = {}
        for side, run in (("store", sides.store_run), ("floor", sides.floor_run)):
            for key, value in (await s1(run, f"s1-{rep}-{side}")).items():
                out.setdefault("S1 " + key, {})[side] = value
            for key, value in (await s2(run, f"s2-{rep}-{side}", workers)).items():
                out.setdefault("S2 " + key, {})[side] = value
        postgres = url.startswith("postgresql")
        for number, peer_class in enumerate(peers_for("postgresql" if postgres else "sqlite")):
            peer_url = await fresh_url(url, f"peer{number}")
            peer = await peer_class.open(peer_url, workers, texts)
            try:
                for key, value in (await s1(peer.run, f"s1-{rep}")).items():
                    out["S1 " + key][peer.name] = value
                if postgres:
                    for key, value in (await s2(peer.run, f"s2-{rep}", workers)).items():
                        out["S2 " + key][peer.name] = value
            finally:
                await peer.close()
            if postgres:
                out.setdefault("round trips/run", {})[peer.name] = await round_trips_per_run(
                    peer_url, lambda u, c=peer_class: c.open(u, 1, texts)
                )
        if postgres:
            trips = out.setdefault("round trips/run", {})
            trips["store"] = await round_trips_per_run(url, open_store)
            trips["floor"] = await round_trips_per_run(url, open_floor)
        for key, value in (await s3(sides, f"s3-{rep}")).items():
            side, label = key.split(" ", 1)
            out.setdefault("S3 load " + label, {})[side] = value
        for key, value in (await s4_store(store, f"s4-{rep}-store")).items():
            out.setdefault("S4 " + key, {})["store"] = value
        for key, value in (await s4_floor(floor, f"s4-{rep}-floor")).items():
            out.setdefault("S4 " + key, {})["floor"] = value
        await floor.close()
        async with store.engine.connect() as conn:
            store_messages = (await conn.execute(text("SELECT count(*) FROM agent_messages"))).scalar_one()
        async with Store.from_url(floor_url, check_schema=False) as floor_db, floor_db.engine.connect() as conn:
            floor_messages = (await conn.execute(text("SELECT count(*) FROM floor_messages"))).scalar_one()
        if sqlite_files is None:
            out["S5 bytes/message"] = {
                "store": await table_bytes(store, STORE_TABLES, None) / store_messages,
                "floor": await table_bytes(store, FLOOR_TABLES, None) / floor_messages,
            }
            async with store.engine.connect() as conn:
                parts = {
                    "store": await postgres_parts(conn, STORE_TABLES, store_messages),
                    "floor": await postgres_parts(conn, FLOOR_TABLES, floor_messages),
                }
    if sqlite_files is not None:
        async with Store.from_url(url) as store, Store.from_url(floor_url, check_schema=False) as floor_store:
            out["S5 bytes/message"] = {
                "store": await table_bytes(store, [], sqlite_files[0]) / store_messages,
                "floor": await table_bytes(floor_store, [], sqlite_files[1]) / floor_messages,
            }
        parts = {
            "store": sqlite_parts(sqlite_files[0], store_messages),
            "floor": sqlite_parts(sqlite_files[1], floor_messages),
        }
    for part in PARTS:  # S5's profile: what each side's bytes are spent on (bench/space.py)
        out["S5 part: " + part] = {side: parts[side][part] for side in parts}
    return out


TARGETS = {  # issue 11's targets, as ratios to the floor of the same run
    "S1 runs/s": "PG <= 1.3, SQLite <= 1.6 (time)", "S1 p50 ms": "PG <= 1.3, SQLite <= 1.6",
    "S2 runs/s": "PG <= 1.5 (time)", "S2 errors": "0", "S3 load whole 5000 ms": "<= 1.5x the floor's",
    "S3 load window 20 of 5000 ms": "<= 1.3x store's 20-message load", "S4 runs/s": "<= 3 (time)",
    "S5 bytes/message": "<= 1.3", "S1 CPU ms/run": "<= 1.5", "round trips/run": "<= 3",
}  # fmt: skip


async def backend(name: str, reps: int, pg_url: str) -> list[tuple[str, str, dict[str, float]]]:
    results: list[dict[str, dict[str, float]]] = []
    for rep in range(reps):
        if name == "postgresql":
            admin = await asyncpg.connect(pg_url.replace("+asyncpg", ""))
            await admin.execute("DROP DATABASE IF EXISTS agent_store_bench WITH (FORCE)")
            await admin.execute("CREATE DATABASE agent_store_bench")
            await admin.close()
            url = pg_url.rsplit("/", 1)[0] + "/agent_store_bench"
            async with Store.from_url(url) as store:
                await store.migrate()
            results.append(await one_rep(url, url, rep, 32, None))
        else:
            folder = Path(tempfile.mkdtemp(prefix="agent_store_bench_"))
            store_file, floor_file = folder / "store.db", folder / "floor.db"
            url = f"sqlite+aiosqlite:///{store_file}"
            async with Store.from_url(url) as store:
                await store.migrate()
            results.append(await one_rep(url, f"sqlite+aiosqlite:///{floor_file}", rep, 32, (store_file, floor_file)))
    rows = []
    for metric in results[0]:
        sides = {side for r in results for side in r.get(metric, {})}
        values = {
            side: statistics.median(r[metric][side] for r in results if side in r.get(metric, {})) for side in sides
        }
        rows.append((name, metric, values))
    return rows


def ratio(metric: str, store: float, floor: float) -> str:
    if metric.endswith("runs/s"):
        return f"{floor / store:.2f}x" if store else "-"  # time ratio: >1 means the store is slower
    if "errors" in metric or "retries" in metric or "correct" in metric or metric.startswith("S3"):
        return "-"
    return f"{store / floor:.2f}x" if floor else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("AGENT_STORE_BENCH_PG_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"),
    )
    args = parser.parse_args()

    async def everything() -> tuple[list[tuple[str, str, dict[str, float]]], str]:
        rows = []
        for name in args.backends:
            rows += await backend(name, args.reps, args.pg_url)
        version = "-"
        if "postgresql" in args.backends:
            conn = await asyncpg.connect(args.pg_url.replace("+asyncpg", ""))
            version = await conn.fetchval("SHOW server_version")
            await conn.close()
        return rows, version

    rows, pg_version = asyncio.run(everything())
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"SQLite {sqlite3.sqlite_version}, PostgreSQL {pg_version}; medians of {args.reps} repetitions")  # fmt: skip
    print("\n| backend | metric | agent_store | floor | store/floor | target |")
    print("|---|---|---|---|---|---|")
    for name, metric, values in rows:
        store_value, floor_value = values["store"], values["floor"]
        cells = [name, metric, f"{store_value:.2f}", f"{floor_value:.2f}", ratio(metric, store_value, floor_value)]
        print("| " + " | ".join([*cells, TARGETS.get(metric, "")]) + " |")
    print("\nruns/s ratios are time ratios (floor runs/s / store runs/s): 1.00x = as fast as the floor.")
    peers = sorted({side for _n, _m, values in rows for side in values} - {"store", "floor"})
    print("\nPeers on the same work, each in a database of its own (ratio to the same run's floor):\n")
    print("| backend | metric | " + " | ".join(["agent_store", "floor", *peers]) + " |")
    print("|---|---|" + "---|" * (2 + len(peers)))
    for name, metric, values in rows:
        if not set(values) & set(peers) and metric != "round trips/run":
            continue
        cells = []
        for side in ("store", "floor", *peers):
            value = values.get(side)
            cells.append("-" if value is None else f"{value:.2f} ({ratio(metric, value, values['floor'])})")
        print(f"| {name} | {metric} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
