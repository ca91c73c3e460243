"""agent_store against a raw-driver floor, side by side in one run, on SQLite and PostgreSQL. Prints a table.

    python bench/bench.py                      # both backends (PostgreSQL at $AGENT_STORE_BENCH_PG_URL or local)
    python bench/bench.py --reps 5 --backends postgresql

Every figure is the median of ``--reps`` repetitions and is shown with its ratio to the floor of the same run.
S1 one session, 500 sequential runs (load + 2 messages + 1 state key); S2 200 sessions x 10 runs, 32 workers;
S3 loading a 5,000-message session whole and with history_limit=20 vs a 20-message session; S4 8 workers x 25
runs racing on one session with retries; S5 bytes on disk per message; CPU: Python CPU time per run (S1).
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
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
from agent_framework import AgentSession, Message
from floor import TABLES as FLOOR_TABLES
from floor import Conflict, Floor
from peers import fresh_url, peers_for, round_trips_per_run
from space import PARTS, postgres_parts, sqlite_parts
from sqlalchemy import text

from agent_store import Store, retry_on_conflict

STORE_TABLES = ["agent_sessions", "agent_messages", "agent_state", "agent_runs", "agent_tool_calls"]
QUESTION = "请帮我总结一下今天的会议记录，重点是预算和时间表。Please keep it short and list the action items."
ANSWER = "好的。会议要点：1) 预算维持不变；2) 上线时间推迟一周；3) 行动项：李明负责测试，王五负责文档。"


def texts(n: int) -> tuple[str, str]:
    return f"{QUESTION} #{n}", f"{ANSWER} #{n}"


def messages(n: int) -> list[Message]:
    question, answer = texts(n)
    return [Message(role="user", contents=[question]), Message(role="assistant", contents=[answer])]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def store_run(store: Store, sid: str, n: int) -> None:
    run = await store.load(sid, user_id=f"user-{sid}", history_limit=20)  # S2: 200 users, one session each
    run.history.extend(messages(n))
    run.session.state["counter"] = n
    run.session.state["user:last_seen"] = n
    await run.commit()


async def floor_run(floor: Floor, sid: str, n: int) -> None:
    version, _next, _state, _history = await floor.load(sid)
    await floor.commit(sid, version, messages(n), "counter", n)


class Sides:
    """The two implementations of one run, over the same database."""

    def __init__(self, store: Store, floor: Floor) -> None:
        self.store, self.floor = store, floor

    async def store_run(self, sid: str, n: int) -> None:
        await store_run(self.store, sid, n)

    async def floor_run(self, sid: str, n: int) -> None:
        await floor_run(self.floor, sid, n)


class OneSide:
    """One implementation on its own connection (for counting its round trips)."""

    def __init__(self, run: Callable[[str, int], Awaitable[None]], close: Callable[[], Awaitable[None]]) -> None:
        self.run, self.close = run, close


async def open_store(url: str) -> OneSide:
    store = Store.from_url(url, pool_size=1)
    return OneSide(lambda sid, n: store_run(store, sid, n), store.close)


async def open_floor(url: str) -> OneSide:
    floor = await Floor.open(url, 1)
    return OneSide(lambda sid, n: floor_run(floor, sid, n), floor.close)


async def timed(run: Callable[[], Awaitable[None]]) -> float:
    started = time.perf_counter()
    await run()
    return time.perf_counter() - started


async def s1(run: Callable[[str, int], Awaitable[None]], sid: str) -> dict[str, float]:
    cpu = time.process_time()
    wall = time.perf_counter()
    lat = [await timed(lambda n=n: run(sid, n)) for n in range(500)]
    elapsed, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "runs/s": 500 / elapsed, "p50 ms": pct(lat, 0.5) * 1e3, "p99 ms": pct(lat, 0.99) * 1e3,
        "p50 runs 1-50 ms": statistics.median(lat[:50]) * 1e3,
        "p50 runs 451-500 ms": statistics.median(lat[450:]) * 1e3,
        "CPU ms/run": cpu / 500 * 1e3,
    }  # fmt: skip


async def s2(run: Callable[[str, int], Awaitable[None]], prefix: str, workers: int) -> dict[str, float]:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(200):
        queue.put_nowait(n)
    lat: list[float] = []
    errors = 0

    async def worker() -> None:
        nonlocal errors
        while not queue.empty():
            n = queue.get_nowait()
            for turn in range(10):
                try:
                    lat.append(await timed(lambda n=n, turn=turn: run(f"{prefix}-{n}", turn)))
                except Exception:  # counted: the target is zero
                    errors += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return {"runs/s": 2000 / (time.perf_counter() - started), "p99 ms": pct(lat, 0.99) * 1e3, "errors": errors}


async def s3(sides: Sides, prefix: str) -> dict[str, float]:
    big, small = f"{prefix}-5000", f"{prefix}-20"
    for sid, count in ((big, 5000), (small, 20)):
        run = await sides.store.load(sid, user_id="bench")
        for n in range(count // 2):
            run.history.extend(messages(n))
        await run.commit()
        version, *_ = await sides.floor.load(sid)
        await sides.floor.commit(sid, version, [m for n in range(count // 2) for m in messages(n)], "k", 1)

    loads: dict[str, Callable[[], Awaitable[Any]]] = {
        "store whole 5000 ms": lambda: sides.store.load(big, user_id="bench"),
        "store window 20 of 5000 ms": lambda: sides.store.load(big, user_id="bench", history_limit=20),
        "store whole 20 ms": lambda: sides.store.load(small, user_id="bench"),
        "floor whole 5000 ms": lambda: sides.floor.load(big, limit=None),
        "floor window 20 of 5000 ms": lambda: sides.floor.load(big, limit=20),
        "floor whole 20 ms": lambda: sides.floor.load(small, limit=None),
    }
    # Each load in a block of its own, after a collection and 5 untimed calls of the same load: a load timed
    # right after 5,000-message loads ran about 1.5x slower (the allocator and the collector, not the SQL).
    times: dict[str, list[float]] = {}
    for name, load in loads.items():
        gc.collect()
        for _ in range(5):
            await load()
        times[name] = [await timed(load) for _ in range(15)]
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


async def s4_store(store: Store, sid: str) -> dict[str, float]:
    attempts = 0

    async def work(session: AgentSession) -> None:
        nonlocal attempts
        attempts += 1
        session.state["counter"] = session.state.get("counter", 0) + 1
        session.state["in_memory"]["messages"].extend(messages(attempts))

    async def worker() -> None:
        for _ in range(25):
            await retry_on_conflict(store, sid, work, user_id="bench", history_limit=20, attempts=500)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(8)))
    elapsed = time.perf_counter() - started
    final = await store.load(sid, user_id="bench")
    correct = final.session.state["counter"] == 200 and len(final.history) == 400
    return {"runs/s": 200 / elapsed, "retries": attempts - 200, "correct": float(correct)}


async def s4_floor(floor: Floor, sid: str) -> dict[str, float]:
    attempts = 0

    async def worker() -> None:
        nonlocal attempts
        for _ in range(25):
            while True:
                attempts += 1
                version, _next, state, _h = await floor.load(sid)
                try:
                    await floor.commit(sid, version, messages(attempts), "counter", state.get("counter", 0) + 1)
                    break
                except (Conflict, asyncpg.UniqueViolationError):
                    await asyncio.sleep(0.001)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(8)))
    elapsed = time.perf_counter() - started
    _v, next_seq, state, _h = await floor.load(sid)
    return {
        "runs/s": 200 / elapsed,
        "retries": attempts - 200,
        "correct": float(state["counter"] == 200 and next_seq == 400),
    }


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
