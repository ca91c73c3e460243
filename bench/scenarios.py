"""The benchmark's work: one run on each side (agent_store, the raw-driver floors) and the scenarios S1-S4.

S1 one session, 500 sequential runs (load + 2 messages + 1 session key + 1 user: key), with the last 20
messages or the whole history (up to 1,000 messages); S2 200 sessions x 10 runs, 32 workers; S3 loading a
5,000-message session whole and with history_limit=20 vs a 20-message session; S4 8 workers x 25 runs racing on
one session with retries. ``bench.py`` runs them and prints the table.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from agent_framework import AgentSession, Message
from floor import Conflict, Floor

from agent_store import Store, retry_on_conflict

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


# A turn's model call, as the store's providers record it (the usage ledger), and the floor keeps its counts (the
# same work); bench.py --no-ledger: neither.
USAGE: dict[str, int] | None = {"input_token_count": 1200, "output_token_count": 80, "total_token_count": 1280}


async def store_run(store: Store, sid: str, n: int, limit: int | None = 20) -> None:
    run = await store.load(sid, user_id=f"user-{sid}", history_limit=limit)  # S2: 200 users, one session each
    run.history.extend(messages(n))
    run.add_usage(USAGE)
    run.session.state["counter"] = n
    run.session.state["user:last_seen"] = n
    await run.commit()


async def floor_run(floor: Floor, sid: str, n: int, limit: int | None = 20, objects: bool = True) -> None:
    version, _next, _state, _history = await floor.load(sid, limit, objects=objects)
    usage = (
        None if USAGE is None else (USAGE["input_token_count"], USAGE["output_token_count"], USAGE["total_token_count"])
    )
    await floor.commit(sid, version, messages(n), "counter", n, usage)


class Sides:
    """The implementations of one run over the same database: agent_store, the floor that builds the framework's
    objects (``floor``), and the floor of rows only (``rows``); each with the last 20 messages or the whole
    history (``*_whole``)."""

    def __init__(self, store: Store, floor: Floor) -> None:
        self.store, self.floor = store, floor

    async def store_run(self, sid: str, n: int) -> None:
        await store_run(self.store, sid, n)

    async def floor_run(self, sid: str, n: int) -> None:
        await floor_run(self.floor, sid, n)

    async def rows_run(self, sid: str, n: int) -> None:
        await floor_run(self.floor, sid, n, objects=False)

    async def store_whole(self, sid: str, n: int) -> None:
        await store_run(self.store, sid, n, None)

    async def floor_whole(self, sid: str, n: int) -> None:
        await floor_run(self.floor, sid, n, None)

    async def rows_whole(self, sid: str, n: int) -> None:
        await floor_run(self.floor, sid, n, None, objects=False)


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


async def s2(
    run: Callable[[str, int], Awaitable[None]],
    prefix: str,
    workers: int,
    trace: list[tuple[float, float]] | None = None,
) -> dict[str, float]:
    """``trace`` (if given) gets (seconds since the start, latency) of every run as it ends."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(200):
        queue.put_nowait(n)
    lat: list[float] = []
    errors = 0
    started = time.perf_counter()

    async def worker() -> None:
        nonlocal errors
        while not queue.empty():
            n = queue.get_nowait()
            for turn in range(10):
                try:
                    lat.append(await timed(lambda n=n, turn=turn: run(f"{prefix}-{n}", turn)))
                    if trace is not None:
                        trace.append((time.perf_counter() - started, lat[-1]))
                except Exception:  # counted: the target is zero
                    errors += 1

    await asyncio.gather(*(worker() for _ in range(workers)))
    elapsed = time.perf_counter() - started
    return {"runs/s": 2000 / elapsed, "p50 ms": pct(lat, 0.5) * 1e3, "p99 ms": pct(lat, 0.99) * 1e3, "errors": errors}


def per_second(trace: list[tuple[float, float]]) -> list[tuple[int, int, float, float]]:
    """S2's latency trace: (second, runs ended in it, p50 ms, p99 ms)."""
    by_second: dict[int, list[float]] = {}
    for at, latency in trace:
        by_second.setdefault(int(at), []).append(latency)
    return [(t, len(v), pct(v, 0.5) * 1e3, pct(v, 0.99) * 1e3) for t, v in sorted(by_second.items())]


async def s3(sides: Sides, prefix: str) -> dict[str, float]:
    big, small = f"{prefix}-5000", f"{prefix}-20"
    for sid, count in ((big, 5000), (small, 20)):
        run = await sides.store.load(sid, user_id="bench")
        for n in range(count // 2):
            run.history.extend(messages(n))
        await run.commit()
        version, *_ = await sides.floor.load(sid)
        await sides.floor.commit(sid, version, [m for n in range(count // 2) for m in messages(n)], "k", 1, None)

    loads: dict[str, Callable[[], Awaitable[Any]]] = {
        "store whole 5000": lambda: sides.store.load(big, user_id="bench"),
        "store window 20 of 5000": lambda: sides.store.load(big, user_id="bench", history_limit=20),
        "store whole 20": lambda: sides.store.load(small, user_id="bench"),
        "floor whole 5000": lambda: sides.floor.load(big, limit=None),
        "floor window 20 of 5000": lambda: sides.floor.load(big, limit=20),
        "floor whole 20": lambda: sides.floor.load(small, limit=None),
        "rows whole 5000": lambda: sides.floor.load(big, limit=None, objects=False),
        "rows window 20 of 5000": lambda: sides.floor.load(big, limit=20, objects=False),
        "rows whole 20": lambda: sides.floor.load(small, limit=None, objects=False),
    }
    # Each load in a block of its own, after a collection and 5 untimed calls of the same load: a load timed
    # right after 5,000-message loads ran about 1.5x slower (the allocator and the collector, not the SQL).
    out: dict[str, float] = {}
    for name, load in loads.items():
        gc.collect()
        for _ in range(5):
            await load()
        times = [await timed(load) for _ in range(15)]
        out[f"{name} ms"] = statistics.median(times) * 1e3
        if "5000" in name:
            out[f"{name} p99 ms"] = pct(times, 0.99) * 1e3
    return out


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
                    await floor.commit(sid, version, messages(attempts), "counter", state.get("counter", 0) + 1, None)
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
