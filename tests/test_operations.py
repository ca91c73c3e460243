"""Issue 9: operations that cannot half-happen, and a schema that stays evolvable."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
from agent_framework import Agent, Message
from alembic import command
from alembic.config import Config
from helpers import rows, until
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import create_async_engine

from agent_store import (
    ConfigurationError,
    ConflictError,
    InvalidValueError,
    SchemaOutOfDateError,
    StorageUnavailableError,
    Store,
)
from agent_store.db.engine import make_engine, migration_connection, migrations_dir
from agent_store.db.tables import SCHEMA_REVISION


async def filled(store: Store, agent: Agent, n: int = 3) -> None:
    for i in range(n):
        async with store.session(f"s{i}", user_id="u") as session:
            session.state["k"] = i
            await agent.run(f"hello {i}", session=session)


async def test_a_paused_export_holds_no_connection(store: Store, agent: Agent) -> None:
    await filled(store, agent)
    lines = store.export(user_id="u")
    seen = []
    async for line in lines:
        seen.append(json.loads(line)["kind"])
        assert store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]  # the consumer is paused here
    assert seen[0] == "header" and seen[-1] == "trailer" and seen.count("session") == 3


@pytest.mark.parametrize("rewritten", [False, True])
async def test_an_export_consistent_to_its_start_refuses_a_truncation_midway(
    store: Store, agent: Agent, rewritten: bool
) -> None:
    await filled(store, agent, 1)
    lines = store.export(user_id="u")
    async for line in lines:
        if json.loads(line)["kind"] == "run":  # the session's row is read; its messages are not yet
            await store.clear("s0", user_id="u")
            if rewritten:  # as many new messages as there were: only their commit time tells
                async with store.session("s0", user_id="u") as session:
                    await agent.run("new", session=session)
            break
    with pytest.raises(ConflictError, match="truncated, cleared or compacted while it was being exported"):
        async for _ in lines:
            pass


@pytest.mark.parametrize("damage", ["truncated", "bad-line-33", "wrong-trailer", "altered-next-seq"])
async def test_a_damaged_file_imports_nothing(store: Store, agent: Agent, tmp_path: Path, damage: str) -> None:
    await filled(store, agent, 8)
    lines = [line async for line in store.export(user_id="u")]
    assert len(lines) > 40
    if damage == "truncated":
        lines = lines[: len(lines) // 2]
    elif damage == "bad-line-33":
        lines[32] = '{"kind": "message", "row": {"seq": "not a number"'
    elif damage == "wrong-trailer":
        trailer = json.loads(lines[-1])
        lines[-1] = json.dumps({**trailer, "sessions": trailer["sessions"] + 1})
    else:  # a consistent file whose session row disagrees with its messages: refused, not imported broken
        first = next(i for i, x in enumerate(lines) if json.loads(x)["kind"] == "session")
        record = json.loads(lines[first])
        record["row"]["next_seq"] = 0
        lines[first] = json.dumps(record)
    async with Store.from_url(f"sqlite+aiosqlite:///{tmp_path}/target.db") as target:
        await target.migrate()
        with pytest.raises(InvalidValueError, match=r"nothing was imported|line 33|seq 0..next_seq-1"):
            await target.import_lines(lines)
        assert await rows(target, "SELECT count(*) FROM agent_sessions") == [(0,)]
        assert await rows(target, "SELECT count(*) FROM agent_messages") == [(0,)]


async def test_store_on_an_engine_that_already_has_connections_configures_them(sqlite_url: str) -> None:
    engine = create_async_engine(sqlite_url)
    async with engine.connect() as conn:  # pooled before the Store existed: no agent_store pragmas
        await conn.execute(text("SELECT 1"))
    store = Store(engine)
    try:
        await store.migrate()
        async with store.db.transaction(write=False, doing="checking pragmas") as conn:
            assert (await conn.execute(text("PRAGMA foreign_keys"))).scalar() == 1
            assert (await conn.execute(text("PRAGMA busy_timeout"))).scalar() == 30000
    finally:
        await store.close()


DUMMY = '''"""A later migration that rebuilds agent_messages and agent_sessions with Alembic's plain batch mode."""
import sqlalchemy as sa
from alembic import op

