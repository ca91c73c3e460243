"""Bad configuration and unreachable databases give typed, one-line errors without passwords."""

from __future__ import annotations

import pytest

from agent_store import (
    AgentStoreError,
    ConfigurationError,
    InvalidValueError,
    SessionNotFoundError,
    StorageUnavailableError,
    Store,
)


@pytest.mark.parametrize(
    ("url", "match"),
    [
        pytest.param("mysql+aiomysql://app:s3cret@db/chat", "unsupported database", id="other-database"),
        pytest.param("oracle://app:s3cret@db/chat", "PostgreSQL", id="another-database"),
        pytest.param("not a url at all s3cret", "could not parse", id="malformed"),
        pytest.param("sqlite+aiosqlite://", "in-memory", id="sqlite-memory"),
    ],
)
def test_a_bad_url_is_a_configuration_error_without_the_password(url: str, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match) as raised:
        Store.from_url(url)
    assert "s3cret" not in str(raised.value)
    assert isinstance(raised.value, AgentStoreError)


async def test_an_unreachable_server_is_storage_unavailable_quickly_and_hides_the_password() -> None:
    async with Store.from_url("postgresql+asyncpg://app:s3cret@127.0.0.1:1/chat", connect_args={"timeout": 2}) as store:
        with pytest.raises(StorageUnavailableError, match=r"127\.0\.0\.1:1") as raised:
            await store.load("s", user_id="u")
    assert "s3cret" not in str(raised.value)
    assert "***" in str(raised.value)


def test_the_env_var_and_the_default_are_used(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    monkeypatch.delenv("AGENT_STORE_URL", raising=False)
    assert Store.from_url().url.render_as_string() == "sqlite+aiosqlite:///agent_store.db"
    monkeypatch.setenv("AGENT_STORE_URL", f"sqlite+aiosqlite:///{tmp_path}/x.db")
    assert Store.from_url().url.database == f"{tmp_path}/x.db"


@pytest.mark.parametrize(
    ("session_id", "user_id"),
    [
        pytest.param("", "u", id="empty-session"),
        pytest.param("x" * 256, "u", id="long-session"),
        pytest.param("s", "", id="empty-user"),
        pytest.param("s", "u" * 256, id="long-user"),
        pytest.param("s\x00", "u", id="nul"),
        pytest.param(42, "u", id="not-a-string"),
    ],
)
async def test_bad_ids_are_refused_before_any_sql(store: Store, session_id: object, user_id: str) -> None:
    with pytest.raises(InvalidValueError):
        await store.load(session_id, user_id=user_id)  # type: ignore[arg-type]


async def test_sql_looking_ids_are_inert(store: Store) -> None:
    evil = "x'); DROP TABLE agent_sessions; --"
    async with store.session(evil, user_id=evil) as session:
        session.state["k"] = evil
    async with store.session(evil, user_id=evil) as session:
        assert session.state["k"] == evil
    with pytest.raises(SessionNotFoundError):
        await store.load(evil, user_id="someone else")


@pytest.mark.parametrize(("url", "retryable"), [
    pytest.param("postgresql+asyncpg://u@/db?host=127.0.0.1:1&host=127.0.0.1:2&target_session_attrs=read-write", True,
                 id="several-servers"),
    pytest.param("postgresql+asyncpg://u@127.0.0.1:1/db", False, id="one-server"),
])  # fmt: skip
def test_a_read_only_answer_is_retryable_where_the_url_names_a_failover(url: str, retryable: bool) -> None:
    """During a failover the old primary answers read-only; a URL naming several servers finds the new one."""
    import asyncpg
    from sqlalchemy.engine import make_url

    from agent_store.db.translation import translated
    from agent_store.errors import StorageUnavailableError

    with pytest.raises(StorageUnavailableError, match="read-only") as raised:
        with translated(make_url(url), "committing"):
            raise asyncpg.exceptions.ReadOnlySQLTransactionError("cannot execute INSERT in a read-only transaction")
    assert raised.value.retryable is retryable
