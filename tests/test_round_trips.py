"""A run costs a fixed, small number of statements, whatever it writes (counted with SQLAlchemy events)."""

from __future__ import annotations

from typing import Any

from agent_framework import Message
from sqlalchemy import event

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
    """(statements of the load, statements of the commit) for a run writing n messages and n keys."""
    async with store.session("s", user_id="u") as session:
        session.state["doomed"] = True
    with Counter(store) as loading:
        run = await store.load("s", user_id="u", history_limit=20)
    run.history.extend(Message(role="user", contents=[f"m{i}"]) for i in range(n_messages))
    for k in range(n_keys):
        run.session.state[f"key{k}"] = run.session.state.get(f"key{k}", 0) + 1
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
    # BEGIN/COMMIT are not statements the DBAPI executes on PostgreSQL; SQLite's explicit BEGIN is counted.
    assert len([s for s in load if s == "SELECT"]) == 3  # session row, state rows of every scope, messages
    # bump the session row, delete keys, upsert keys, insert messages, log the run (no other commit came between
    # this run's load and its commit, so the changed keys' stamps need no check: see the next test)
    assert [s for s in commit if s not in ("BEGIN",)] == ["UPDATE", "DELETE", "INSERT", "INSERT", "INSERT"]


async def test_the_stamp_check_runs_when_another_commit_came_between(store: Store) -> None:
    async with store.session("s", user_id="u") as session:
        session.state["a"] = 0
    mine, other = await store.load("s", user_id="u"), await store.load("s", user_id="u")
    other.session.state["b"] = 1
    await other.commit()
    mine.session.state["a"] = 1
    with Counter(store) as committing:
        await mine.commit()
    assert [s for s in committing.statements if s != "BEGIN"] == ["UPDATE", "SELECT", "INSERT", "INSERT"]
