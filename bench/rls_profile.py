"""Where row-level security's cost goes inside the server (issue 41), by CPU profile: S1 with the switch off and
on, on a private PostgreSQL server of its own, with Linux ``perf`` sampling the one server process that serves the
runs. Prints a table of microseconds of server CPU per run, by function (inclusive of what it calls).

    python bench/rls_profile.py [--reps 3]

bench/rls_statements.py times statements, and cannot see what a statement costs before it runs (the executor's
start-up, where each policy's sub-plans are built) nor what the commit function spends between its statements.
This can. Needs ``perf`` (Debian's ``linux-perf``) and a kernel that lets root sample. Each side is bench/rls.py's
set-up (the same application role, generic plans) with a pool of one connection, so one server process does all
the work; sides alternate in each repetition; every figure is a median.
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

import asyncpg
from rls import database
from scenarios import s1, store_run

from agent_store import Store

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from throwaway_pg import ThrowawayCluster

HZ = 4000
RUNS = 500  # scenarios.s1's
FUNCTIONS = {
    "PostgresMain": "all of the server process's work",
    "standard_ExecutorStart": "executor start-up (plans made ready to run)",
    "ExecInitResult": "in it: Result nodes made ready (each policy's `(SELECT setting)` is one)",
    "standard_ExecutorRun": "executing",
    "ExecSubPlan": "in it: the policies' `EXISTS` probes of agent_sessions",
    "GetCachedPlan": "finding the cached plan (and locking each relation it reads)",
}


async def one_side(admin_url: str, rls: bool, rep: int, workdir: Path) -> dict[str, float]:
    name = f"agent_store_bench_rls_profile_{'on' if rls else 'off'}"
    url = await database(admin_url, name, rls=rls)
    async with Store.from_url(url, pool_size=1, max_overflow=0) as store:
        await store.warm_up()
        assert store.db.row_security is rls
        run = lambda sid, n: store_run(store, sid, n)  # noqa: E731
        await s1(run, f"warm-{rep}")  # plans made and cached on the one connection
        watch = await asyncpg.connect(admin_url.replace("+asyncpg", ""))
        try:
            serving = "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend'"
            pids = [r["pid"] for r in await watch.fetch(serving, name)]
        finally:
            await watch.close()
        assert len(pids) == 1, pids
        data = workdir / f"{name}-{rep}.data"
        perf = await asyncio.create_subprocess_exec("perf", "record", "-q", "-F", str(HZ), "-g", "-p", str(pids[0]),
                                                    "-o", str(data))  # fmt: skip
        await asyncio.sleep(0.5)  # perf attached
        await s1(run, f"s1-{rep}")
        perf.send_signal(signal.SIGINT)
        await perf.wait()
    return inclusive(data)


def inclusive(data: Path) -> dict[str, float]:
    """Microseconds a run under each function of FUNCTIONS: samples whose stack holds it, once a sample."""
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip,sym"], capture_output=True, text=True).stdout
    counts = dict.fromkeys(FUNCTIONS, 0)
    for sample in script.split("\n\n"):
        names = {line.split()[-1] for line in sample.splitlines() if line.strip()}  # "<address> <symbol>"
        for function in FUNCTIONS:
            counts[function] += function in names
    return {f: n / HZ / RUNS * 1e6 for f, n in counts.items()}


async def everything(server: ThrowawayCluster, reps: int, workdir: Path) -> dict[str, dict[bool, list[float]]]:
    seen: dict[str, dict[bool, list[float]]] = {f: {False: [], True: []} for f in FUNCTIONS}
    for rep in range(reps):
        for rls in (False, True) if rep % 2 == 0 else (True, False):
            for function, micros in (await one_side(server.url(), rls, rep, workdir)).items():
                seen[function][rls].append(micros)
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    with ThrowawayCluster() as server, tempfile.TemporaryDirectory() as workdir:
        seen = asyncio.run(everything(server, args.reps, Path(workdir)))
    print(f"S1 ({RUNS} sequential runs) on a private PostgreSQL server, perf at {HZ} Hz on its one server process; "
          f"medians of {args.reps}; microseconds of server CPU a run, inclusive\n")  # fmt: skip
    print("| function | what | RLS off | RLS on | on - off |")
    print("|---|---|---|---|---|")
    for function, what in FUNCTIONS.items():
        off, on = statistics.median(seen[function][False]), statistics.median(seen[function][True])
        print(f"| `{function}` | {what} | {off:.0f} | {on:.0f} | {on - off:+.0f} |")


if __name__ == "__main__":
    main()
