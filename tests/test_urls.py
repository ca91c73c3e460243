"""The URLs people already have work: libpq's and SQLAlchemy's sync forms map to the async drivers."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from agent_store import ConfigurationError, Store
from agent_store.db.urls import postgres_connect_args, resolve_url


@pytest.mark.parametrize(
    ("given", "driver"),
    [
        ("postgresql://app@db/chat", "postgresql+asyncpg"),
        ("postgres://app@db/chat", "postgresql+asyncpg"),
        ("postgresql+psycopg://app@db/chat", "postgresql+asyncpg"),
        ("postgresql+psycopg2://app@db/chat", "postgresql+asyncpg"),
        ("postgresql+asyncpg://app@db/chat", "postgresql+asyncpg"),
        ("sqlite:///chat.db", "sqlite+aiosqlite"),
        ("sqlite+pysqlite:///chat.db", "sqlite+aiosqlite"),
    ],
)
def test_common_forms_map_to_the_async_driver(given: str, driver: str) -> None:
    resolved = resolve_url(given)
    assert resolved.drivername == driver
    assert (resolved.host, resolved.database) == (make_url(given).host, make_url(given).database)


def test_libpq_parameters_reach_asyncpg_as_its_own_dsn() -> None:
    url, args = postgres_connect_args(
        resolve_url("postgres://app:pw@db:6543/chat?sslmode=require&application_name=web&connect_timeout=3")
    )
    assert dict(url.query) == {} and (url.host, url.port, url.password) == ("db", 6543, "pw")
    assert args == {"dsn": "postgresql://?application_name=web&sslmode=require", "timeout": 3.0}
    _, no_limit = postgres_connect_args(resolve_url("postgresql://db/chat?connect_timeout=0"))
    assert no_limit == {}  # libpq's "no limit": the store's own connect timeout stays


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ("postgresql://app:s3cret@db/chat?sslmode=sometimes", "sslmode must be one of"),
        ("postgresql://app:s3cret@db/chat?options=-csearch_path%3Dx", "unsupported URL parameter 'options'"),
        ("postgresql://app:s3cret@db/chat?connect_timeout=soon", "must be a number"),
        ("postgresql://app:s3cret@db/chat?sslmode=require&sslmode=disable", "more than once"),
        ("mysql://app:s3cret@db/chat", "unsupported database 'mysql'"),
        ("postgresql://app:pa@s3cret@db/chat", "write an '@' in the user or password as %40"),
        ("postgresql://app:s3cret@db:99999/chat", "port 99999 is out of range"),
        ("postgresql://app:s3cret@db/chat?target_session_attrs=bogus", "target_session_attrs must be one of"),
        ("postgresql://app:s3cret@db/chat?sslmode=verify-ca&sslrootcert=/no/such/ca.pem", "sslrootcert: no file"),
        ("postgresql://app:s3cret@db/chat?application_name=%00", "NUL"),
        ("postgresql://app:s3cret@db/chat?statement_cache_size=-5", "must be a number, 0 or more"),
        ("postgresql://app:s3cret@db/chat?connect_timeout=nan", "must be a number, 0 or more"),
        ("sqlite:///chat.db?mode=ro&uri=true", "no parameter but timeout"),
        ("sqlite:///chat.db?password=s3cret", "no parameter but timeout"),
        ("sqlite:///file:chat.db", "URI filenames"),
    ],
)
def test_what_asyncpg_would_refuse_later_is_refused_now_in_one_line(given: str, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match) as raised:
        Store.from_url(given)
    assert "s3cret" not in str(raised.value) and "\n" not in str(raised.value)


async def test_a_libpq_url_with_its_parameters_runs_a_session(url: str) -> None:
    parsed = make_url(url)
    if parsed.drivername.startswith("sqlite"):
        given = f"sqlite:///{parsed.database}"
    else:  # what psql or a hosting platform gives, with libpq's parameters
        query = {"sslmode": "disable", "application_name": "agent-store-test", "connect_timeout": "5"}
        given = parsed.set(drivername="postgres").update_query_dict(query).render_as_string(hide_password=False)
    async with Store.from_url(given) as store:
        await store.migrate()
        async with store.session("s", user_id="u") as session:
            session.state["n"] = 1
        assert (await store.get("s", user_id="u")).version >= 1
        if store.engine.dialect.name == "postgresql" and "pgbouncer" not in url:
            async with store.engine.connect() as conn:
                assert (await conn.execute(text("SHOW application_name"))).scalar() == "agent-store-test"
