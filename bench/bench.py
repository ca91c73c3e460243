"""agent_store against a raw-driver floor, side by side in one run, on SQLite and PostgreSQL. Prints a table.

    python bench/bench.py                      # both backends (PostgreSQL at $AGENT_STORE_BENCH_PG_URL or local)
    python bench/bench.py --reps 5 --backends postgresql

Every figure is the median of ``--reps`` repetitions and is shown with its ratio to the floor of the same run.
The work of S1-S4 is in scenarios.py; S5 is bytes on disk per message after S1, every side (the peers too) in a
database of its own (s5.py; the store's also in parts, space.py); CPU is Python
CPU time per run (S1); round trips are counted on the wire (peers.py).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import sqlite3
import statistics
import tempfile
from pathlib import Path

import asyncpg
import scenarios
from floor import Floor
from peers import fresh_url, peers_for, preload, round_trips_per_run
from s5 import s5
from scenarios import Sides, open_floor, open_store, per_second, s1, s2, s3, s4_floor, s4_store, texts

from agent_store import Store


async def one_rep(
    url: str, floor_url: str, rep: int, workers: int,
    traces: dict[str, list[tuple[float, float]]],
) -> dict[str, dict[str, float]]:  # fmt: skip
    """Every figure of one repetition, by metric and side; S2's latency trace of the first into ``traces``."""
    async with Store.from_url(url, pool_size=workers, max_overflow=0) as store:
        await store.warm_up()  # every side's pool is open before timing (the floor's and the peers' too)
        floor = await Floor.open(floor_url, workers if url.startswith("postgresql") else 8)
        sides = Sides(store, floor)
        out: dict[str, dict[str, float]] = {}
        for side in ("store", "floor", "rows"):
            run, whole = getattr(sides, f"{side}_run"), getattr(sides, f"{side}_whole")
            for key, value in (await s1(run, f"s1-{rep}-{side}")).items():
                out.setdefault("S1 " + key, {})[side] = value
            for key, value in (await s1(whole, f"s1w-{rep}-{side}")).items():
                out.setdefault("S1 whole " + key, {})[side] = value
            trace = traces.setdefault(side, []) if rep == 0 else None
            for key, value in (await s2(run, f"s2-{rep}-{side}", workers, trace)).items():
                out.setdefault("S2 " + key, {})[side] = value
        postgres = url.startswith("postgresql")
        for number, peer_class in enumerate(peers_for("postgresql" if postgres else "sqlite")):
            peer_url = await fresh_url(url, f"peer{number}")
            peer = await peer_class.open(peer_url, workers, texts)
            try:
                for key, value in (await s1(peer.run, f"s1-{rep}")).items():
                    out["S1 " + key][peer.name] = value
                for key, value in (await s1(peer.run_whole, f"s1w-{rep}")).items():
                    out["S1 whole " + key][peer.name] = value
                trace = traces.setdefault(peer.name, []) if rep == 0 else None
                for key, value in (await s2(peer.run, f"s2-{rep}", workers, trace)).items():
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
            out.setdefault("S3 load " + label, {})[side] = value  # store, floor, rows
        for key, value in (await s4_store(store, f"s4-{rep}-store")).items():
            out.setdefault("S4 " + key, {})["store"] = value
        for key, value in (await s4_floor(floor, f"s4-{rep}-floor")).items():
            out.setdefault("S4 " + key, {})["floor"] = value
        await floor.close()
    out.update(await s5(url, rep))
    return out


TARGETS = {  # issue 11's targets, then issue 26's (whole history, tail latency, bytes, the rows-only floor)
    "S1 runs/s": "PG <= 1.3, SQLite <= 1.6 (time)", "S1 p50 ms": "PG <= 1.3, SQLite <= 1.6",
    "S1 whole runs/s": "faster than openai-agents", "S2 runs/s": "PG <= 1.5 (time)", "S2 errors": "0",
    "S2 p99 ms": "<= the best peer's", "S3 load whole 5000 ms": "<= 2x rows only",
    "S3 load window 20 of 5000 ms": "<= 1.3x store's 20-message load", "S4 runs/s": "<= 3 (time)",
    "S5 bytes/message": "PG <= 1.6, SQLite <= 1.4",
    "S5 bytes/message less the empty schema": "PG <= 1.6, SQLite <= 1.4",
    "S5 bytes/message of the second half": "PG <= 1.6, SQLite <= 1.4",
    "S1 CPU ms/run": "<= 1.5", "round trips/run": "<= 3",
}  # fmt: skip


Rows = list[tuple[str, str, dict[str, float]]]
Traces = dict[str, list[tuple[float, float]]]


async def backend(name: str, reps: int, pg_url: str) -> tuple[Rows, Traces]:
    results: list[dict[str, dict[str, float]]] = []
    traces: Traces = {}
    for rep in range(reps):
        if name == "postgresql":
            admin = await asyncpg.connect(pg_url.replace("+asyncpg", ""))
            await admin.execute("DROP DATABASE IF EXISTS agent_store_bench WITH (FORCE)")
            await admin.execute("CREATE DATABASE agent_store_bench")
            await admin.close()
            url = pg_url.rsplit("/", 1)[0] + "/agent_store_bench"
            async with Store.from_url(url) as store:
                await store.migrate()
            results.append(await one_rep(url, url, rep, 32, traces))
        else:
            folder = Path(tempfile.mkdtemp(prefix="agent_store_bench_"))
            store_file, floor_file = folder / "store.db", folder / "floor.db"
            url = f"sqlite+aiosqlite:///{store_file}"
            async with Store.from_url(url) as store:
                await store.migrate()
            results.append(await one_rep(url, f"sqlite+aiosqlite:///{floor_file}", rep, 32, traces))
    rows = []
    for metric in results[0]:
        sides = {side for r in results for side in r.get(metric, {})}
        values = {
            side: statistics.median(r[metric][side] for r in results if side in r.get(metric, {})) for side in sides
        }
        rows.append((name, metric, values))
    return rows, traces


