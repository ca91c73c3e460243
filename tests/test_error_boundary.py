"""One error boundary: database, driver, pool and Alembic failures reach the caller as documented errors.

Every failure is an ``AgentStoreError`` subclass whose ``__cause__`` is the original exception, with a truthful
``retryable``; its text carries no SQL, no SQL parameters and no password; cleanup never masks the caller's error.
Real databases only: SQLite files and the PostgreSQL server (a private throwaway one where it must be stopped).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_framework import Message
from helpers import raw_connect
from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from sqlalchemy.engine import make_url
from throwaway_pg import ThrowawayCluster, pg_bin

from agent_store import (
    AgentStoreError,
    ConfigurationError,
    InvalidValueError,
    Run,
    SchemaError,
    SchemaTooNewError,
    StorageUnavailableError,
    Store,
)
from agent_store.db.translation import translated
from agent_store.errors import DatabaseError

SECRET = "SECRET-MESSAGE-TEXT"
# Statement text (the server may name a command, as in "cannot execute INSERT in a read-only transaction").
SQL_TEXT = re.compile(r"\[SQL|\[parameters|INSERT INTO|DELETE FROM|UPDATE \w+ SET|SELECT .+ FROM|VALUES \(")


def expect(exc: BaseException, kind: type[AgentStoreError], *, retryable: bool) -> AgentStoreError:
    """The common contract: the documented type, the original as ``__cause__``, ``retryable``, no SQL in the text."""
    assert isinstance(exc, AgentStoreError) and isinstance(exc, kind), repr(exc)
    assert exc.__cause__ is not None, f"{exc!r} lost the original exception"
    assert exc.retryable is retryable, repr(exc)
    assert not SQL_TEXT.search(str(exc)), str(exc)
    return exc


async def count(url: str, sql: str) -> int:
    conn = await raw_connect(url, timeout=10)
    try:
        return int(await conn.fetchval(sql))
    finally:
        await conn.close()


def change(run: Run, word: str) -> None:
    """Give a loaded run something to write: one message and one state key."""
    run.add_messages([Message(role="user", contents=[word])])
    run.session.state["k"] = word


async def test_pool_exhaustion_is_retryable_storage_unavailable(url: str) -> None:
    """No pooled connection free in pool_timeout: retryable StorageUnavailableError caused by the pool TimeoutError."""
    async with Store.from_url(url, pool_size=1, max_overflow=0, pool_timeout=0.2) as store:
        await store.migrate()
        holder = await store.load("s", user_id="u", serialized=True)  # holds the only connection
        with pytest.raises(StorageUnavailableError) as raised:
            await store.load("t", user_id="u")
        expect(raised.value, StorageUnavailableError, retryable=True)
        assert isinstance(raised.value.__cause__, sa_exc.TimeoutError)
        await holder.discard()
        await (await store.load("t", user_id="u")).commit()  # retryable was true: once freed, it works


@pytest.mark.parametrize("part", ["database", "role"])
async def test_missing_database_or_role_is_a_configuration_error(pg_url: str, part: str) -> None:
    """A database or role that does not exist is a ConfigurationError, not retryable."""
    base = make_url(pg_url)
    bad = base.set(database="no_such_db_xyz") if part == "database" else base.set(username="no_such_role")
    async with Store.from_url(bad) as store:
        with pytest.raises(ConfigurationError) as raised:
            await store.load("s", user_id="u")
    expect(raised.value, ConfigurationError, retryable=False)


def direct_url(cluster: ThrowawayCluster) -> str:
    """A database on a server of the test's own: server settings reach it directly, PgBouncer or not."""
    cluster.create_database("t")
    return cluster.url("t")


