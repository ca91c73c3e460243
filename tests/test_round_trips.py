"""A run costs a fixed, small number of statements and round trips, whatever it writes.

Statements are counted with SQLAlchemy events; PostgreSQL round trips on the wire, through a TCP proxy that
counts the client's requests (each Sync or Query waits for the server's ReadyForQuery; BEGIN and COMMIT count).
"""

from __future__ import annotations

from typing import Any

from agent_framework import Message
from lost_reply_proxy import LostReplyProxy
from sqlalchemy import event
from sqlalchemy.engine import make_url

from agent_store import Store


class Counter:
    def __init__(self, store: Store) -> None:
        self.statements: list[str] = []
        self.engine = store.engine.sync_engine

    def __enter__(self) -> Counter:
        event.listen(self.engine, "before_cursor_execute", self.count)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self.count)

    def count(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.statements.append(statement.split()[0].upper())


async def one_run(store: Store, n_messages: int, n_keys: int) -> tuple[list[str], list[str]]:
    """(statements of the load, statements of the commit) for a run writing n messages, n keys and a user: key."""
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
    return loading.statements, committing.statements


async def test_load_and_commit_take_a_constant_number_of_statements(store: Store) -> None:
    await one_run(store, 1, 1)  # the session exists from here on
    small = await one_run(store, 1, 1)
    large = await one_run(store, 200, 50)
    assert small == large
    load, commit = small
    # The load is one statement and no transaction (no BEGIN on SQLite either): session row, state rows of every
    # scope and the windowed messages in one snapshot.
    if store.engine.dialect.name == "postgresql":
        # Both run on the driver connection, past SQLAlchemy's execution events: the load statement and
        # SELECT agent_store_commit(...), one statement that is its own transaction (counted on the wire below).
        assert (load, commit) == ([], [])
    else:
        assert load == ["WITH"]  # one statement: WITH (the window's bounds) SELECT ... UNION ALL ...
        # The erasure fence, the bump, the session's keys (no stamp check: no other commit came between this run's
        # load and its commit, see the next test), the user's keys (stamps checked: other sessions write them),
        # the messages (one executemany), the run log.
        assert commit == ["BEGIN", "SELECT", "UPDATE", "DELETE", "INSERT", "SELECT", "INSERT", "INSERT", "INSERT"]


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
            assert counts == [2, 2]  # also behind PgBouncer (CI's second pass): unnamed statements, one request each
    finally:
        await proxy.stop()