revision = "0099"
down_revision = "{head}"
branch_labels = None
depends_on = None


def rebuild() -> str:
    # SQLite: copy, drop, rename (what batch mode must survive with the view in place); PostgreSQL: ALTER.
    return "always" if op.get_bind().dialect.name == "sqlite" else "auto"


def upgrade() -> None:
    for table in ("agent_messages", "agent_sessions"):
        with op.batch_alter_table(table, recreate=rebuild()) as batch:
            batch.add_column(sa.Column("extra", sa.Integer(), nullable=True))


def downgrade() -> None:
    for table in ("agent_sessions", "agent_messages"):
        with op.batch_alter_table(table, recreate=rebuild()) as batch:
            batch.drop_column("extra")
'''


async def test_a_later_batch_migration_rebuilds_the_viewed_tables_and_back(url: str, tmp_path: Path) -> None:
    scripts = tmp_path / "migrations"
    shutil.copytree(migrations_dir(), scripts)
    (scripts / "versions" / "0099_dummy.py").write_text(DUMMY.replace("{head}", SCHEMA_REVISION))
    config = Config()
    config.set_main_option("script_location", str(scripts))
    async with Store.from_url(url) as store:
        await store.migrate()
        async with store.session("s", user_id="u") as session:
            session.state["in_memory"]["messages"].append(Message(role="user", contents=["kept"]))

        async def alembic(verb: str, revision: str) -> None:
            def run(sync_conn: Any) -> None:
                config.attributes["connection"] = sync_conn
                getattr(command, verb)(config, revision)

            async with migration_connection(store.engine) as conn:
                await conn.run_sync(run)

        await alembic("upgrade", "0099")
        assert await rows(store, "SELECT user_id, text FROM agent_transcript") == [("u", "kept")]
        await alembic("downgrade", SCHEMA_REVISION)
        assert await rows(store, "SELECT user_id, text FROM agent_transcript") == [("u", "kept")]
        async with store.session("s", user_id="u") as session:  # the schema is at head again
            assert [m.text for m in session.state["in_memory"]["messages"]] == ["kept"]


async def test_warm_up_opens_the_pool_before_the_first_run_and_checks_the_schema(url: str) -> None:
    async with Store.from_url(url, pool_size=3, max_overflow=0) as store:
        with pytest.raises(SchemaOutOfDateError):  # a fresh database: the start-up check says so at once
            await store.warm_up()
        await store.migrate()
        pool: Any = store.engine.pool
        opened = pool.checkedin()  # the schema check's connection (migrating opened one)
        for bad in (0, 4, True, 1.0):  # beyond the pool, or not a count: refused before anything is opened
            with pytest.raises(InvalidValueError, match="connections"):
                await store.warm_up(bad)  # type: ignore[arg-type]
        assert pool.checkedin() == opened < 3
        assert await store.warm_up() == 3
        assert (pool.checkedin(), pool.checkedout()) == (3, 0)  # all open, idle, ready
        run = await store.load("s", user_id="u")
        run.session.state["k"] = 1
        await run.commit()
        assert (await store.get("s", user_id="u")).version == 1
    async with Store.from_url(url, pool_size=0) as unlimited:  # SQLAlchemy's "no limit": any count is opened
        assert await unlimited.warm_up() == 1 and await unlimited.warm_up(5) == 5


async def test_warm_up_runs_a_loads_statements_on_every_connection_and_writes_nothing(url: str) -> None:
    """PostgreSQL parses and plans a statement per connection: a burst of first runs on new connections paid for
    it all at once (S2's first second, bench/README.md). The warm-up's loads only read."""
    async with Store.from_url(url, pool_size=2, max_overflow=0) as store:
        await store.migrate()
        assert await store.warm_up() == 2
        async with store.engine.connect() as one, store.engine.connect() as two:  # the pool's two connections
            if store.engine.dialect.name == "postgresql" and "pgbouncer" not in url:
                prepared = text("SELECT count(*) FROM pg_prepared_statements"  # not matching its own text:
                                " WHERE strpos(statement, concat('window', '_start')) > 0")  # fmt: skip
                counts = [(await conn.execute(prepared)).scalar_one() for conn in (one, two)]
                assert counts == [4, 4]  # with and without a user, whole and windowed, on each connection
        for table in ("agent_sessions", "agent_runs", "agent_messages", "agent_state", "agent_user_state",
                      "agent_usage", "agent_usage_budgets"):  # fmt: skip
            assert await rows(store, f"SELECT count(*) FROM {table}") == [(0,)], table  # noqa: S608


async def test_warm_up_makes_each_connections_first_commits_and_keeps_nothing(pg_url: str) -> None:
    """PostgreSQL compiles the commit function and plans its statements on a connection's first call (19-21 ms
    against 4-5 after: bench/studies/first_commit.py): the warm-up makes a new session's commit and a second run's
    on each connection, in a transaction it rolls back. The server counts the calls (track_functions, on a direct
    connection: PgBouncer refuses it as a start-up parameter); through either, nothing is kept."""
    direct = "pgbouncer" not in pg_url
    tracked = {"connect_args": {"server_settings": {"track_functions": "pl"}}} if direct else {}
    async with Store.from_url(pg_url, pool_size=2, max_overflow=0, **tracked) as store:
        await store.migrate()
        async with store.session("s", user_id="u") as session:
            session.state["k"] = 1
        await store.usage.set_budget(10, period="day")  # an app budget: the warm-up charges it nothing
        assert await store.warm_up() == 2
        if direct:
            async with store.engine.connect() as one, store.engine.connect() as two:  # the pool's two connections
                for conn in (one, two):  # each backend reports its own counts once idle
                    await conn.execute(text("SELECT pg_stat_force_next_flush()"))
                    await conn.commit()
                calls = text("SELECT calls FROM pg_stat_user_functions WHERE funcname = 'agent_store_commit_usage'")
                assert (await one.execute(calls)).scalar_one() == 4  # two connections, two commits each
        assert await rows(store, "SELECT id FROM agent_sessions") == [("s",)]
        assert await rows(store, "SELECT count(*) FROM agent_runs") == [(1,)]
        for table in ("agent_messages", "agent_usage", "agent_user_state", "agent_tool_calls"):
            assert await rows(store, f"SELECT count(*) FROM {table}") == [(0,)], table  # noqa: S608
        assert await rows(store, "SELECT used FROM agent_usage_budgets") == [(0,)]
        async with store.session("s", user_id="u") as session:  # and runs go on as before
            session.state["k"] = 2
        assert (await store.get("s", user_id="u")).version == 2
        with pytest.raises(InvalidValueError, match="for_runs"):
            await store.warm_up(for_runs="no")  # type: ignore[arg-type]
    async with Store.from_url(pg_url, pool_size=2, max_overflow=0, **tracked) as reader:  # a browser's: reads only
        assert await reader.warm_up(for_runs=False) == 2
        if direct:
            async with reader.engine.connect() as one, reader.engine.connect() as two:
                for conn in (one, two):
                    await conn.execute(text("SELECT pg_stat_force_next_flush()"))
                    await conn.commit()
                calls = text("SELECT calls FROM pg_stat_user_functions WHERE funcname = 'agent_store_commit_usage'")
                assert (await one.execute(calls)).scalar_one() == 4  # as before: no call of its own


async def test_runs_one_after_another_reuse_the_connection_that_came_back_last(url: str) -> None:
    """A light load keeps to the connections whose statements are already prepared and planned (LIFO)."""
    async with Store.from_url(url, pool_size=4, max_overflow=0) as store:
        await store.migrate()
        await store.warm_up()
        used: list[int] = []
        event.listen(store.engine.sync_engine, "checkout", lambda dbapi, record, proxy: used.append(id(dbapi)))
        for n in range(6):
            run = await store.load("s", user_id="u")
            run.session.state["n"] = n
            await run.commit()
        assert len(used) >= 12 and len(set(used)) == 1  # FIFO would have taken all four in turn
    async with Store.from_url(url, pool_size=4, max_overflow=0, pool_use_lifo=False) as fifo:  # still the caller's
        await fifo.warm_up()
        used.clear()
        event.listen(fifo.engine.sync_engine, "checkout", lambda dbapi, record, proxy: used.append(id(dbapi)))
        for _ in range(4):
            await fifo.get("s", user_id="u")
        assert len(set(used)) == 4


async def test_a_pool_object_of_the_callers_is_used_as_given(url: str) -> None:
    """``pool=`` works on both backends (SQLite's own reset-on-return setting is not forced on it), and is
    refused with ``replica_url``: one pool would serve both URLs, so "replica" reads would reach the primary."""
    probe = make_engine(url, pool_size=2)  # also for a ?pgbouncer=true URL, which create_async_engine refuses
    pool = probe.sync_engine.pool
    async with Store.from_url(url, pool=pool) as store:
        await store.migrate()
        async with store.session("s", user_id="u") as session:
            session.state["k"] = 1
        assert (await store.get("s", user_id="u")).version == 1 and store.engine.pool is pool
    with pytest.raises(ConfigurationError, match="replica_url"):
        Store.from_url(url, pool=pool, replica_url=url)
    await probe.dispose()


async def test_warm_up_on_an_unreachable_server_is_storage_unavailable_without_the_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with Store.from_url("postgresql+asyncpg://app:s3cret@127.0.0.1:1/chat", connect_args={"timeout": 2}) as store:
        with pytest.raises(StorageUnavailableError, match=r"127\.0\.0\.1:1") as raised:
            await store.warm_up(1)
    assert "s3cret" not in str(raised.value)
    url = "postgresql+asyncpg://app:s3cret@127.0.0.1:1/chat"
    async with Store.from_url(url, connect_args={"timeout": 2}, pool_size=3, check_schema=False) as store:
        with caplog.at_level("WARNING", logger="agent_store"), pytest.raises(StorageUnavailableError):
            await store.warm_up()  # three connections fail: one is raised, the other two are said
    others = [r.getMessage() for r in caplog.records if "another connection failed" in r.getMessage()]
    assert len(others) == 2 and not any("s3cret" in m for m in others), others


async def test_an_engine_in_autocommit_mode_is_refused(url: str) -> None:
    """agent_store's write transactions would not be atomic: each statement would commit by itself (a failed run
    half-written, a warm-up's rolled-back commits kept). It sends single statements without a transaction itself."""
    with pytest.raises(ConfigurationError, match="AUTOCOMMIT"):
        Store.from_url(url, isolation_level="AUTOCOMMIT")
    engine = make_engine(url)
    with pytest.raises(ConfigurationError, match="AUTOCOMMIT"):
        Store(engine.execution_options(isolation_level="AUTOCOMMIT"))
    async with Store(engine) as store:  # the same engine as it is
        await store.migrate()
        assert await store.warm_up(1) == 1


async def test_a_warm_up_cancelled_at_any_point_leaves_no_connection_out(url: str) -> None:
    """Cancelled while some connections are open and others still opening or priming, the warm-up gives every
    one back to the pool (a service's start-up cut short by a timeout)."""
    async with Store.from_url(url, pool_size=4, max_overflow=0) as store:
        await store.migrate()
        pool: Any = store.engine.pool
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            for steps in range(80):
                warm = asyncio.create_task(store.warm_up())
                for _ in range(steps):
                    await asyncio.sleep(0)
                warm.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await warm
                # A checkout cut short gives its connection back from a callback
                await until(lambda: pool.checkedout() == 0, f"every connection back (cancelled after {steps} steps)",
                            within=30, every=0.01)  # fmt: skip
                gc.collect()  # a connection nobody gave back is found here, with SQLAlchemy's warning
        stranded = [str(w.message) for w in warned if "garbage collector" in str(w.message)]
        assert stranded == []
        async with store.session("s", user_id="u") as session:
            session.state["k"] = 1
        assert await rows(store, "SELECT count(*) FROM agent_sessions") == [(1,)]
