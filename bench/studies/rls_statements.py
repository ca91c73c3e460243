"""Where row-level security's cost goes (issue 41), statement by statement: S1 with the switch off and on, on a
private PostgreSQL server of its own (initdb in a temp dir, with ``pg_stat_statements`` loaded and
``track = all``, so the statements inside the commit function are timed too). Prints a table.

    python bench/studies/rls_statements.py [--reps 3]

Each side is agent_store as the same application role (bench/studies/rls.py's set-up: no superuser, no BYPASSRLS,
generic plans), on a database of its own; sides alternate in each repetition; every figure is a median of the
repetitions' means, in microseconds of server execution per call. A statement the policies make dearer shows it
here; what the table cannot show is the client's side (bench/studies/rls.py measures whole runs).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the suite's scenarios.py, floor.py, peers.py

import asyncpg
from rls import database
from scenarios import s1, store_run

from agent_store import Store

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from throwaway_pg import ThrowawayCluster

OPTIONS = "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all"
STATEMENTS = (
    "SELECT calls, mean_exec_time, toplevel, left(regexp_replace(query, '\\s+', ' ', 'g'), 90) AS query"
    " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND calls >= 400"
)


def _same(query: str) -> str:
    """One name for a statement on both sides: the commit under the policies is called through its ``_as`` form,
    and the load's parameters are numbered from after the names it sets."""
    return re.sub(r"\$\d+", "$", query.replace("agent_store_commit_usage_as($1, $2, ", "agent_store_commit_usage("))


async def one_side(admin_url: str, rls: bool, rep: int) -> dict[str, float]:
    name = f"agent_store_bench_rls_statements_{'on' if rls else 'off'}"
    url = await database(admin_url, name, rls=rls)
    stats = await asyncpg.connect(admin_url.replace("+asyncpg", "").rsplit("/", 1)[0] + "/" + name)
    try:
        await stats.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        async with Store.from_url(url, pool_size=4, max_overflow=0) as store:
            await store.warm_up()
            assert store.db.row_security is rls
            run = lambda sid, n: store_run(store, sid, n)  # noqa: E731
            await s1(run, f"warm-{rep}")  # plans made and cached, on every pooled connection
            await stats.execute("SELECT pg_stat_statements_reset()")
            await s1(run, f"s1-{rep}")
        found = await stats.fetch(STATEMENTS)
    finally:
        await stats.close()
    figures = {_same(r["query"]): r["mean_exec_time"] * 1000 for r in found}
    figures["(server execution per run, top level)"] = sum(r["mean_exec_time"] * r["calls"] for r in found
                                                            if r["toplevel"]) * 1000 / 500  # fmt: skip
    return figures


async def everything(server: ThrowawayCluster, reps: int) -> dict[str, dict[bool, list[float]]]:
    seen: dict[str, dict[bool, list[float]]] = {}
    for rep in range(reps):
        for rls in (False, True) if rep % 2 == 0 else (True, False):
            for statement, micros in (await one_side(server.url(), rls, rep)).items():
                seen.setdefault(statement, {False: [], True: []})[rls].append(micros)
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    with ThrowawayCluster(extra_opts=OPTIONS) as server:
        seen = asyncio.run(everything(server, args.reps))
    print(f"S1 (500 sequential runs) on a private PostgreSQL server; medians of {args.reps} repetitions' means, "
          "microseconds of server execution per call\n")  # fmt: skip
    print("| statement | RLS off | RLS on | on - off |")
    print("|---|---|---|---|")
    rows = [(s, statistics.median(v[False] or [0.0]), statistics.median(v[True] or [0.0])) for s, v in seen.items()]
    for statement, off, on in sorted(rows, key=lambda r: -max(r[1], r[2])):  # (0: the side never ran it)
        print(f"| `{statement.replace('|', '/')}` | {off:.1f} | {on:.1f} | {on - off:+.1f} |")


if __name__ == "__main__":
    main()
