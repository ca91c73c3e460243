"""The usage ledger at size: do the reports stay index-served, how long do they take, what does a call cost a turn?

    python bench/studies/usage_ledger.py [--calls 1000000] [--backends sqlite postgresql] [--turns 300]

Fills a fresh database (in the database itself: sessions, runs, 4 calls a run, over 100 days and 1,000 users),
ANALYZEs it, then per report prints whether its plan reads ``agent_usage`` whole and its median time. Then the
cost of the ledger per turn: commits of runs with one recorded call against the same runs with none, interleaved,
medians. tests/test_usage_plans.py runs the plan checks at a smaller size in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from big_tables import reads_sent

from agent_store import Store

DAYS, PER_RUN, RUNS_PER_SESSION = 100, 4, 25
_PG = [
    """INSERT INTO agent_sessions (id, user_id, version, next_seq, created_at, updated_at, metadata)
       SELECT 'ledger-' || g, 'user-' || (g % :users), :runs, 0, :now, :now, '{}'::jsonb
       FROM generate_series(0, :sessions - 1) g""",
    """INSERT INTO agent_runs (session_id, run_id, version, messages_written, state_keys_written, started_at,
                               committed_at, input_tokens, output_tokens)
       SELECT 'ledger-' || g, 'run-' || r, r + 1, 0, 0, :now, :now, 4000, 400
       FROM generate_series(0, :sessions - 1) g, generate_series(0, :runs - 1) r""",
    """INSERT INTO agent_usage (session_id, run_id, call_no, user_id, agent_name, app_id, called_at, purpose, model,
                                input_tokens, output_tokens, total_tokens)
       SELECT 'ledger-' || (n / :run_calls), 'run-' || ((n / :per) % :runs), n % :per + 1,
              'user-' || ((n / :run_calls) % :users), 'agent-' || (n % 7), 'default',
              CAST(:now AS timestamptz) - (n % :days) * interval '1 day' - (n % 86400) * interval '1 second',
              'chat', 'model-' || (n % 5), 1000, 100, 1100
       FROM generate_series(0, :calls - 1) n""",
]
_SQLITE = [
    """WITH RECURSIVE g(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM g WHERE n + 1 < :sessions)
       INSERT INTO agent_sessions (id, user_id, version, next_seq, created_at, updated_at, metadata)
       SELECT 'ledger-' || n, 'user-' || (n % :users), :runs, 0, :now, :now, '{}' FROM g""",
    """WITH RECURSIVE g(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM g WHERE n + 1 < :sessions * :runs)
       INSERT INTO agent_runs (session_id, run_id, version, messages_written, state_keys_written, started_at,
                               committed_at, input_tokens, output_tokens)
       SELECT 'ledger-' || (n / :runs), 'run-' || (n % :runs), n % :runs + 1, 0, 0, :now, :now, 4000, 400 FROM g""",
    """WITH RECURSIVE g(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM g WHERE n + 1 < :calls)
       INSERT INTO agent_usage (session_id, run_id, call_no, user_id, agent_name, app_id, called_at, purpose, model,
                                input_tokens, output_tokens, total_tokens)
       SELECT 'ledger-' || (n / :run_calls), 'run-' || ((n / :per) % :runs), n % :per + 1,
              'user-' || ((n / :run_calls) % :users), 'agent-' || (n % 7), 'default',
              strftime('%Y-%m-%d %H:%M:%f000', :now, '-' || (n % :days) || ' days', '-' || (n % 86400) || ' seconds'),
              'chat', 'model-' || (n % 5), 1000, 100, 1100 FROM g""",
]


async def fill_ledger(store: Store, *, calls: int, users: int = 1_000) -> None:
    """``calls`` ledger rows (4 a run, 25 runs a session) over the last 100 days, and their runs and sessions."""
    postgres = store.engine.dialect.name == "postgresql"
    now: Any = datetime.now(UTC) if postgres else datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")
    sessions = -(-calls // (PER_RUN * RUNS_PER_SESSION))
    params = {"calls": calls, "users": users, "sessions": sessions, "runs": RUNS_PER_SESSION, "per": PER_RUN,
              "days": DAYS, "now": now, "run_calls": RUNS_PER_SESSION * PER_RUN}  # fmt: skip
    async with store.engine.begin() as conn:
        for statement in _PG if postgres else _SQLITE:
            await conn.execute(text(statement), params)
    async with store.engine.connect() as conn:
        await conn.execute(text("ANALYZE"))
        await conn.commit()


def reports(store: Store) -> dict[str, Any]:
    """The reports an operator runs, by name: the last day, a week, a user's month, everything in 30 days."""
    now = datetime.now(UTC)
    day, week = now - timedelta(days=1), now - timedelta(days=7)
    named: dict[str, Any] = {f"--by {by} --since 1d": (lambda by=by: store.usage.report(by, since=day))
                             for by in ("user", "agent", "model", "day", "session")}  # fmt: skip
    named["--by model --since 7d"] = lambda: store.usage.report("model", since=week)
    named["--by day --user user-7 (30 days)"] = lambda: store.usage.report("day", user_id="user-7")
    named["--by user (30 days, the default)"] = lambda: store.usage.report("user")
    return named


