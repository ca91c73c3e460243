"""Where a whole-history run's tail comes from: the garbage collector, under three settings, on both backends.

A whole-history load builds about four tracked objects per message (the framework's ``Message``, its contents
list, its ``Content``, their dicts). Those that are still alive when a young collection runs (the run holds them
while the model answers) are promoted, and every so often a full collection walks every tracked object in the
process: a pause that grows with the process, not with the run. The script runs S1-whole (500 sequential runs
of one session, the whole history each time, up to 1,000 messages) for each setting in a fresh process and
prints p50/p99/max per run with the collector's own pause totals (``gc.callbacks``), by generation:

- ``default``: CPython's thresholds (700, 10, 10);
- ``freeze``: ``gc.freeze()`` once after start-up (modules, the store, its pool: never scanned again);
- ``freeze+threshold``: that, and ``gc.set_threshold(50_000, 20, 20)``: fewer, larger young collections.

    python bench/studies/gc_pauses.py            # SQLite and PostgreSQL ($AGENT_STORE_BENCH_PG_URL or the local server)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the suite's scenarios.py, floor.py, peers.py

import asyncpg
from scenarios import pct, store_run

from agent_store import Store

SETTINGS = ["default", "freeze", "freeze+threshold"]


async def one(url: str, setting: str) -> dict[str, float]:
    pauses: list[tuple[int, float]] = []
    started = [0.0]

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((info["generation"], (time.perf_counter() - started[0]) * 1e3))

    async with Store.from_url(url) as store:
        await store.migrate()
        await store.warm_up()
        if setting != "default":
            gc.freeze()
        if setting == "freeze+threshold":
            gc.set_threshold(50_000, 20, 20)
        gc.callbacks.append(timed)
        latencies = []
        for n in range(500):
            began = time.perf_counter()
            await store_run(store, "whole", n, None)
            latencies.append((time.perf_counter() - began) * 1e3)
        gc.callbacks.remove(timed)
    out = {"p50 ms": pct(latencies, 0.5), "p99 ms": pct(latencies, 0.99), "max ms": max(latencies)}
    for generation in (0, 1, 2):
        mine = [d for g, d in pauses if g == generation]
        out[f"gen{generation} pauses"] = len(mine)
        out[f"gen{generation} longest ms"] = max(mine, default=0.0)
        out[f"gen{generation} total ms"] = sum(mine)
    return out


async def fresh(backend: str, pg_url: str, folder: Path) -> str:
    if backend == "sqlite":
        path = folder / f"gc-{time.monotonic_ns()}.db"
        return f"sqlite+aiosqlite:///{path}"
    admin = await asyncpg.connect(pg_url.replace("+asyncpg", ""))
    await admin.execute("DROP DATABASE IF EXISTS agent_store_bench_gc WITH (FORCE)")
    await admin.execute("CREATE DATABASE agent_store_bench_gc")
    await admin.close()
    return pg_url.rsplit("/", 1)[0] + "/agent_store_bench_gc"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("AGENT_STORE_BENCH_PG_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"),
    )
    parser.add_argument("--one", nargs=2, metavar=("URL", "SETTING"), help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(asyncio.run(one(*args.one))))
        return
    folder = Path(tempfile.mkdtemp(prefix="agent_store_gc_"))
    results = {}
    for backend in args.backends:
        for setting in SETTINGS:  # each in a process of its own: one setting's heap is not another's
            url = asyncio.run(fresh(backend, args.pg_url, folder))
            child = [sys.executable, __file__, "--one", url, setting]
            results[backend, setting] = json.loads(subprocess.run(child, check=True, capture_output=True).stdout)
    columns = list(next(iter(results.values())))
    print("S1-whole, 500 runs of one session (up to 1,000 messages), collector pauses by generation:\n")
    print("| backend | setting | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for (backend, setting), figures in results.items():
        print(f"| {backend} | {setting} | " + " | ".join(f"{figures[c]:.1f}" for c in columns) + " |")


if __name__ == "__main__":
    main()
