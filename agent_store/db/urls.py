"""Database URLs: the forms people already have, turned into what the store's async drivers take.

    postgresql://  postgres://  postgresql+psycopg://  +psycopg2  +pg8000   ->  postgresql+asyncpg://
    sqlite://  sqlite+pysqlite://                                          ->  sqlite+aiosqlite://

A hosting platform, psql or LangGraph hands out a libpq URL, often with ``?sslmode=require``. asyncpg takes
libpq's connection parameters only inside a DSN it parses itself, so they are passed to it that way
(``connect_args["dsn"]``); ``connect_timeout`` becomes asyncpg's ``timeout``. Any other parameter is refused
here, in one line: asyncpg would otherwise fail on it at the first connection, far from the configuration.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlencode

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from agent_store.errors import ConfigurationError, redact

DEFAULT_URL = "sqlite+aiosqlite:///agent_store.db"
URL_ENV = "AGENT_STORE_URL"

_ASYNC_DRIVER = {
    **dict.fromkeys(["postgresql", "postgres", "postgresql+asyncpg", "postgres+asyncpg", "postgresql+psycopg",
                     "postgresql+psycopg2", "postgresql+psycopg2cffi", "postgresql+pg8000"], "postgresql+asyncpg"),
    **dict.fromkeys(["sqlite", "sqlite+pysqlite", "sqlite+aiosqlite"], "sqlite+aiosqlite"),
}  # fmt: skip
# libpq parameters asyncpg understands in a DSN (application_name becomes a server setting there).
_LIBPQ = frozenset({
    "sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword", "sslcrl", "sslnegotiation",
    "ssl_min_protocol_version", "ssl_max_protocol_version", "target_session_attrs", "application_name",
    "passfile", "krbsrvname", "gsslib",
})  # fmt: skip
_SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
# Taken by SQLAlchemy's asyncpg dialect or by the store itself (pgbouncer=true: see engine.make_engine).
_PASSED_THROUGH = frozenset({"host", "prepared_statement_cache_size", "pgbouncer", "ssl", "direct_tls"})
# asyncpg.connect()'s own numeric arguments, which arrive from a URL as text.
_NUMBERS: dict[str, type[int] | type[float]] = {
    "connect_timeout": float, "timeout": float, "command_timeout": float, "statement_cache_size": int,
    "max_cached_statement_lifetime": float, "max_cacheable_statement_size": int,
}  # fmt: skip


def resolve_url(url: str | URL | None) -> URL:
    """Parse ``url`` (or ``$AGENT_STORE_URL``, or the embedded default) into one the async drivers take."""
    raw = url if url is not None else os.environ.get(URL_ENV) or DEFAULT_URL
    try:
        parsed = make_url(raw)
    except (ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
        # The raw text is not echoed: it may hold a password.
        raise ConfigurationError(
            "could not parse the database URL; expected e.g. sqlite:///file.db or postgresql://user@host/db"
        ) from exc
    driver = _ASYNC_DRIVER.get(parsed.drivername)
    if driver is None:
        raise ConfigurationError(
            f"unsupported database {parsed.drivername!r} in {redact(parsed)}; agent_store stores in SQLite "
            "(sqlite:///file.db) or PostgreSQL (postgresql://user@host/db)"
        )
    parsed = parsed.set(drivername=driver)
    if driver == "postgresql+asyncpg":
        postgres_connect_args(parsed)  # refuses a bad parameter now, not at the first connection
    return parsed


def postgres_connect_args(url: URL) -> tuple[URL, dict[str, Any]]:
    """The URL without libpq's parameters, and the ``connect_args`` that give them to asyncpg."""
    unknown = sorted(set(url.query) - _LIBPQ - _PASSED_THROUGH - set(_NUMBERS))
    if unknown:
        raise ConfigurationError(
            f"unsupported URL parameter {unknown[0]!r} in {redact(url)}; agent_store passes libpq's "
            f"{', '.join(sorted(_LIBPQ | {'connect_timeout'}))} and asyncpg's own on to the driver"
        )
    libpq = {key: _single(url, key) for key in sorted(_LIBPQ & set(url.query))}
    if libpq.get("sslmode", "prefer") not in _SSL_MODES:
        raise ConfigurationError(f"sslmode must be one of {', '.join(_SSL_MODES)}, not {libpq['sslmode']!r}")
    connect_args: dict[str, Any] = {"dsn": "postgresql://?" + urlencode(libpq)} if libpq else {}
    for key, kind in _NUMBERS.items():
        if key in url.query:
            try:
                connect_args["timeout" if key == "connect_timeout" else key] = kind(_single(url, key))
            except ValueError:
                raise ConfigurationError(f"URL parameter {key} must be a number in {redact(url)}") from None
    return url.difference_update_query([*libpq, *_NUMBERS]), connect_args


def _single(url: URL, key: str) -> str:
    value = url.query[key]
    if isinstance(value, tuple):
        raise ConfigurationError(f"URL parameter {key} is given more than once in {redact(url)}")
    return value
