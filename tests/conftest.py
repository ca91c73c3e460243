"""One behaviour suite, every backend: each test that takes ``url`` or ``store`` runs on SQLite and PostgreSQL.

SQLite: a file in the test's temp dir. PostgreSQL: a fresh, empty database per test, created through the
server named by ``AGENT_STORE_TEST_POSTGRES_URL`` (e.g. postgresql+asyncpg://postgres@127.0.0.1:5432/test).
Without that variable the PostgreSQL cases skip with the reason shown; with ``CI=true`` they fail instead,
and any skip at all fails the run (see pytest_sessionfinish).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Protocol, TypeVar

# Azure Monitor's exporter reports on itself to a Microsoft endpoint unless told not to (agentserver's hosts):
# nothing a test starts may dial off this machine.
os.environ.setdefault("APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL", "true")

import asyncpg
import pytest
from agent_framework import Agent
from auto_failover import Formation
from helpers import raw_connect
from sqlalchemy.engine import make_url
from standby_pair import StandbyPair
from throwaway_pg import ThrowawayCluster

from agent_store import Store
from agent_store.offline import OfflineChatClient

pytest_plugins = ["cli_support"]  # the CLI tests' `filled` store

PG_ENV = "AGENT_STORE_TEST_POSTGRES_URL"
IN_CI = os.environ.get("CI", "").lower() == "true"

BACKENDS = [pytest.param("sqlite", id="sqlite"), pytest.param("postgresql", id="postgresql")]


def _pg_admin_url() -> str:
    raw = os.environ.get(PG_ENV)
    if not raw:
        if IN_CI:
            pytest.fail(f"{PG_ENV} is not set, and CI=true: PostgreSQL tests may not be skipped")
        pytest.skip(f"{PG_ENV} is not set: PostgreSQL cases skipped (set it to run them)")
    return raw


@asynccontextmanager
async def fresh_database(backend: str, tmp_path: Path) -> AsyncIterator[str]:
    """The URL of a new, empty database (no schema yet), dropped afterwards."""
    if backend == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path}/store.db"
        return
    admin = make_url(_pg_admin_url())
    name = f"{admin.database}_{uuid.uuid4().hex[:12]}"
    admin_url = admin.render_as_string(hide_password=False)
    try:
        conn = await raw_connect(admin_url, timeout=5)
    except (OSError, asyncpg.PostgresError) as exc:
        reason = f"PostgreSQL at {PG_ENV} is not reachable ({type(exc).__name__})"
        if IN_CI:
            pytest.fail(reason + ", and CI=true: PostgreSQL tests may not be skipped")
        pytest.skip(reason)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')  # a name we made: [a-z0-9_] only
    finally:
        await conn.close()
    try:
        yield admin.set(database=name).render_as_string(hide_password=False)
    finally:
        conn = await raw_connect(admin_url)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


@pytest.fixture(params=BACKENDS)
async def url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """An empty database on each backend."""
    async with fresh_database(request.param, tmp_path) as database_url:
        yield database_url


@pytest.fixture
async def pg_url(tmp_path: Path) -> AsyncIterator[str]:
    """An empty PostgreSQL database, for PostgreSQL-only faults (skipped, or failed in CI, without a server)."""
    async with fresh_database("postgresql", tmp_path) as database_url:
        yield database_url


class _Server(Protocol):
    def destroy(self) -> None: ...


T = TypeVar("T", bound=_Server)


def _own_server(start: Callable[[], T], what: str) -> Iterator[T]:
    """Start a server of the test's own, fail (in CI) or skip if this machine cannot, and always tear it down."""
    try:
        server = start()
    except (FileNotFoundError, RuntimeError) as exc:
        (pytest.fail if IN_CI else pytest.skip)(f"cannot start {what}: {exc}")
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture
def own_postgres() -> Iterator[ThrowawayCluster]:
    """A private PostgreSQL server (initdb in a temp dir, a free port) for tests that stop or break a server.

    The machine's server is shared with others: no test stops it. Fails (never skips) without initdb in CI.
    """
    yield from _own_server(lambda: ThrowawayCluster().start(), "a throwaway PostgreSQL")


@pytest.fixture
def formation() -> Iterator[Formation]:
    """A private pg_auto_failover formation: monitor, primary, secondary (tests/auto_failover.py)."""
    yield from _own_server(lambda: Formation().start(), "a pg_auto_failover formation")


@pytest.fixture
def standby_pair() -> Iterator[StandbyPair]:
    """A private primary with a synchronous hot standby (tests/standby_pair.py), torn down afterwards."""
    yield from _own_server(lambda: StandbyPair().start(), "a throwaway primary and standby")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path}/store.db"


@pytest.fixture
async def store(url: str) -> AsyncIterator[Store]:
    """A migrated store on each backend."""
    async with Store.from_url(url) as store:
        await store.migrate()
        yield store


@pytest.fixture
def agent() -> Agent:
    return Agent(client=OfflineChatClient(), name="Bot")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if IN_CI and skipped:
        if reporter:
            reporter.write_line(f"CI=true: {skipped} test(s) skipped; a skip is a failure in CI", red=True)
        session.exitstatus = 1


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give backend-specific tests their backend's name as a keyword, so `-k postgresql` selects them too."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if {"pg_url", "own_postgres", "standby_pair", "formation"} & set(fixtures):
            item.add_marker(pytest.mark.postgresql)
        # Servers of their own: the URL under test is unused.
        if {"own_postgres", "standby_pair", "formation"} & set(fixtures):
            item.add_marker(pytest.mark.own_server)
        if "sqlite_url" in fixtures:
            item.add_marker(pytest.mark.sqlite)
