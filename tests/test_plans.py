"""Every hot read is served by an index: checked on the query plans over a store of many sessions.

CI uses 20,000 sessions and 100,000 messages; `bench/studies/big_tables.py` runs the same checks at 100,000 / 1,000,000.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from agent_framework import Message
from helpers import doc_blocks, rows
from sqlalchemy import text

from agent_store import Store

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench" / "studies"))
from big_tables import documented_sql, fill, full_scans, reads_sent, retention_at_size


@pytest.fixture
async def big(store: Store) -> Store:
    await fill(store, sessions=20_000, messages_per_session=5, users=1_000)
    return store


async def analyze(store: Store) -> None:
    async with store.engine.connect() as conn:
        await conn.execute(text("ANALYZE"))
        await conn.commit()


async def captured(store: Store, call: Callable[[], Awaitable[Any]]) -> list[tuple[str, Any]]:
    """The read statements (with their parameters) that ``call`` sends, the driver's hot path included."""
    with reads_sent(store) as sent:
        await call()
    return sent


async def test_listing_paging_and_loading_use_indexes(big: Store) -> None:
    page = await big.list_sessions(user_id="user-7", limit=10)
    assert len(page.items) == 10 and page.next_cursor is not None
    calls: list[Callable[[], Awaitable[Any]]] = [
        lambda: big.list_sessions(user_id="user-7", limit=10),
        lambda: big.list_sessions(user_id="user-7", limit=10, cursor=page.next_cursor),
        lambda: big.list_sessions(all_users=True, limit=10),
        lambda: big.messages("session-7", user_id="user-7", after_seq=1, limit=2),
        lambda: big.load("session-7", user_id="user-7", history_limit=3),
        lambda: big.load("session-7", user_id="user-7"),
    ]
    for call in calls:
        statements = await captured(big, call)
        assert statements
        for statement, parameters in statements:
            if "alembic_version" in statement:
                continue
            assert await full_scans(big, statement, parameters) == [], statement


def test_the_bench_reads_the_documented_sql() -> None:
    assert sorted(documented_sql()) == sorted(block.source for block in doc_blocks("sql"))


async def test_the_documented_sql_uses_indexes(big: Store) -> None:
    """Every SQL block of the README and the docs pages (tests/helpers.py: DOC_PAGES), by its name."""
    queries = {block.name: block.source for block in doc_blocks("sql")}
    assert len(queries) == 12
    # The compaction queries: the model's view and the exclusions are one session's range; the per-session
    # counts, the tool calls per tool and the usage ledger's daily view read their table whole (operators'
    # reports, not hot paths; the ledger's reports by period are checked in test_usage_plans.py).
    del queries["excluded-per-session"], queries["tool-calls-per-tool"], queries["usage-daily"]
    for sql in queries.values():
        sql = sql.strip().rstrip(";").replace("'chat-42'", "'session-7'").replace("'u1'", "'user-7'")
        assert await full_scans(big, sql, None) == [], sql
        async with big.engine.connect() as conn:
            await conn.execute(text(sql))


async def test_retention_at_size_runs_in_bounded_index_served_batches(big: Store) -> None:
    """1,000 sessions (5,000 messages) erased with their user and 2,000 purged: every batch deletes at most
    BATCH_MESSAGES messages (5 per session here) and 500 sessions, and no read scans a big table whole."""
    results = await retention_at_size(big, heavy=1_000, expired=2_000)
    (erase_batches, erase_scans), (purge_batches, purge_scans) = results.values()
    assert (erase_scans, purge_scans) == ([], [])
    assert len(erase_batches) == 2 and len(purge_batches) == 4  # 500 sessions x 5 messages: the session bound
    assert await rows(big, "SELECT count(*) FROM agent_sessions WHERE user_id = 'user-heavy'") == [(0,)]
    assert await rows(big, "SELECT count(*) FROM agent_sessions") == [(17_000,)]
    assert await rows(big, "SELECT count(*) FROM agent_messages") == [(85_000,)]


