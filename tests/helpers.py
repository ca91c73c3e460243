"""Small helpers shared by the test modules."""

from __future__ import annotations

import asyncio
import inspect
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

import asyncpg
from sqlalchemy import event, make_url, text
from sqlalchemy.engine import Engine

from agent_store import StorageUnavailableError, Store

ROOT = Path(__file__).resolve().parent.parent
# The pages whose code blocks the tests run, in this order. docs/SCALING.md is not one of them: its Citus DDL
# cannot run here (tests/test_distribution.py checks it against the schema) and its Python line is a fragment.
DOC_PAGES = (
    "README.md",
    "docs/seams.md",
    "docs/serving.md",
    "docs/concurrency-and-errors.md",
    "docs/schema-and-sql.md",
    "docs/search-and-browser.md",
    "docs/operations.md",
    "docs/reliability.md",
    "docs/performance.md",
    "docs/usage.md",
    "docs/row-security.md",
    "docs/user-keys.md",
)


class DocBlock(NamedTuple):
    page: str  # "README.md", "docs/seams.md", ...
    heading: str  # the heading above it
    name: str  # from a marker line ``<!-- block: NAME ... -->`` right above it; "" without one
    language: str
    source: str


def doc_blocks(language: str) -> list[DocBlock]:
    """Every ```language block of the DOC_PAGES, in their order."""
    found: list[DocBlock] = []
    for page in DOC_PAGES:
        heading, name, fence, lines = "", "", None, []
        for line in (ROOT / page).read_text(encoding="utf-8").splitlines():
            if fence is not None:  # inside a block: only its closing fence counts
                if line != "```":
                    lines.append(line)
                    continue
                if fence == language:
                    found.append(DocBlock(page, heading, name, fence, "".join(f"{text}\n" for text in lines)))
                fence, name = None, ""
            elif line.startswith("```"):
                fence, lines = line[3:], []
            elif marker := re.match(r"<!-- block: ([\w-]+)", line):
                name = marker[1]
            else:
                heading = title[1] if (title := re.match(r"#+ (.*)", line)) else heading
                name = ""
    return found


def doc_block(page: str, name: str, language: str = "sql") -> str:
    """The block of ``page`` named by its marker: moving text around never changes which block a test runs."""
    (source,) = [b.source for b in doc_blocks(language) if (b.page, b.name) == (page, name)]
    return source


async def rows(store: Store, sql: str, **params: object) -> list[tuple[Any, ...]]:
    """The rows of a plain SQL query, as tuples."""
    async with store.engine.connect() as conn:
        return [tuple(r) for r in (await conn.execute(text(sql), params)).all()]


def lose_the_reply(store: Store) -> None:
    """The next commit reaches the database and commits; the caller is told it failed (outcome unknown).

    A commit is a COMMIT (the checked path), or the one-call commit of the common case (PostgreSQL: the
    ``agent_store_commit`` call on the driver; SQLite: one hop to the connection's thread): whichever comes
    first is "lost", once.
    """
    dialect = store.engine.sync_engine.dialect
    real_commit = dialect.do_commit
    db = store.db
    real_fetch, real_hop = db.driver.fetch, db.in_sqlite_thread

    def disarm() -> None:
        dialect.do_commit = real_commit  # type: ignore[method-assign]
        db.driver.fetch, db.in_sqlite_thread = real_fetch, real_hop  # type: ignore[method-assign]

    def commit_then_lose(dbapi_connection: object) -> None:
        real_commit(dbapi_connection)  # the database has the run ...
        disarm()
        raise dialect.loaded_dbapi.OperationalError("connection lost")  # ... but the caller never hears

    async def call_then_lose(conn: Any, statement: Any, params: Any, *, lost: str) -> Any:
        result = await real_fetch(conn, statement, params, lost=lost)
        if "agent_store_commit" in str(statement):
            disarm()
            raise StorageUnavailableError(f"{lost}: the reply was lost (connection lost)")
        return result

    async def hop_then_lose(work: Any, *, doing: str, committing: Any) -> Any:
        await real_hop(work, doing=doing, committing=committing)
        disarm()
        raise StorageUnavailableError(f"{doing} failed: the reply was lost (connection lost)")

    dialect.do_commit = commit_then_lose  # type: ignore[method-assign]
    db.driver.fetch, db.in_sqlite_thread = call_then_lose, hop_then_lose  # type: ignore[method-assign]


async def expire_now(store: Store, session_id: str) -> None:
    """Make a session's idle time-to-live run out now (SQLite keeps naive UTC text, PostgreSQL timestamptz)."""
    async with store.engine.begin() as conn:
        past = datetime.now(UTC) - timedelta(seconds=1)
        value = past.replace(tzinfo=None) if conn.dialect.name == "sqlite" else past
        await conn.execute(
            text("UPDATE agent_sessions SET expires_at = :t WHERE id = :s"), {"t": value, "s": session_id}
        )


