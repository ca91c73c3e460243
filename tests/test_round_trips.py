"""A run costs a fixed, small number of statements and round trips, whatever it writes.

Statements are counted with SQLAlchemy events; PostgreSQL round trips on the wire, through a TCP proxy that
counts the client's requests (each Sync or Query waits for the server's ReadyForQuery; BEGIN and COMMIT count);
SQLite hops to aiosqlite's thread at the one place aiosqlite makes them, with the statements each hop ran.
"""

from __future__ import annotations

from itertools import groupby
from typing import Any

import aiosqlite
import pytest
from agent_framework import Message
from helpers import rows
from lost_reply_proxy import LostReplyProxy
from sqlalchemy import event
from sqlalchemy.engine import make_url

from agent_store import Store


class Counter:
    def __init__(self, store: Store) -> None:
        self.statements: list[str] = []  # through SQLAlchemy
        self.hops: list[list[str]] = []  # SQLite: each hop to aiosqlite's thread, and the SQL it ran there
        self.engine = store.engine.sync_engine
        self.patch = pytest.MonkeyPatch()

    def __enter__(self) -> Counter:
        event.listen(self.engine, "before_cursor_execute", self.count)
        real = aiosqlite.Connection._execute
        hops = self.hops

        async def hop(connection: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
            ran: list[str] = []
            hops.append(ran)

            def traced() -> Any:
                connection._conn.set_trace_callback(ran.append)
                try:
                    return fn(*args, **kwargs)
                finally:
                    connection._conn.set_trace_callback(None)

            return await real(connection, traced)

        self.patch.setattr(aiosqlite.Connection, "_execute", hop)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self.count)
        self.patch.undo()

    def count(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.statements.append(statement.split()[0].upper())

    def in_thread(self) -> list[list[str]]:
        """Each hop's statements (their first three words), an executemany's repeats counted once. What SQLite runs
        inside a statement (the search index's triggers: traced as "-- ...", and FTS5 reading its own config when
        a connection first uses it after a schema change) is not a statement sent."""
        internal = ("--", "PRAGMA 'main'.data_version", "SELECT k, v FROM 'main'")
        sent = [[sql for sql in ran if not sql.startswith(internal)] for ran in self.hops]
        return [[head for head, _ in groupby(" ".join(sql.split()[:3]) for sql in ran)] for ran in sent]


async def one_run(store: Store, n_messages: int, n_keys: int) -> tuple[Counter, Counter]:
    """(what the load sent, what the commit sent) for a run writing n messages, n keys and a user: key."""
    async with store.session("s", user_id="u") as session:
        session.state["doomed"] = True
    with Counter(store) as loading:
        run = await store.load("s", user_id="u", history_limit=20)
    run.history.extend(Message(role="user", contents=[f"m{i}"]) for i in range(n_messages))
    for k in range(n_keys):
        run.session.state[f"key{k}"] = run.session.state.get(f"key{k}", 0) + 1
    run.session.state["user:seen"] = run.session.state.get("user:seen", 0) + 1
    del run.session.state["doomed"]
    with Counter(store) as committing:
        await run.commit()
    return loading, committing


async def test_load_and_commit_take_a_constant_number_of_statements(store: Store) -> None:
    await one_run(store, 1, 1)  # the session exists from here on
    small = [(c.statements, c.in_thread()) for c in await one_run(store, 1, 1)]
    large = [(c.statements, c.in_thread()) for c in await one_run(store, 200, 50)]
    assert small == large
    (load, load_hops), (commit, commit_hops) = small
    # Both run on the driver connection, past SQLAlchemy's execution events: the load is one statement (no
    # transaction: one statement is one snapshot), and the commit one call.
    assert (load, commit) == ([], [])
    if store.engine.dialect.name == "sqlite":
        # One hop each: the pool's rollback as the connection goes back (a hop too) is skipped, as nothing is open.
        assert load_hops == [["WITH window_start AS"]]  # one statement: (the window bounds) SELECT ... UNION ALL
        # The erasure fence, the bump, the session's keys (no stamp check: no other commit came between this run's
        # load and its commit, see the next test), the user's keys (stamps checked: other sessions write them),
        # the messages (one executemany), the run log: one transaction, in one hop.
        assert commit_hops == [[
            "BEGIN IMMEDIATE", "SELECT 1 FROM", "UPDATE agent_sessions SET", "DELETE FROM agent_state",
            "INSERT INTO agent_state", "SELECT key, version", "INSERT INTO agent_user_state",
            "INSERT INTO agent_messages", "INSERT INTO agent_runs", "COMMIT",
        ]]  # fmt: skip


async def test_a_run_that_creates_its_session_commits_in_one_call_too(store: Store) -> None:
    """A session's first run (none existed at its load) creates the row in the same call / hop (migration 0010
    on PostgreSQL): no statement through SQLAlchemy, where the checked path took eight."""
    run = await store.load("new", user_id="u", history_limit=20)
    run.history.append(Message(role="user", contents=["first"]))
    run.session.state["k"] = 1
    with Counter(store) as committing:
        result = await run.commit()
    assert committing.statements == [] and result.version == 1
    if store.engine.dialect.name == "sqlite":  # the erasure fence (a user's new session), the row, its writes
        assert committing.in_thread() == [[
            "BEGIN IMMEDIATE", "SELECT 1 FROM", "INSERT INTO agent_sessions", "INSERT INTO agent_state",
            "INSERT INTO agent_messages", "INSERT INTO agent_runs", "COMMIT",
        ]]  # fmt: skip
    assert await rows(store, "SELECT version, next_seq, user_id, agent_id, expires_at FROM agent_sessions") == [
        (1, 1, "u", None, None)  # the store has no idle TTL: no expiry
    ]


async def test_the_stamp_check_runs_when_another_commit_came_between(store: Store) -> None:
    async with store.session("s", user_id="u") as session:
        session.state["a"] = 0
    mine, other = await store.load("s", user_id="u"), await store.load("s", user_id="u")
    other.session.state["b"] = 1
    await other.commit()
    mine.session.state["a"] = 1
    with Counter(store) as committing:
        await mine.commit()
    checked = ["UPDATE", "SELECT", "INSERT", "INSERT"]  # bump, the keys' stamps, upsert, run log
    if store.engine.dialect.name == "postgresql":  # the one-round-trip call refused (nothing kept), then checked
        assert committing.statements == checked
    else:
        assert committing.statements == ["BEGIN", *checked]


async def test_a_run_is_two_round_trips_on_postgresql(pg_url: str) -> None:
    """Load + commit with 2 messages, a session key and a user: key: 2 requests on the wire, and the same with
    200 messages and 50 keys (the pool keeps one warm connection, as in steady state)."""
    proxy = LostReplyProxy("127.0.0.1", make_url(pg_url).port or 5432)
    port = await proxy.start()
    try:
        async with Store.from_url(pg_url.replace(f":{make_url(pg_url).port}/", f":{port}/"), pool_size=1) as store:
            await store.migrate()
            await one_run(store, 1, 1)  # warm: the session exists, statements are prepared on the connection
            await one_run(store, 1, 1)
            counts = []
            for n_messages, n_keys in ((2, 1), (200, 50)):
                before = proxy.round_trips
                run = await store.load("s", user_id="u", history_limit=20)
                run.history.extend(Message(role="user", contents=[f"m{i}"]) for i in range(n_messages))
                for k in range(n_keys):
                    run.session.state[f"key{k}"] = run.session.state.get(f"key{k}", 0) + 1
                run.session.state["user:seen"] = run.session.state.get("user:seen", 0) + 1
                await run.commit()
                counts.append(proxy.round_trips - before)
            before = proxy.round_trips  # a run that creates its session: the same two
            run = await store.load("new", user_id="u", history_limit=20)
            run.history.append(Message(role="user", contents=["first"]))
            run.session.state["user:seen"] = 1
            await run.commit()
            counts.append(proxy.round_trips - before)
            assert counts == [2, 2, 2]  # also behind PgBouncer (CI's second pass): unnamed statements, one request each
    finally:
        await proxy.stop()


async def test_any_point_reads_back_in_two_round_trips_on_postgresql(pg_url: str) -> None:
    """get(response id) is the key's lookup and one statement, wherever the point is: the head of its session, a
    point the head moved past, a branch, a branch's own head by its session id, flat in the number of branches
    (issue 38). And each reads the history it names."""
    from agent_framework import AgentSession

    from agent_store.agent_framework import StoreSessionStore

    proxy = LostReplyProxy("127.0.0.1", make_url(pg_url).port or 5432)
    port = await proxy.start()
    try:
        async with Store.from_url(pg_url.replace(f":{make_url(pg_url).port}/", f":{port}/"), pool_size=1) as store:
            await store.migrate()
            sessions = StoreSessionStore(store, user_id="u")
            await sessions.set("t0", AgentSession(session_id="t0"))
            parents = {"t1": "t0", "t2": "t1", "t3": "t2", **{f"b{n}": "t1" for n in range(12)}, "c1": "b3"}
            for key, parent in parents.items():
                session = await sessions.get(parent)
                assert session is not None
                session.state.setdefault("in_memory", {}).setdefault("messages", []).append(
                    Message(role="user", contents=[f"to {key}"])
                )
                session.state[f"at_{key}"] = True
                await sessions.set(key, session)
            branch = (await rows(store, "SELECT session_id FROM agent_responses WHERE response_id = 'c1'"))[0][0]
            expected = {"t3": ["to t1", "to t2", "to t3"], "t1": ["to t1"], "b5": ["to t1", "to b5"],
                        "c1": ["to t1", "to b3", "to c1"], branch: ["to t1", "to b3", "to c1"]}  # fmt: skip
            for key, texts in expected.items():
                await sessions.get(key)  # warm: the statements are prepared on the connection
                before = proxy.round_trips
                session = await sessions.get(key)
                trips = proxy.round_trips - before
                assert session is not None and [m.text for m in session.state["in_memory"]["messages"]] == texts
                assert trips == 2, (key, trips)
                marked = sorted(k for k in session.state if k.startswith("at_"))  # the point's state, as it was
                assert marked == sorted("at_" + text.removeprefix("to ") for text in texts), key
    finally:
        await proxy.stop()
