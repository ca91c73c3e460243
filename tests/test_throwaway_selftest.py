"""Self-tests for the fault-test tools: a throwaway PostgreSQL server and the lost-COMMIT-reply proxy.

They use asyncpg directly, not agent_store, so a failure here points at the tools, not at the store.
"""

from __future__ import annotations

import asyncpg
import pytest
from lost_reply_proxy import LostReplyProxy, _CommitSpotter
from throwaway_pg import ThrowawayCluster, pg_bin


def _have_postgres() -> bool:
    try:
        pg_bin("initdb")
    except FileNotFoundError:
        return False
    return True


pytestmark = pytest.mark.skipif(not _have_postgres(), reason="PostgreSQL server binaries (initdb) not installed")


async def test_cluster_survives_stop_and_start() -> None:
    pg = ThrowawayCluster()
    try:
        pg.start()
        assert pg.url("db") == f"postgresql+asyncpg://postgres@127.0.0.1:{pg.port}/db"
        pg.create_database("app")
        conn = await asyncpg.connect(pg.dsn("app"), timeout=10)
        try:
            await conn.execute("CREATE TABLE t (v int); INSERT INTO t VALUES (42)")
        finally:
            await conn.close()

        pg.stop()
        assert not pg.running()
        with pytest.raises(OSError):  # connection refused: nothing listens on the port any more
            await asyncpg.connect(pg.dsn("app"), timeout=5)

        port = pg.port
        pg.start()
        assert pg.port == port
        conn = await asyncpg.connect(pg.dsn("app"), timeout=10)
        try:
            assert await conn.fetchval("SELECT v FROM t") == 42
        finally:
            await conn.close()
    finally:
        datadir = pg.tmpdir
        pg.destroy()
    assert datadir is not None and not datadir.exists()


async def test_proxy_loses_the_commit_reply_but_not_the_commit() -> None:
    with ThrowawayCluster() as pg:
        setup = await asyncpg.connect(pg.dsn(), timeout=10)
        try:
            await setup.execute("CREATE TABLE t (v int, note text)")
        finally:
            await setup.close()

        proxy = LostReplyProxy("127.0.0.1", pg.port)
        port = await proxy.start()
        via_proxy = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        try:
            conn = await asyncpg.connect(via_proxy, timeout=10)
            try:
                await conn.execute("BEGIN")
                proxy.drop_reply_after_commit()
                # Data that says COMMIT (a bound parameter) is not a COMMIT: the armed proxy lets it through.
                await conn.execute("INSERT INTO t VALUES ($1, $2)", 7, "COMMIT")
                assert proxy.armed and proxy.drops == 0
                with pytest.raises((asyncpg.exceptions.ConnectionDoesNotExistError, ConnectionError)):
                    await conn.execute("COMMIT")
            finally:
                await conn.close(timeout=5)
            assert proxy.drops == 1
            assert not proxy.armed

            # One shot: the proxy forwards normally again, COMMITs included (here inside a transaction block).
            again = await asyncpg.connect(via_proxy, timeout=10)
            try:
                async with again.transaction():
                    await again.execute("INSERT INTO t VALUES (8, 'x')")
                assert await again.fetchval("SELECT count(*) FROM t") == 2
            finally:
                await again.close()
            assert proxy.drops == 1
        finally:
            await proxy.stop()

        direct = await asyncpg.connect(pg.dsn(), timeout=10)
        try:
            assert await direct.fetchval("SELECT array_agg(v ORDER BY v) FROM t") == [7, 8]  # 7 WAS committed
        finally:
            await direct.close()


def test_commit_spotter_reads_messages_not_bytes() -> None:
    """Split chunks, the extended protocol, and COMMIT-looking data (pure bytes; no server needed)."""

    def msg(kind: bytes, *fields: bytes) -> bytes:
        body = b"".join(f + b"\0" for f in fields)
        return kind + (len(body) + 4).to_bytes(4, "big") + body

    spotter = _CommitSpotter()
    params = (3 << 16).to_bytes(4, "big") + b"user\0postgres\0\0"  # protocol 3.0, then name/value pairs
    startup = (len(params) + 4).to_bytes(4, "big") + params  # untyped: no kind byte
    assert not spotter.feed(startup)
    query = msg(b"Q", b"COMMIT;")
    assert not any(spotter.feed(query[i : i + 1]) for i in range(len(query) - 1))  # incomplete: not yet
    assert spotter.feed(query[-1:])
    assert not spotter.feed(msg(b"Q", b"SELECT 'committed'"))
    assert not spotter.feed(msg(b"P", b"s1", b"COMMIT", b""))  # prepared only: nothing runs yet
    assert spotter.feed(msg(b"B", b"", b"s1", b"") + msg(b"E", b"", b"") + msg(b"S"))