async def dead_run(store: Store, stream_id: str, *, conversation_id: str | None = None) -> None:
    """What a worker that died mid-run leaves in the journal: a run ``in_progress`` whose lease ran out."""
    past = datetime.now(UTC) - timedelta(seconds=5)
    async with store.engine.begin() as conn:
        await conn.execute(text(
            "INSERT INTO agent_streams (user_id, stream_id, conversation_id, kind, status, last_seq, owner,"
            " lease_until, cancel_requested, created_at, updated_at) VALUES ('u', :sid, :cid, 'agui', 'in_progress',"
            " 2, 'gone:1', :t, :f, :t, :t)"
        ), {"sid": stream_id, "cid": conversation_id, "t": past, "f": False})  # fmt: skip


def plain_dsn(sa_url: str) -> str:
    """The libpq URL of a ``postgresql+asyncpg://`` one, for a raw asyncpg connection (the query dropped)."""
    return make_url(sa_url).set(drivername="postgresql", query={}).render_as_string(hide_password=False)


async def raw_connect(sa_url: str, **kwargs: Any) -> asyncpg.Connection:
    """A raw asyncpg connection to the database of a ``postgresql+asyncpg://`` URL. Through PgBouncer in transaction
    mode (``?pgbouncer=true``, as CI's second pass) it keeps no statement cache, as the store's own connections do
    (db/engine.py): a statement prepared on one server connection is gone on the next. Every raw connection of the
    tests opens here, so none of them can miss it."""
    query = make_url(sa_url).query  # the test's URL says pgbouncer=true; a store's engine URL, no statement cache
    if query.get("pgbouncer") in ("true", "1", "yes") or query.get("prepared_statement_cache_size") == "0":
        kwargs.setdefault("statement_cache_size", 0)
    return await asyncpg.connect(plain_dsn(sa_url), **kwargs)


@contextmanager
def black_hole() -> Iterator[int]:
    """A port on 127.0.0.1 that takes connections and never answers: the kernel completes the handshake into the
    listen queue, nobody accepts or replies. An "unreachable host" that keeps the test's traffic on this machine."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield listener.getsockname()[1]


SEAL_TOKEN = re.compile(r"k1\.[0-9a-f]+\.[A-Za-z0-9_=-]+")  # a sealed value's token (db/sealing.py): random bytes


def without_tokens(text: str) -> str:
    """``text`` with every seal's token cut out: a short word ("Ann") turns up in random base64 now and then, and
    what a test looks for in clear is never inside a token."""
    return SEAL_TOKEN.sub("k1.", text)


# -- waiting for another actor ---------------------------------------------------------------------------------------
# A test orders two actors (tasks, processes, transactions) by what it can see of the other, never by a sleep long
# enough "by now": a loaded machine makes any such sleep too short. Every wait is bounded, generously.
WAIT_S = 60.0


async def until(check: Callable[[], Any], what: str, *, within: float = WAIT_S, every: float = 0.02) -> Any:
    """Poll ``check()`` (a plain or an async function) until it returns something true, and return that; after
    ``within`` seconds an AssertionError says what was waited for."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        found = check()
        if inspect.isawaitable(found):
            found = await found
        if found:
            return found
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {within:g} s waiting for {what}")
        await asyncio.sleep(every)


async def lock_waiters(conn: asyncpg.Connection) -> int:
    """How many other backends of ``conn``'s database wait for a lock now (a row's, a table's, an advisory one).

    Inside a transaction PostgreSQL answers from the activity it read first, until the transaction ends: the
    snapshot is cleared before each count, so a connection holding a lock can watch who waits for it."""
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    return int(await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        " AND pid <> pg_backend_pid()"
    ))  # fmt: skip


@asynccontextmanager
async def lock_waits(where: str | Store) -> AsyncIterator[Callable[[], Awaitable[int]]]:
    """``waiting()``: how many transactions wait now for a lock another one holds, in the database of ``where`` (a
    URL or a store).

    PostgreSQL: the backends of that database waiting for a lock (pg_stat_activity). SQLite has no such view: the
    write transactions (``BEGIN IMMEDIATE``, as ``Database.transaction(write=True)`` opens one) begun by any store
    of this process since the block opened; while another connection writes, each of them waits for it."""
    url = where if isinstance(where, str) else where.engine.url.render_as_string(hide_password=False)
    if url.startswith("sqlite"):
        begun = [0]

        def begin(conn: Any) -> None:  # before agent_store's own listener sends the BEGIN that waits
            if conn.get_execution_options().get("agent_store_begin") == "immediate":
                begun[0] += 1

        async def write_transactions_begun() -> int:
            return begun[0]

        event.listen(Engine, "begin", begin, insert=True)
        try:
            yield write_transactions_begun
        finally:
            event.remove(Engine, "begin", begin)
        return
    conn = await raw_connect(url)
    try:
        yield lambda: lock_waiters(conn)
    finally:
        await conn.close()
