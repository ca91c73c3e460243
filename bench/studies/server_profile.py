"""S2's profile on the server: where each side's PostgreSQL time per run goes. Prints two tables.

    python bench/studies/server_profile.py [--reps 3]

S2's work (200 sessions x 10 runs, 32 workers) for agent_store, the floor and the community store, on a private
PostgreSQL server of its own (initdb in a temp dir; ``pg_stat_statements`` must be loaded at start, which the
machine's server is not) with ``pg_stat_statements.track = all``, so the statements inside agent_store's commit
function are timed too. Per side: runs/s, the client's Python CPU per run, and the server's execution time per
run (top-level statements; planning is not included). Then agent_store's statements one by one.

Execution time is not all of a server's work: each round trip costs parsing, binding and a wake-up too, which is
why the floor's 13 round trips per run make it cheap here and dear on the wire.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the suite's scenarios.py, floor.py, peers.py

import asyncpg
from floor import Floor
from peers import CommunityPostgresStore, available
from scenarios import floor_run, s2, store_run, texts

from agent_store import Store

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from throwaway_pg import ThrowawayCluster

OPTIONS = (
    "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all -c shared_buffers=128MB"
    " -c max_connections=120"
)
STATEMENTS = (
    "SELECT calls, total_exec_time, toplevel, left(regexp_replace(query, '\\s+', ' ', 'g'), 100) AS query"
    " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " ORDER BY total_exec_time DESC"
)


async def profile(server: ThrowawayCluster, reps: int) -> None:
    for name in ("store", "floor", "community"):
        server.create_database(name)
    store = Store.from_url(server.url("store"), pool_size=32, max_overflow=0)
    await store.migrate()
    await store.warm_up()
    floor = await Floor.open(server.url("floor"), 32)
    sides = {
        "agent_store": (lambda sid, n: store_run(store, sid, n), "store"),
        "floor": (lambda sid, n: floor_run(floor, sid, n), "floor"),
    }
    community = None
    if available()["community-agent-framework-postgres"]:
        community = await CommunityPostgresStore.open(server.url("community"), 32, texts)
        sides["community-agent-framework-postgres"] = (community.run, "community")
    figures: dict[str, dict[str, list[float]]] = {side: {} for side in sides}
    statements: list[asyncpg.Record] = []
    for rep in range(reps + 1):  # the first repetition warms every side up and is not counted
        for side, (run, database) in sides.items():
            conn = await asyncpg.connect(server.dsn(database))
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            await conn.execute("SELECT pg_stat_statements_reset()")
            cpu = time.process_time()
            result = await s2(run, f"p{rep}", 32)
            cpu = time.process_time() - cpu
            found = await conn.fetch(STATEMENTS)
            await conn.close()
            if rep == 0:
                continue
            server_ms = sum(r["total_exec_time"] for r in found if r["toplevel"])
            for key, value in (
                ("runs/s", result["runs/s"]),
                ("client CPU ms/run", cpu / 2),
                ("server ms/run", server_ms / 2000),
            ):
                figures[side].setdefault(key, []).append(value)
            if side == "agent_store" and rep == reps:
                statements = found
    print(f"S2 on a private PostgreSQL server, medians of {reps}\n")
    print("| side | runs/s | client CPU ms/run | server execution ms/run |")
    print("|---|---|---|---|")
    for side, values in figures.items():
        cells = [f"{statistics.median(values[k]):.3f}" for k in ("runs/s", "client CPU ms/run", "server ms/run")]
        print(f"| {side} | " + " | ".join(cells) + " |")
    print("\nagent_store's statements (last repetition; nested ones are inside the commit function):\n")
    print("| calls | ms/run | top level | statement |")
    print("|---|---|---|---|")
    for r in statements[:16]:
        print(
            f"| {r['calls']} | {r['total_exec_time'] / 2000:.3f} | {r['toplevel']} | `{r['query'].replace('|', '/')}` |"
        )
    await store.close()
    await floor.close()
    if community is not None:
        await community.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    with ThrowawayCluster(extra_opts=OPTIONS) as server:
        asyncio.run(profile(server, args.reps))


if __name__ == "__main__":
    main()
