"""Row-level security's cost (issue 41): S1 and S2 with the switch on and off, side by side in one run, on
PostgreSQL, against the raw-driver floor of the same run. Prints a table.

    python bench/studies/rls.py --reps 3

Both sides are agent_store opened as the same application role (no superuser, no BYPASSRLS), each on a
database of its own migrated by its owner; the only difference is ``agent-store rls on``. With it on, every
transaction names its user (three more round trips for the one-statement load and the one-round-trip commit),
and every statement carries the policies. Sides alternate in each repetition; every figure is a median.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the suite's scenarios.py, floor.py, peers.py

import asyncpg
from floor import Floor
from scenarios import floor_run, s1, s2, store_run

from agent_store import Store

APP = "agent_store_bench_app"


async def database(admin_url: str, name: str, *, rls: bool) -> str:
    """A fresh database ``name`` with the store's schema, the application role's grants, and the switch."""
    plain = admin_url.replace("+asyncpg", "")
    admin = await asyncpg.connect(plain)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{name}"')
        exists = await admin.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", APP)
        if not exists:
            await admin.execute(f"CREATE ROLE {APP} LOGIN NOSUPERUSER NOBYPASSRLS")
        # As docs/row-security.md sets the application's role up: generic plans (a custom plan of a statement under
        # the policies is planned again on every execution).
        await admin.execute(f"ALTER ROLE {APP} SET plan_cache_mode = force_generic_plan")
    finally:
        await admin.close()
    owner_url = admin_url.rsplit("/", 1)[0] + "/" + name
    async with Store.from_url(owner_url) as store:
        await store.migrate()
    conn = await asyncpg.connect(owner_url.replace("+asyncpg", ""))
    try:
        await conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {APP}")
        await conn.execute(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {APP}")
        await conn.execute("SELECT agent_store_row_security($1)", rls)
    finally:
        await conn.close()
    return owner_url.replace("postgres@", f"{APP}@", 1)


async def one_rep(admin_url: str, rep: int, workers: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    floor_url = admin_url.rsplit("/", 1)[0] + "/agent_store_bench_floor"
    await database(admin_url, "agent_store_bench_floor", rls=False)
    floor = await Floor.open(floor_url, workers)
    try:
        sides = ["off", "on"] if rep % 2 == 0 else ["on", "off"]
        for side in ["floor", *sides]:
            if side == "floor":
                run = lambda sid, n: floor_run(floor, sid, n)  # noqa: E731
                results = {**_named("S1", await s1(run, f"s1-{rep}")),
                           **_named("S2", await s2(run, f"s2-{rep}", workers))}  # fmt: skip
            else:
                url = await database(admin_url, f"agent_store_bench_rls_{side}", rls=side == "on")
                async with Store.from_url(url, pool_size=workers, max_overflow=0) as store:
                    await store.warm_up()
                    assert store.db.row_security is (side == "on"), side
                    run = lambda sid, n, store=store: store_run(store, sid, n)  # noqa: E731
                    results = {**_named("S1", await s1(run, f"s1-{rep}")),
                               **_named("S2", await s2(run, f"s2-{rep}", workers))}  # fmt: skip
            for metric, value in results.items():
                out.setdefault(metric, {})[side] = value
    finally:
        await floor.close()
    return out


def _named(scenario: str, figures: dict[str, float]) -> dict[str, float]:
    keep = ("runs/s", "p50 ms", "p99 ms", "errors")
    return {f"{scenario} {k}": v for k, v in figures.items() if k in keep}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--pg-url", default=os.environ.get("AGENT_STORE_BENCH_PG_URL",
                                                           "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"))
    args = parser.parse_args()

    async def everything() -> list[dict[str, dict[str, float]]]:
        return [await one_rep(args.pg_url, rep, args.workers) for rep in range(args.reps)]

    reps = asyncio.run(everything())
    print(f"PostgreSQL, S1 (500 sequential runs, last 20 messages) and S2 (200 sessions x 10 runs, {args.workers} "
          f"workers); medians of {args.reps} repetitions, sides alternating")  # fmt: skip
    print("\n| metric | floor | RLS off | RLS on | off/floor | on/floor | on/off |")
    print("|---|---|---|---|---|---|---|")
    for metric in reps[0]:
        m = {side: statistics.median(r[metric][side] for r in reps) for side in ("floor", "off", "on")}
        if metric.endswith("errors"):
            print(f"| {metric} | {m['floor']:.0f} | {m['off']:.0f} | {m['on']:.0f} | - | - | - |")
            continue
        slower = (lambda a, b: b / a) if metric.endswith("runs/s") else (lambda a, b: a / b)  # >1: a is slower
        print(f"| {metric} | {m['floor']:.2f} | {m['off']:.2f} | {m['on']:.2f} | {slower(m['off'], m['floor']):.2f}x"
              f" | {slower(m['on'], m['floor']):.2f}x | {slower(m['on'], m['off']):.3f}x |")
    print("\nx: time ratios (above 1 is slower); on/off is row-level security's cost, the issue's bound 1.05x.")


if __name__ == "__main__":
    main()
