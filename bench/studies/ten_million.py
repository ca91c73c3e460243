"""10,000,000 messages: what stays flat as the tables grow 100-fold (issue 28). PostgreSQL; outside CI.

    python bench/studies/ten_million.py                      # 100,000 messages, then 10,000,000 (about 30 minutes here)
    python bench/studies/ten_million.py --scales 100000 1000000

For each scale, a fresh database holds sessions of many sizes (6 in 10 of 33 messages, 3 in 10 of 100, 1 in 10
of 500: 100 on average), 20 sessions a user. The rows are generated in the database at schema 0006 (one
INSERT ... SELECT per table: the fastest bulk path, faster than COPY from the client); the upgrade to head then
builds the search indexes over them (0007's backfill, as an operator's upgrade would), and the tables are
VACUUM ANALYZEd. Then, on random sessions of every size, p50/p99 of:

- a run's load, the last 20 messages and the whole history (its size varies with the session: compare scales);
- a run's commit (2 messages and a state key);
- a user's search for a rare word, and a user's listing (page 1);
- purge_expired's batches (200 sessions expired) and erase_user's batches (a user of 200 sessions).

The table prints both scales side by side and their ratio: a ratio near 1 is flat.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg
from agent_framework import Message
from big_tables import full_scans, reads_sent
from sqlalchemy import text

from agent_store import Store

# A session's size: 6 in 10 of 33 messages, 3 in 10 of 100, 1 in 10 of 500 (100 on average).
FILL = [
    """INSERT INTO agent_sessions (id, user_id, version, next_seq, created_at, updated_at, metadata)
        SELECT 'session-' || g, 'user-' || (g / 20), 1,
               CASE WHEN g % 10 = 0 THEN 500 WHEN g % 10 < 4 THEN 100 ELSE 33 END,
               now() - g * interval '1 second', now() - g * interval '1 second', '{}'::jsonb
        FROM generate_series(0, :sessions - 1) g""",
    """INSERT INTO agent_messages (session_id, seq, message_id, run_id, role, text, created_at, body)
        SELECT 'session-' || g, s, md5(g || '-' || s), 'bulk', CASE WHEN s % 2 = 0 THEN 'user' ELSE 'assistant' END,
               'message ' || s || ' of session ' || g, now(),
               jsonb_build_object('type', 'message', 'role', CASE WHEN s % 2 = 0 THEN 'user' ELSE 'assistant' END,
                                  'contents', jsonb_build_array(jsonb_build_object('type', 'text',
                                                                'text', 'message ' || s || ' of session ' || g)))
        FROM generate_series(0, :sessions - 1) g,
             generate_series(0, CASE WHEN g % 10 = 0 THEN 500 WHEN g % 10 < 4 THEN 100 ELSE 33 END - 1) s""",
]
SAMPLES = 200
EXPIRE = """UPDATE agent_sessions SET expires_at = :t
            WHERE id IN (SELECT id FROM agent_sessions WHERE user_id <> 'user-heavy' ORDER BY id LIMIT :n)"""
HEAVY_USER = """UPDATE agent_sessions SET user_id = 'user-heavy'
                WHERE id IN (SELECT id FROM agent_sessions WHERE expires_at IS NULL ORDER BY id DESC LIMIT 200)"""


async def fresh_store(pg_url: str, name: str) -> Store:
    admin = await asyncpg.connect(pg_url.replace("+asyncpg", ""))
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    store = Store.from_url(pg_url.rsplit("/", 1)[0] + "/" + name, pool_size=4)
    await store.migrate("0006")
    return store


async def build(store: Store, sessions: int) -> float:
    """Fill at 0006, upgrade (building the search indexes over the rows), VACUUM ANALYZE; returns the seconds."""
    started = time.perf_counter()
    async with store.engine.begin() as conn:
        for statement in FILL:
            await conn.execute(text(statement), {"sessions": sessions})
    await store.migrate()
    async with store.engine.connect() as conn:
        autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await autocommit.execute(text("VACUUM ANALYZE"))
    return time.perf_counter() - started


Found = tuple[float, float, list[str]]  # p50 ms, p99 ms, the plan lines that read a big table whole


async def scans_of(store: Store, call: Callable[[], Awaitable[Any]]) -> list[str]:
    with reads_sent(store) as statements:
        await call()
    return [scan for statement, params in statements for scan in await full_scans(store, statement, params)]


async def percentiles(store: Store, call: Callable[[int], Awaitable[Any]], samples: int = SAMPLES) -> Found:
    """p50 and p99 milliseconds of ``samples`` calls (after 5 unmeasured ones), and what one call reads whole."""
    scans = await scans_of(store, lambda: call(-1))
    for n in range(5):
        await call(n)
    timings = []
    for n in range(samples):
        started = time.perf_counter()
        await call(n)
        timings.append((time.perf_counter() - started) * 1e3)
    timings.sort()
    return statistics.median(timings), timings[min(len(timings) - 1, int(0.99 * len(timings)))], scans


async def measure(store: Store, sessions: int) -> dict[str, Found]:
    pick = random.Random(7)
    sid = lambda: pick.randrange(sessions)  # noqa: E731

    async def load(limit: int | None) -> None:
        g = sid()
        await store.load(f"session-{g}", user_id=f"user-{g // 20}", history_limit=limit)

    async def commit(_: int) -> None:
        g = sid()
        run = await store.load(f"session-{g}", user_id=f"user-{g // 20}", history_limit=20)
        run.history.extend([Message(role="user", contents=["hello"]), Message(role="assistant", contents=["hi"])])
        run.session.state["n"] = g
        started = time.perf_counter()
        await run.commit()
        commit_times.append((time.perf_counter() - started) * 1e3)

    commit_times: list[float] = []
    found: dict[str, Found] = {
        "load, last 20 messages": await percentiles(store, lambda _: load(20)),
        "load, whole history (33-500 messages)": await percentiles(store, lambda _: load(None)),
    }
    await percentiles(store, commit)
    commit_times = sorted(commit_times[6:])  # the plan's call and 5 warm-up calls
    # (the commit is one call of the commit function: its statements are planned inside the server, unseen here)
    found["commit (2 messages, a state key)"] = (statistics.median(commit_times), commit_times[-2], [])
    for g in range(0, sessions, max(1, sessions // 50)):  # a rare word in some sessions
        async with store.session(f"session-{g}", user_id=f"user-{g // 20}") as session:
            session.state["in_memory"]["messages"].append(Message(role="user", contents=["a quokka here"]))
    found["search a user's messages: quokka"] = await percentiles(
        store, lambda _: store.search("quokka", user_id=f"user-{sid() // 20}")
    )
    found["list a user's sessions (page 1)"] = await percentiles(
        store, lambda _: store.list_sessions(user_id=f"user-{sid() // 20}", limit=20)
    )
    async with store.engine.begin() as conn:  # 200 sessions expired; a user of 200 sessions
        await conn.execute(text(EXPIRE), {"n": 200, "t": datetime(2000, 1, 1, tzinfo=UTC)})
        await conn.execute(text(HEAVY_USER))
    for name, operation in {
        "purge_expired, one batch": lambda progress: store.purge_expired(progress=progress),
        "erase_user (200 sessions), one batch": lambda progress: store.erase_user("user-heavy", progress=progress),
    }.items():
        ends = [time.perf_counter()]
        with reads_sent(store) as statements:
            await operation(lambda _count, ends=ends: ends.append(time.perf_counter()))
        batches = sorted((b - a) * 1e3 for a, b in itertools.pairwise(ends))
        scans = [scan for st, params in statements for scan in await full_scans(store, st, params)]
        found[name] = (statistics.median(batches), batches[-1], scans)  # few batches: the slowest stands for p99
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg-url", default="postgresql+asyncpg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--scales", type=int, nargs="+", default=[100_000, 10_000_000], help="messages")
    args = parser.parse_args()

    async def run() -> dict[int, tuple[float, dict[str, Found]]]:
        results = {}
        for messages in args.scales:
            store = await fresh_store(args.pg_url, f"agent_store_scale_{messages}")
            try:
                built = await build(store, messages // 100)
                results[messages] = (built, await measure(store, messages // 100))
                print(f"{messages:,} messages: built in {built:.0f} s", flush=True)
            finally:
                await store.close()
        return results

    results = asyncio.run(run())
    small, big = args.scales[0], args.scales[-1]
    print(f"\n| operation | {small:,}: p50 / p99 ms | {big:,}: p50 / p99 ms | p50 ratio | p99 ratio | "
          f"read whole at {big:,} |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for name, (p50, p99, _) in results[small][1].items():
        b50, b99, scans = results[big][1][name]
        print(f"| {name} | {p50:.1f} / {p99:.1f} | {b50:.1f} / {b99:.1f} | {b50 / p50:.2f}x | {b99 / p99:.2f}x "
              f"| {'; '.join(scans) or 'nothing (index)'} |")  # fmt: skip
    raise SystemExit(1 if any(scans for _, found in results.values() for *_, scans in found.values()) else 0)


if __name__ == "__main__":
    main()