async def test_read_only_server_refuses_the_commit_and_writes_nothing(
    own_postgres: ThrowawayCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A read-only server: the commit raises StorageUnavailableError, not retryable, and nothing is written. Its
    warm-up (a standby's, or `agent-store ui` on one) readies reads only: the commits it would make are refused."""
    pg_url = direct_url(own_postgres)
    async with Store.from_url(pg_url) as store:
        await store.migrate()
    ro = {"server_settings": {"default_transaction_read_only": "on"}}
    async with Store.from_url(pg_url, connect_args=ro, pool_size=2) as store:
        with caplog.at_level("INFO", logger="agent_store"):  # its warm-up only reads, and says so
            assert await store.warm_up() == 2
        assert sum("may not write" in r.getMessage() for r in caplog.records) == 2
        run = await store.load("s", user_id="u")
        change(run, "hello")
        with pytest.raises(StorageUnavailableError) as raised:
            await run.commit()
    expect(raised.value, StorageUnavailableError, retryable=False)
    assert "read-only" in str(raised.value)
    for table in ("agent_sessions", "agent_messages", "agent_state", "agent_runs"):
        assert await count(pg_url, f"SELECT count(*) FROM {table}") == 0, table  # noqa: S608


async def test_statement_timeout_is_retryable_and_the_retry_writes_once(own_postgres: ThrowawayCluster) -> None:
    """A commit cancelled by statement_timeout is retryable; once the lock is gone the retry writes exactly once."""
    pg_url = direct_url(own_postgres)
    async with Store.from_url(pg_url, connect_args={"server_settings": {"statement_timeout": "300"}}) as store:
        await store.migrate()
        first = await store.load("s", user_id="u")
        change(first, "one")
        await first.commit()
        run = await store.load("s", user_id="u")
        change(run, "two")
        blocker = await raw_connect(pg_url, timeout=10)
        try:
            lock = blocker.transaction()
            await lock.start()
            await blocker.execute("SELECT id FROM agent_sessions WHERE id = $1 FOR UPDATE", "s")
            with pytest.raises(StorageUnavailableError) as raised:
                await run.commit()
            await lock.rollback()
        finally:
            await blocker.close()
        expect(raised.value, StorageUnavailableError, retryable=True)
        result = await run.commit()
        assert (result.messages_written, result.state_keys_written) == (1, 1)
    assert await count(pg_url, "SELECT count(*) FROM agent_messages WHERE session_id = 's'") == 2
    assert await count(pg_url, "SELECT version FROM agent_sessions WHERE id = 's'") == 2


@pytest.fixture
async def scratch(pg_url: str) -> AsyncIterator[Store]:
    """A PostgreSQL store with a two-row scratch table of our own."""
    async with Store.from_url(pg_url, check_schema=False) as store:
        async with store.engine.begin() as conn:
            await conn.execute(text("CREATE TABLE scratch (id int PRIMARY KEY, v int NOT NULL)"))
            await conn.execute(text("INSERT INTO scratch VALUES (1, 10), (2, 20)"))
        yield store


async def test_deadlock_is_retryable_storage_unavailable(scratch: Store) -> None:
    """Two transactions locking two rows in opposite order: the victim gets a retryable StorageUnavailableError."""
    barrier = asyncio.Barrier(2)

    async def move(first: int, second: int) -> None:
        async with scratch.db.transaction(write=True, doing="moving rows") as conn:
            await conn.execute(text("UPDATE scratch SET v = v + 1 WHERE id = :id"), {"id": first})
            await barrier.wait()
            await conn.execute(text("UPDATE scratch SET v = v + 1 WHERE id = :id"), {"id": second})

    outcomes = await asyncio.wait_for(asyncio.gather(move(1, 2), move(2, 1), return_exceptions=True), 30)
    failures = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(failures) == 1, outcomes
    expect(failures[0], StorageUnavailableError, retryable=True)
    assert "deadlock" in str(failures[0].__cause__).lower()


async def test_serialization_failure_is_retryable_storage_unavailable(scratch: Store) -> None:
    """A SERIALIZABLE write skew: the losing transaction gets a retryable StorageUnavailableError."""
    serializable = scratch.engine.execution_options(isolation_level="SERIALIZABLE")
    with pytest.raises(StorageUnavailableError) as raised:
        with translated(scratch.url, "x"):
            async with serializable.connect() as a, serializable.connect() as b:
                for conn in (a, b):
                    await conn.execute(text("SELECT sum(v) FROM scratch"))
                await a.execute(text("UPDATE scratch SET v = 0 WHERE id = 1"))
                await b.execute(text("UPDATE scratch SET v = 0 WHERE id = 2"))
                await a.commit()
                await b.commit()
    expect(raised.value, StorageUnavailableError, retryable=True)
    assert "serialize" in str(raised.value.__cause__).lower()


async def test_statement_parameters_never_reach_the_error_text(store: Store) -> None:
    """A refused statement: a DatabaseError whose text (and its cause's) does not contain the parameters."""
    with pytest.raises(DatabaseError) as raised:
        async with store.db.transaction(write=True, doing="x") as conn:
            await conn.execute(text("INSERT INTO agent_sessions (id) VALUES (:x)"), {"x": SECRET})
    expect(raised.value, DatabaseError, retryable=False)
    assert SECRET not in str(raised.value) and SECRET not in repr(raised.value)
    assert SECRET not in str(raised.value.__cause__)


async def test_alembic_failures_are_typed(store: Store, url: str) -> None:
    """Unknown revision, downgrade-by-upgrade and an unknown stamped revision are typed schema errors."""
    with pytest.raises(InvalidValueError) as unknown:
        await store.migrate("9999")
    expect(unknown.value, InvalidValueError, retryable=False)
    with pytest.raises(InvalidValueError, match="downgrade") as backwards:
        await store.migrate("0002")
    assert isinstance(backwards.value, AgentStoreError) and backwards.value.retryable is False
    async with store.engine.begin() as conn:
        await conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))  # a later agent_store's
        await conn.execute(text("UPDATE agent_schema_compat SET oldest_code = '9999'"))  # ... that breaks this code
    with pytest.raises(SchemaTooNewError, match="9999") as too_new:
        await store.migrate()
    assert isinstance(too_new.value, AgentStoreError) and too_new.value.retryable is False
    async with Store.from_url(url) as fresh:
        with pytest.raises(SchemaTooNewError, match="9999"):
            await fresh.load("s", user_id="u")
    async with store.engine.begin() as conn:  # another Alembic project's revision: a SchemaError saying so
        await conn.execute(text("UPDATE alembic_version SET version_num = 'zz99'"))
    with pytest.raises(SchemaError, match="'zz99', which is not agent_store's") as foreign:
        await store.migrate()
    assert not isinstance(foreign.value, SchemaTooNewError) and foreign.value.retryable is False


