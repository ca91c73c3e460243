"""Where row-level security's cost goes inside the server (issue 41), by CPU profile: S1 with the switch off and
on, on a private PostgreSQL server of its own, with Linux ``perf`` sampling the one server process that serves the
runs. Prints a table of microseconds of server CPU per run, by function (inclusive of what it calls).

    python bench/studies/rls_profile.py [--reps 3] [--sides off on] [--top 0]

``--sides`` compares any two variants of bench/studies/rls_variants.py (the naming alone, a policy design), and
``--top N`` adds the N functions whose time differs most between them.

bench/studies/rls_statements.py times statements, and cannot see what a statement costs before it runs (the executor's
start-up, where each policy's sub-plans are built) nor what the commit function spends between its statements.
This can. Needs ``perf`` (Debian's ``linux-perf``) and a kernel that lets root sample. Each side is
bench/studies/rls.py's set-up (the same application role, generic plans) with a pool of one connection, so one
server process does all the work; sides alternate in each repetition; every figure is a median.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the suite's scenarios.py, floor.py, peers.py

import asyncpg
import rls_variants
from scenarios import s1, store_run

from agent_store import Store
from agent_store.db import tenancy

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from throwaway_pg import ThrowawayCluster

HZ = 4000
RUNS = 500  # scenarios.s1's
Seen = dict[str, list[float]]  # a function -> microseconds a run, one figure a repetition
FUNCTIONS = {
    "PostgresMain": "all of the server process's work",
    "standard_ExecutorStart": "executor start-up (plans made ready to run)",
    "ExecInitResult": "in it: Result nodes made ready (each policy's `(SELECT setting)` is one)",
    "standard_ExecutorRun": "executing",
    "ExecSubPlan": "in it: the policies' `EXISTS` probes of agent_sessions",
    "GetCachedPlan": "finding the cached plan (and locking each relation it reads)",
}


async def one_side(admin_url: str, side: str, rep: int, workdir: Path) -> dict[str, float]:
    """``side``: a variant of bench/studies/rls_variants.py (``off`` and ``on`` are the switch off and as shipped)."""
    name = "agent_store_bench_rlsv_" + "".join(c if c.isalnum() else "_" for c in side)
    url = await rls_variants.prepared(admin_url, side)
    learn = tenancy.learn
    try:
        async with Store.from_url(url, pool_size=1, max_overflow=0) as store:
            tenancy.learn = rls_variants.naming_anyway(learn, [store.db] if side.startswith("off, named") else [])
            await store.warm_up()
            assert store.db.row_security is (rls_variants.VARIANTS[side][0] or side.startswith("off, named"))
            run = lambda sid, n: store_run(store, sid, n)  # noqa: E731
            await s1(run, f"warm-{rep}")  # plans made and cached on the one connection
            watch = await asyncpg.connect(admin_url.replace("+asyncpg", ""))
            try:
                serving = "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend'"
                pids = [r["pid"] for r in await watch.fetch(serving, name)]
            finally:
                await watch.close()
            assert len(pids) == 1, pids
            data = workdir / f"{rep}-{list(rls_variants.VARIANTS).index(side)}.data"
            perf = await asyncio.create_subprocess_exec("perf", "record", "-q", "-F", str(HZ), "-g", "-p",
                                                        str(pids[0]), "-o", str(data))  # fmt: skip
            await asyncio.sleep(0.5)  # perf attached
            await s1(run, f"s1-{rep}")
            perf.send_signal(signal.SIGINT)
            await perf.wait()
    finally:
        tenancy.learn = learn
    return inclusive(data)


def inclusive(data: Path) -> dict[str, float]:
    """Microseconds a run under each function: samples whose stack holds it, once a sample."""
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip,sym"], capture_output=True, text=True).stdout
    counts: dict[str, int] = {}
    for sample in script.split("\n\n"):
        for name in {line.split()[-1] for line in sample.splitlines() if line.strip()}:  # "<address> <symbol>"
            counts[name] = counts.get(name, 0) + 1
    return {f: n / HZ / RUNS * 1e6 for f, n in counts.items()}


async def everything(server: ThrowawayCluster, sides: list[str], reps: int, workdir: Path) -> dict[str, Seen]:
    seen: dict[str, Seen] = {side: {} for side in sides}
    for rep in range(reps):
        for side in sides if rep % 2 == 0 else sides[::-1]:
            for function, micros in (await one_side(server.url(), side, rep, workdir)).items():
                seen[side].setdefault(function, []).append(micros)
    return seen


def median(seen: Seen, function: str, reps: int) -> float:
    found = seen.get(function, [])
    return statistics.median(found + [0.0] * (reps - len(found)))  # no sample in a repetition: none there


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sides", nargs=2, default=["off", "on"], choices=list(rls_variants.VARIANTS),
                        metavar="VARIANT", help="two variants of bench/studies/rls_variants.py (default: off on)")
    parser.add_argument("--top", type=int, default=0, help="also the N functions whose time differs most")
    args = parser.parse_args()
    a, b = args.sides
    with ThrowawayCluster() as server, tempfile.TemporaryDirectory() as workdir:
        seen = asyncio.run(everything(server, args.sides, args.reps, Path(workdir)))
    print(f"S1 ({RUNS} sequential runs) on a private PostgreSQL server, perf at {HZ} Hz on its one server process; "
          f"medians of {args.reps}; microseconds of server CPU a run, inclusive\n")  # fmt: skip
    print(f"A: {a}; B: {b}\n\n| function | what | A | B | B - A |\n|---|---|---|---|---|")
    for function, what in FUNCTIONS.items():
        x, y = median(seen[a], function, args.reps), median(seen[b], function, args.reps)
        print(f"| `{function}` | {what} | {x:.0f} | {y:.0f} | {y - x:+.0f} |")
    if args.top:
        every = set(seen[a]) | set(seen[b])
        moved = sorted(every, key=lambda f: -abs(median(seen[b], f, args.reps) - median(seen[a], f, args.reps)))
        print(f"\nThe {args.top} functions whose time differs most\n\n| function | A | B | B - A |\n|---|---|---|---|")
        for function in moved[: args.top]:
            x, y = median(seen[a], function, args.reps), median(seen[b], function, args.reps)
            print(f"| `{function}` | {x:.0f} | {y:.0f} | {y - x:+.0f} |")


if __name__ == "__main__":
    main()