async def ledger_scans(store: Store, statement: str, parameters: Any) -> list[str]:
    """Plan lines where a statement reads ``agent_usage`` whole."""
    async with store.engine.connect() as conn:
        driver: Any = (await conn.get_raw_connection()).driver_connection
        if store.engine.dialect.name == "postgresql":
            plan = [r[0] for r in await driver.fetch("EXPLAIN " + statement, *(parameters or ()))]
            return [line.strip() for line in plan if re.search(r"Seq Scan on agent_usage( |$)", line)]
        cursor = await driver.execute("EXPLAIN QUERY PLAN " + statement, parameters or ())
        details = [row[3] for row in await cursor.fetchall()]
        # SCAN walks a whole table or index (even "USING INDEX"); SEARCH reads a range of one.
        return [d for d in details if re.fullmatch(r"SCAN (agent_usage|u)( .*)?", d)]


async def report_plans(store: Store) -> dict[str, tuple[float, list[str]]]:
    """Per report: median milliseconds (7 runs) and the plan lines that read the ledger whole."""
    found: dict[str, tuple[float, list[str]]] = {}
    for name, call in reports(store).items():
        with reads_sent(store) as sent:
            await call()
        scans = [line for statement, params in sent for line in await ledger_scans(store, statement, params)]
        timings = []
        for _ in range(7):
            started = time.perf_counter()
            await call()
            timings.append(time.perf_counter() - started)
        found[name] = (statistics.median(timings) * 1e3, scans)
    return found


async def cost_per_turn(store: Store, turns: int) -> tuple[float, float]:
    """Median commit milliseconds of a turn with no call recorded and of one with one call (interleaved)."""
    times: dict[bool, list[float]] = {False: [], True: []}
    for n in range(turns):
        for with_call in (False, True):
            run = await store.load(f"turn-{with_call}-{n % 50}", user_id="bench")
            run.session.state["n"] = n
            if with_call:
                run.add_usage({"input_token_count": 1000, "output_token_count": 100, "total_token_count": 1100})
            started = time.perf_counter()
            await run.commit()
            times[with_call].append(time.perf_counter() - started)
    return statistics.median(times[False]) * 1e3, statistics.median(times[True]) * 1e3


async def one_backend(url: str, calls: int, turns: int) -> None:
    async with Store.from_url(url) as store:
        await store.migrate()
        started = time.perf_counter()
        await fill_ledger(store, calls=calls)
        print(f"\n{store.engine.dialect.name}: {calls:,} calls filled in {time.perf_counter() - started:.0f} s")
        print(f"{'report':<40} {'median ms':>10}  reads agent_usage whole?")
        for name, (ms, scans) in (await report_plans(store)).items():
            print(f"{name:<40} {ms:>10.1f}  {'; '.join(scans) or 'no (index)'}")
        plain, ledgered = await cost_per_turn(store, turns)
        print(f"commit of a turn: no call {plain:.2f} ms, one call {ledgered:.2f} ms ({ledgered / plain:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument("--pg-url", default="postgresql+asyncpg://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    import asyncpg

    for backend in args.backends:
        if backend == "sqlite":
            with tempfile.TemporaryDirectory() as tmp:
                asyncio.run(one_backend(f"sqlite+aiosqlite:///{tmp}/ledger.db", args.calls, args.turns))
            continue
        name = f"agent_store_ledger_{int(time.time())}"
        admin = args.pg_url.replace("+asyncpg", "")

        async def create(sql: str, admin: str = admin) -> None:
            conn = await asyncpg.connect(admin)
            try:
                await conn.execute(sql)
            finally:
                await conn.close()

        asyncio.run(create(f'CREATE DATABASE "{name}"'))
        try:
            asyncio.run(one_backend(args.pg_url.rsplit("/", 1)[0] + f"/{name}", args.calls, args.turns))
        finally:
            asyncio.run(create(f'DROP DATABASE "{name}" WITH (FORCE)'))


if __name__ == "__main__":
    main()
