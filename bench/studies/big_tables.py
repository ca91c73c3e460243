"""Many sessions, quickly, and the question "does this query read a whole table?" (tests and bench/)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import event, text

if TYPE_CHECKING:
    from agent_store.store import Store

# Generated in the database itself (one statement per table), so 1,000,000 messages take seconds.
_PG_FILL = [
    """INSERT INTO agent_sessions (id, user_id, version, next_seq, created_at, updated_at, metadata)
       SELECT 'session-' || g, 'user-' || (g % :users), 1, :per, CAST(:now AS timestamptz) - g * interval '1 second',
              CAST(:now AS timestamptz) - g * interval '1 second', '{}'::jsonb
       FROM generate_series(0, :sessions - 1) g""",
    """INSERT INTO agent_messages (session_id, seq, message_id, run_id, role, author_name, text, created_at, body)
       SELECT 'session-' || g, s, md5(g || '-' || s), 'bulk', CASE WHEN s % 2 = 0 THEN 'user' ELSE 'assistant' END,
              NULL, 'message ' || s, :now,
              jsonb_build_object('type', 'message', 'role', CASE WHEN s % 2 = 0 THEN 'user' ELSE 'assistant' END,
                                 'contents', jsonb_build_array(jsonb_build_object('type', 'text', 'text', 'msg ' || s)))
       FROM generate_series(0, :sessions - 1) g, generate_series(0, :per - 1) s""",
]
_SQLITE_FILL = [
    """WITH RECURSIVE g(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM g WHERE n + 1 < :sessions)
       INSERT INTO agent_sessions (id, user_id, version, next_seq, created_at, updated_at, metadata)
       SELECT 'session-' || n, 'user-' || (n % :users), 1, :per, datetime(:now, '-' || n || ' seconds'),
              datetime(:now, '-' || n || ' seconds'), '{}' FROM g""",
    """WITH RECURSIVE g(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM g WHERE n + 1 < :sessions),
                   s(m) AS (SELECT 0 UNION ALL SELECT m + 1 FROM s WHERE m + 1 < :per)
       INSERT INTO agent_messages (session_id, seq, message_id, run_id, role, author_name, text, created_at, body)
       SELECT 'session-' || n, m, n || '-' || m, 'bulk', CASE WHEN m % 2 = 0 THEN 'user' ELSE 'assistant' END,
              NULL, 'message ' || m, :now,
              json_object('type', 'message', 'role', CASE WHEN m % 2 = 0 THEN 'user' ELSE 'assistant' END, 'contents',
                          json_array(json_object('type', 'text', 'text', 'message ' || m)))
       FROM g, s""",
]


async def fill(store: Store, *, sessions: int, messages_per_session: int, users: int) -> None:
    """Add ``sessions`` sessions (ids ``session-N`` of users ``user-(N % users)``) with their messages."""
    postgres = store.engine.dialect.name == "postgresql"
    now: Any = datetime.now(UTC) if postgres else datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")
    params = {"sessions": sessions, "per": messages_per_session, "users": users, "now": now}
    async with store.engine.begin() as conn:
        for statement in _PG_FILL if postgres else _SQLITE_FILL:
            await conn.execute(text(statement), params)
    async with store.engine.connect() as conn:
        await conn.execute(text("ANALYZE"))
        await conn.commit()


@contextmanager
def reads_sent(store: Store) -> Iterator[list[tuple[str, Any]]]:
    """The read statements (SQL text, parameters) sent inside the block: through SQLAlchemy, and the hot ones
    agent_store runs straight on the driver (a run's load), which SQLAlchemy's events do not see."""
    sent: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        if statement.lstrip().upper().startswith(("SELECT", "WITH")) and "alembic_version" not in statement:
            sent.append((statement, parameters))

    driver = store.db.driver
    real = driver.fetch

    async def fetch(conn: Any, statement: Any, params: dict[str, Any], *, lost: str) -> Any:
        sql, names, defaults = driver.compiled(statement)
        sent.append((sql, [params[n] if n in params else defaults[n] for n in names]))
        return await real(conn, statement, params, lost=lost)

    event.listen(store.engine.sync_engine, "before_cursor_execute", capture)
    driver.fetch = fetch  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", capture)
        driver.fetch = real  # type: ignore[method-assign]


async def full_scans(store: Store, statement: str, parameters: Any) -> list[str]:
    """The big tables a statement reads whole, according to the database's own query plan."""
    async with store.engine.connect() as conn:
        raw = await conn.get_raw_connection()
        driver: Any = raw.driver_connection
        if store.engine.dialect.name == "postgresql":
            rows = await driver.fetch("EXPLAIN " + statement, *(parameters or ()))
            plan = [r[0] for r in rows]
            return [
                line.strip()
                for line in plan
                if "Seq Scan on agent_sessions" in line or "Seq Scan on agent_messages" in line
            ]
        cursor = await driver.execute("EXPLAIN QUERY PLAN " + statement, parameters or ())
        details = [row[3] for row in await cursor.fetchall()]
        # "SCAN t USING INDEX" walks an index in order (served by it); a bare "SCAN t" reads the whole table.
        tables = ("agent_sessions", "agent_messages", " m", " s")
        # "SCAN agent_messages_fts VIRTUAL TABLE INDEX ..." is a lookup in the FTS5 index, not a table scan.
        return [d for d in details if d.startswith("SCAN") and "USING" not in d and "VIRTUAL TABLE" not in d
                and any(t in d for t in tables)]  # fmt: skip


async def retention_at_size(store: Store, *, heavy: int, expired: int) -> dict[str, tuple[list[float], list[str]]]:
    """Give ``user-heavy`` the first ``heavy`` sessions and expire the next ``expired``; then erase that user and
    purge. Returns, per operation, each batch's duration (seconds, from one batch's end to the next) and the
    tables its reads scanned whole."""
    import itertools
    import time

    async with store.engine.begin() as conn:
        await conn.execute(text("UPDATE agent_sessions SET user_id = 'user-heavy' WHERE id IN"
                                " (SELECT id FROM agent_sessions ORDER BY id LIMIT :n)"), {"n": heavy})  # fmt: skip
        await conn.execute(text("UPDATE agent_sessions SET expires_at = :t WHERE id IN (SELECT id FROM agent_sessions"
                                " WHERE user_id <> 'user-heavy' ORDER BY id LIMIT :n)"),
                           {"n": expired, "t": datetime(2000, 1, 1, tzinfo=UTC)})  # fmt: skip
    results: dict[str, tuple[list[float], list[str]]] = {}
    operations = {
        f"erase_user ({heavy} sessions)": lambda progress: store.erase_user("user-heavy", progress=progress),
        f"purge_expired ({expired} sessions)": lambda progress: store.purge_expired(progress=progress),
    }
    for name, operation in operations.items():
        ends = [time.perf_counter()]
        with reads_sent(store) as statements:
            await operation(lambda count, ends=ends: ends.append(time.perf_counter()))
        durations = [b - a for a, b in itertools.pairwise(ends)]
        scans = [scan for s, p in statements for scan in await full_scans(store, s, p)]
        results[name] = (durations, scans)
    return results


def documented_sql() -> list[str]:
    """The SQL blocks of the README and the docs pages: tests/helpers.py's DOC_PAGES (all but docs/SCALING.md)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    pages = [root / "README.md", *sorted(p for p in (root / "docs").glob("*.md") if p.name != "SCALING.md")]
    return [sql for page in pages for sql in re.findall(r"```sql\n(.*?)```", page.read_text("utf-8"), flags=re.S)]


async def check_big(url: str, sessions: int, per_session: int, users: int) -> list[tuple[str, float, list[str]]]:
    """Fill a fresh store, then time each hot read and report the tables it reads whole (none, hopefully)."""
    import statistics
    import time

    from agent_framework import Message

    from agent_store import Store

    documented = documented_sql()
    results: list[tuple[str, float, list[str]]] = []
    async with Store.from_url(url) as store:
        await store.migrate()
        await fill(store, sessions=sessions, messages_per_session=per_session, users=users)
        await store.downgrade("0006")  # the search indexes, built over the filled table: the migration's backfill
        started = time.perf_counter()
        await store.migrate()
        results.append(
            (
                "upgrade 0006 -> head (builds the search indexes: their backfill)",
                (time.perf_counter() - started) * 1e3,
                [],
            )
        )
        # A user with a long history (a twentieth of all messages), where a rare word is best found by the index.
        async with store.engine.begin() as conn:
            move = (
                "UPDATE agent_sessions SET user_id = 'user-big' WHERE id IN (SELECT id FROM agent_sessions"
                " WHERE user_id <> 'user-7' LIMIT :n)"
            )
            await conn.execute(text(move), {"n": sessions // 20})
        big = (await store.list_sessions(user_id="user-big", limit=1)).items[0].id
        for sid, uid in (("session-7", "user-7"), (big, "user-big")):  # something for the searches to find
            async with store.session(sid, user_id=uid) as session:
                session.state["in_memory"]["messages"].append(Message(role="user", contents=["我叫李明, quokka AI"]))
        async with store.engine.connect() as conn:
            await conn.execute(text("ANALYZE"))
            await conn.commit()
        first = await store.list_sessions(user_id="user-7", limit=20)
        calls = {
            "list a user's sessions (page 1)": lambda: store.list_sessions(user_id="user-7", limit=20),
            "list a user's sessions (page 2)": lambda: store.list_sessions(
                user_id="user-7", limit=20, cursor=first.next_cursor
            ),
            "page a transcript": lambda: store.messages("session-7", user_id="user-7", after_seq=3, limit=5),
            "load a session, last 20 messages": lambda: store.load("session-7", user_id="user-7", history_limit=20),
            "search a user's messages: quokka": lambda: store.search("quokka", user_id="user-7"),
            "search a user's messages: 李明 (two characters)": lambda: store.search("李明", user_id="user-7"),
            "search a user's messages: AI (a short word)": lambda: store.search("AI", user_id="user-7"),
            "search a user's messages: message (in every message)": lambda: store.search("message", user_id="user-7"),
            f"search a user with {sessions // 20 * per_session} messages: quokka": lambda: store.search(
                "quokka", user_id="user-big"
            ),
        }  # fmt: skip
        for name, call in calls.items():
            await call()
            with reads_sent(store) as statements:
                await call()
            scans = [scan for s, p in statements for scan in await full_scans(store, s, p)]
            timings = []
            for _ in range(30):
                started = time.perf_counter()
                await call()
                timings.append(time.perf_counter() - started)
            results.append((name, statistics.median(timings) * 1e3, scans))
        for sql in documented:
            sql = sql.strip().rstrip(";").replace("'chat-42'", "'session-7'").replace("'u1'", "'user-7'")
            timings = []
            async with store.engine.connect() as conn:
                for _ in range(10):
                    started = time.perf_counter()
                    await conn.execute(text(sql))
                    timings.append(time.perf_counter() - started)
            results.append(
                ("docs: " + sql[:60] + "...", statistics.median(timings) * 1e3, await full_scans(store, sql, None))
            )
        heavy, expired = sessions // 20, sessions // 10
        for name, (durations, scans) in (await retention_at_size(store, heavy=heavy, expired=expired)).items():
            each = ", ".join(f"{d * 1e3:.0f}" for d in durations)
            results.append((f"{name}: {len(durations)} batches, max {max(durations) * 1e3:.0f} ms; each: {each}",
                            statistics.median(durations) * 1e3, scans))  # fmt: skip
    return results


def main() -> None:
    import argparse
    import asyncio

    import asyncpg

    parser = argparse.ArgumentParser(description="Hot reads on a big store: index use (EXPLAIN) and timings.")
    parser.add_argument("--pg-url", default="postgresql+asyncpg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--messages-per-session", type=int, default=10)
    parser.add_argument("--users", type=int, default=5_000)
    args = parser.parse_args()

    async def run() -> list[tuple[str, float, list[str]]]:
        admin = await asyncpg.connect(args.pg_url.replace("+asyncpg", ""))
        await admin.execute("DROP DATABASE IF EXISTS agent_store_big WITH (FORCE)")
        await admin.execute("CREATE DATABASE agent_store_big")
        await admin.close()
        url = args.pg_url.rsplit("/", 1)[0] + "/agent_store_big"
        return await check_big(url, args.sessions, args.messages_per_session, args.users)

    results = asyncio.run(run())
    total = args.sessions * args.messages_per_session
    print(f"{args.sessions} sessions, {total} messages, {args.users} users (PostgreSQL)\n")
    print("| read | median ms | tables read whole |")
    print("|---|---|---|")
    for name, ms, scans in results:
        print(f"| {name} | {ms:.2f} | {', '.join(scans) or 'none (index)'} |")
    raise SystemExit(1 if any(scans for _, _, scans in results) else 0)


if __name__ == "__main__":
    main()