def ratio(metric: str, store: float, floor: float, *, time_too: bool = False) -> str:
    """``time_too``: S3's load times also as ratios (against the rows-only floor, issue 26's measure)."""
    if metric.endswith("runs/s"):
        return f"{floor / store:.2f}x" if store else "-"  # time ratio: >1 means the store is slower
    if "errors" in metric or "retries" in metric or "correct" in metric or (metric.startswith("S3") and not time_too):
        return "-"
    return f"{store / floor:.2f}x" if floor else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument(
        "--freeze", action="store_true", help="gc.freeze() after start-up, as docs/performance.md advises"
    )
    parser.add_argument(
        "--no-ledger", action="store_true", help="agent_store's turns record no model call (the ledger's cost)"
    )
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("AGENT_STORE_BENCH_PG_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"),
    )
    args = parser.parse_args()
    scenarios.USAGE = None if args.no_ledger else scenarios.USAGE

    async def everything() -> tuple[Rows, dict[str, Traces], str]:
        rows, traces = [], {}
        for name in args.backends:
            found, traces[name] = await backend(name, args.reps, args.pg_url)
            rows += found
        version = "-"
        if "postgresql" in args.backends:
            conn = await asyncpg.connect(args.pg_url.replace("+asyncpg", ""))
            version = await conn.fetchval("SHOW server_version")
            await conn.close()
        return rows, traces, version

    if args.freeze:  # every side alike: the modules imported by now are never scanned by a collection again
        preload()
        gc.collect()
        gc.freeze()
    rows, traces, pg_version = asyncio.run(everything())
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"SQLite {sqlite3.sqlite_version}, PostgreSQL {pg_version}; medians of {args.reps} repetitions"
          + ("; gc.freeze() after start-up" if args.freeze else "")
          + ("; agent_store: no call recorded" if args.no_ledger else "; agent_store: a call a turn"))  # fmt: skip
    print_main(rows)
    print_peers(rows)
    print_traces(traces)


def cell(values: dict[str, float], side: str) -> str:
    return "-" if side not in values else f"{values[side]:.2f}"


def print_main(rows: Rows) -> None:
    """agent_store against both floors: the one that builds the framework's objects, and rows only."""
    print("\n| backend | metric | agent_store | floor | store/floor | rows only | store/rows | target |")
    print("|---|---|---|---|---|---|---|---|")
    for name, metric, values in rows:
        store, floor, rows_only = values["store"], values.get("floor"), values.get("rows")
        over_rows = "-" if rows_only is None else ratio(metric, store, rows_only, time_too=True)
        over_floor = "-" if floor is None else ratio(metric, store, floor)
        cells = [name, metric, cell(values, "store"), cell(values, "floor"), over_floor,
                 cell(values, "rows"), over_rows, TARGETS.get(metric, "")]  # fmt: skip
        print("| " + " | ".join(cells) + " |")
    print("\nfloor: the raw driver's loop, building the framework's Message objects (from_dict); rows only: the")
    print("same loop handing back the rows as the driver returns them. runs/s ratios are time ratios (floor")
    print("runs/s / store runs/s): 1.00x = as fast as the floor.")


def print_peers(rows: Rows) -> None:
    peers = sorted({side for _n, _m, values in rows for side in values} - {"store", "floor", "rows"})
    print("\nPeers on the same work, each in a database of its own (ratio to the same run's floor):\n")
    print("| backend | metric | " + " | ".join(["agent_store", "floor", "rows only", *peers]) + " |")
    print("|---|---|" + "---|" * (3 + len(peers)))
    for name, metric, values in rows:
        if not set(values) & set(peers) and metric != "round trips/run":
            continue
        cells = []
        for side in ("store", "floor", "rows", *peers):
            value = values.get(side)
            cells.append("-" if value is None else f"{value:.2f} ({ratio(metric, value, values['floor'])})")
        print(f"| {name} | {metric} | " + " | ".join(cells) + " |")


def print_traces(traces: dict[str, Traces]) -> None:
    """S2's latency second by second (the first repetition): where a tail comes from, and when."""
    for name, by_side in traces.items():
        sides = [side for side in ("store", "floor", "rows", *sorted(by_side)) if side in by_side]
        sides = list(dict.fromkeys(sides))
        seconds = {side: {t: (n, p50, p99) for t, n, p50, p99 in per_second(by_side[side])} for side in sides}
        print(f"\nS2 on {name}, second by second (first repetition): runs, p50 ms / p99 ms\n")
        print("| second | " + " | ".join(sides) + " |")
        print("|---|" + "---|" * len(sides))
        for t in range(max(max(s, default=0) for s in seconds.values()) + 1):
            cells = [f"{seconds[s][t][0]}, {seconds[s][t][1]:.0f} / {seconds[s][t][2]:.0f}" if t in seconds[s] else "-"
                     for s in sides]  # fmt: skip
            print(f"| {t} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