@pytest.mark.parametrize("query", ["quokka", "李明", "AI", "叫李明 quokka"])
async def test_a_search_for_one_user_is_index_served(big: Store, query: str) -> None:
    """Three or more characters: the trigram index (PostgreSQL) or the FTS5 table (SQLite); a short word: the
    full-text index (PostgreSQL) or the user's own sessions; two CJK characters: the user's own sessions."""
    async with big.session("session-7", user_id="user-7") as session:
        session.state["in_memory"]["messages"].append(Message(role="user", contents=["我叫李明, quokka AI"]))
    await analyze(big)
    statements = await captured(big, lambda: big.search(query, user_id="user-7"))
    assert statements
    for statement, parameters in statements:
        assert await full_scans(big, statement, parameters) == [], statement
    assert [(h.session_id, h.seq) for h in (await big.search(query, user_id="user-7")).items] == [("session-7", 5)]


async def test_looking_up_stored_message_ids_is_index_served(big: Store) -> None:
    """A retried save looks up the ids it carries (PostgreSQL: by their MD5, the unique index's key, 0011)."""
    from agent_store.db.statements import already_stored

    ids = [r[0] for r in await rows(big, "SELECT message_id FROM agent_messages WHERE session_id = 'session-7'")]
    assert len(ids) == 5

    async def lookup() -> None:
        async with big.engine.connect() as conn:
            assert await already_stored(conn, "session-7", [*ids[:2], "not-stored"]) == set(ids[:2])

    await analyze(big)
    ((statement, parameters),) = await captured(big, lookup)
    assert await full_scans(big, statement, parameters) == [], statement
    async with big.engine.connect() as conn:  # by the id's index key, not a walk of the session's messages
        driver: Any = (await conn.get_raw_connection()).driver_connection
        if big.engine.dialect.name == "postgresql":
            plan = [r[0] for r in await driver.fetch("EXPLAIN " + statement, *parameters)]
            assert any("Index Cond" in line and "md5" in line for line in plan), plan
        else:
            cursor = await driver.execute("EXPLAIN QUERY PLAN " + statement, parameters)
            plan = [r[3] for r in await cursor.fetchall()]
            assert any("(session_id=? AND message_id=?)" in line for line in plan), plan


async def test_the_commit_function_never_reads_the_sessions_messages(pg_url: str) -> None:
    """PostgreSQL: the one-call commit, as installed, only inserts into ``agent_messages`` (an id stored twice is
    refused by the unique index itself since 0012), so its cost never grows with the session's history (0011's
    check had to be a probe per id: a join there let the cached generic plan read a session's every message)."""
    async with Store.from_url(pg_url) as store:
        await store.migrate()
        source = (await rows(store, "SELECT prosrc FROM pg_proc WHERE proname = 'agent_store_commit'"))[0][0]
    assert "INSERT INTO agent_messages" in source and "no_deletes" in source
    assert re.search(r"\bFROM\s+agent_messages\b", source) is None, source