async def test_cli_refuses_a_downgrade_with_one_error_line(store: Store, url: str, tmp_path: Path) -> None:
    """`agent-store upgrade 0002` on a head database exits non-zero with one "Error:" line, no traceback."""
    argv = [sys.executable, "-m", "agent_store", "upgrade", "0002", "--url", url]
    done = await asyncio.to_thread(subprocess.run, argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), done.stderr
    assert "InvalidValueError" in lines[0] and "downgrade" in lines[0]


async def test_the_password_never_appears() -> None:
    """An unreachable server and a malformed URL both fail typed, without the password in the text."""
    async with Store.from_url("postgresql+asyncpg://u:S3cretPw@127.0.0.1:1/db", connect_args={"timeout": 2}) as s:
        with pytest.raises(StorageUnavailableError) as unreachable:
            await s.load("s", user_id="u")
    expect(unreachable.value, StorageUnavailableError, retryable=True)
    with pytest.raises(ConfigurationError) as malformed:
        Store.from_url("postgresql+asyncpg://u:S3cretPw@h:abc/db")
    expect(malformed.value, ConfigurationError, retryable=False)
    for exc in (unreachable.value, malformed.value):
        assert "S3cretPw" not in str(exc) and "S3cretPw" not in repr(exc)


def _have_initdb() -> bool:
    try:
        pg_bin("initdb")
    except FileNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _have_initdb(), reason="PostgreSQL server binaries (initdb) not installed")
async def test_cleanup_never_masks_the_callers_exception() -> None:
    """The server dies inside a serialized run, then the block raises: the caller sees its own exception."""
    cluster = ThrowawayCluster()
    try:
        await asyncio.to_thread(cluster.start)
        async with Store.from_url(cluster.url(), connect_args={"timeout": 2}) as store:
            await store.migrate()
            with pytest.raises(RuntimeError) as raised:
                async with store.session("s", user_id="u", serialized=True) as session:
                    session.state["k"] = "v"
                    await asyncio.to_thread(cluster.stop, "immediate")
                    raise RuntimeError("app")
            assert type(raised.value) is RuntimeError and raised.value.args == ("app",)
            with pytest.raises(StorageUnavailableError) as down:  # the outage itself is still reported, typed
                await store.load("s", user_id="u")
            expect(down.value, StorageUnavailableError, retryable=True)
    finally:
        await asyncio.to_thread(cluster.destroy)
