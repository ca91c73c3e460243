"""Database URLs: the forms people already have, turned into what the store's async drivers take.

    postgresql://  postgres://  postgresql+psycopg://  +psycopg2  +pg8000   ->  postgresql+asyncpg://
    sqlite://  sqlite+pysqlite://                                          ->  sqlite+aiosqlite://

A hosting platform, psql or LangGraph hands out a libpq URL, often with ``?sslmode=require``. asyncpg takes
libpq's connection parameters only inside a DSN it parses itself, so they are passed to it that way
(``connect_args["dsn"]``); ``connect_timeout`` becomes asyncpg's ``timeout``. Any other parameter is refused
here, in one line: asyncpg would otherwise fail on it at the first connection, far from the configuration.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
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
_SESSION_ATTRS = ("any", "primary", "standby", "prefer-standby", "read-write", "read-only")
_FILES = ("sslrootcert", "sslcert", "sslkey", "sslcrl", "passfile")  # read at connect: checked now instead
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
    if "@" in (parsed.host or ""):  # "user:pa@ss@host": the rest of the password would show as the host
        raise ConfigurationError("the URL's host holds '@': write an '@' in the user or password as %40")
    if any("\x00" in str(value) for value in parsed.query.values()):
        raise ConfigurationError(f"a URL parameter holds a NUL character in {redact(parsed)}")
    parsed = parsed.set(drivername=driver)
    if driver == "postgresql+asyncpg":
        if parsed.port is not None and not 0 < parsed.port < 65536:
            raise ConfigurationError(f"port {parsed.port} is out of range (1-65535) in {redact(parsed)}")
        postgres_connect_args(parsed)  # refuses a bad parameter now, not at the first connection
    else:
        _check_sqlite(parsed)
    return parsed


def _check_sqlite(url: URL) -> None:
    """A SQLite URL is a file path: driver options go in ``connect_args``, not in the URL, where SQLAlchemy would
    ignore them or aiosqlite would make them part of a new file's name."""
    if set(url.query) - {"timeout"}:
        raise ConfigurationError(
            f"a SQLite URL takes a file path and no parameter but timeout, not {sorted(url.query)[0]!r}; pass "
            "driver options as Store.from_url(url, connect_args={...})"
        )
    database = url.database or ""
    if database.startswith("file:") and not database.startswith("file::memory:"):
        raise ConfigurationError("SQLite URI filenames (file:...) are not supported: give the file's path")


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
        raise ConfigurationError(f"sslmode must be one of {', '.join(_SSL_MODES)}, not {libpq['sslmode'][:40]!r}")
    if libpq.get("target_session_attrs", "any") not in _SESSION_ATTRS:
        raise ConfigurationError(f"target_session_attrs must be one of {', '.join(_SESSION_ATTRS)}")
    for key in _FILES:
        if key in libpq and not Path(libpq[key]).expanduser().is_file():
            raise ConfigurationError(f"{key}: no file at {libpq[key][:200]}")
    connect_args: dict[str, Any] = {"dsn": "postgresql://?" + urlencode(libpq)} if libpq else {}
    for key, kind in _NUMBERS.items():
        if key in url.query:
            try:
                number = kind(_single(url, key))
            except ValueError:
                number = -1
            if not (0 <= number and math.isfinite(number)):
                raise ConfigurationError(f"URL parameter {key} must be a number, 0 or more, in {redact(url)}")
            if key == "connect_timeout":  # libpq's 0 is "no limit": the store's own connect timeout is kept then
                if number:
                    connect_args["timeout"] = number
            else:
                connect_args[key] = number
    return url.difference_update_query([*libpq, *_NUMBERS]), connect_args


def _single(url: URL, key: str) -> str:
    value = url.query[key]
    if isinstance(value, tuple):
        raise ConfigurationError(f"URL parameter {key} is given more than once in {redact(url)}")
    return value