async def test_a_window_planned_before_any_statistics_reads_only_the_window(url: str) -> None:
    """A connection keeps the generic plan of its first runs' loads, which on a new database were planned with
    no statistics at all: the window's messages must still come from the primary key's (session_id, seq) range,
    not from the message-id index's session prefix (every message of the session, whatever the window)."""
    async with Store.from_url(url) as store:
        await store.migrate()
        run = await store.load("s", user_id="u")
        run.history.extend(Message(role="user", contents=[f"m{n}"]) for n in range(3))
        await run.commit()
        ((statement, parameters),) = await captured(store, lambda: store.load("s", user_id="u", history_limit=2))
        async with store.engine.connect() as conn:
            driver: Any = (await conn.get_raw_connection()).driver_connection
            if store.engine.dialect.name == "postgresql":
                types = [t.name for t in (await driver.prepare(statement)).get_parameters()]
                async with driver.transaction():  # one server connection, also behind PgBouncer
                    await driver.execute("SET LOCAL plan_cache_mode = force_generic_plan")
                    await driver.execute(f"PREPARE window_load({', '.join(types)}) AS {statement}")
                    values = [await driver.fetchval("SELECT quote_literal($1::text)", str(p)) for p in parameters]
                    plan = [r[0] for r in await driver.fetch(f"EXPLAIN EXECUTE window_load({', '.join(values)})")]
                    await driver.execute("DEALLOCATE window_load")
                scans = [line for line in plan if "on agent_messages" in line]
                assert scans and all("pk_agent_messages" in line for line in scans), plan
                # The results in the window (the tool-calls range the window may widen back from) likewise.
                at = next(n for n, line in enumerate(plan) if "on agent_tool_calls result" in line)
                assert "pk_agent_tool_calls" in plan[at] and "seq >=" in plan[at + 1], plan
                assert sum("Index Cond" in line and "seq >=" in line for line in plan) == 2, plan
            else:
                cursor = await driver.execute("EXPLAIN QUERY PLAN " + statement, parameters)
                plan = [r[3] for r in await cursor.fetchall()]
                assert any("agent_messages" in line and "seq>?" in line for line in plan), plan


async def test_the_last_20_of_5000_messages_read_20_rows_and_sort_no_more(store: Store) -> None:
    """Issue 43 point 2: a last-20 load of a 5,000-message session reads the window's rows from the primary key's
    (session_id, seq) range and sorts nothing bigger than what it returns (the union of the load's parts, 21
    rows), in the plan a connection caches after five loads (the generic one) as in the first: EXPLAIN ANALYZE's
    row counts on PostgreSQL, the plan's steps on SQLite."""
    run = await store.load("big", user_id="u")
    for n in range(2500):
        run.history.extend([Message(role="user", contents=[f"q{n}"]), Message(role="assistant", contents=[f"a{n}"])])
    await run.commit()
    await analyze(store)
    ((statement, parameters),) = [s for s in await captured(store, lambda: store.load("big", user_id="u",
                                                                                       history_limit=20))
                                  if "agent_messages" in s[0]]  # fmt: skip
    loaded = await store.load("big", user_id="u", history_limit=20)
    assert [m.text for m in loaded.history][-2:] == ["q2499", "a2499"] and len(loaded.history) == 20
    async with store.engine.connect() as conn:
        driver: Any = (await conn.get_raw_connection()).driver_connection
        if store.engine.dialect.name == "postgresql":
            types = [t.name for t in (await driver.prepare(statement)).get_parameters()]
            values = [await driver.fetchval("SELECT quote_literal($1::text)", str(p)) for p in parameters]
            for mode in ("force_custom_plan", "force_generic_plan"):
                async with driver.transaction():
                    await driver.execute(f"SET LOCAL plan_cache_mode = {mode}")
                    await driver.execute(f"PREPARE last20({', '.join(types)}) AS {statement}")
                    plan = [r[0] for r in await driver.fetch(f"EXPLAIN ANALYZE EXECUTE last20({', '.join(values)})")]
                    await driver.execute("DEALLOCATE last20")
                rows_of = [int(m.group(1)) for line in plan for m in [re.search(r"actual time=\S+ rows=(\d+)", line)]
                           if m and ("Sort" in line or "on agent_messages" in line)]  # fmt: skip
                assert rows_of and max(rows_of) <= 21, plan  # the window (and the session's row), never 5,000
                scans = [line for line in plan if "on agent_messages" in line]
                assert scans and all("pk_agent_messages" in line for line in scans), plan
        else:
            cursor = await driver.execute("EXPLAIN QUERY PLAN " + statement, parameters)
            plan = [r[3] for r in await cursor.fetchall()]
            messages = [line for line in plan if "agent_messages" in line]
            assert messages and all(line.startswith("SEARCH") and "seq" in line for line in messages), plan
