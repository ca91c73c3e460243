"""The peers bench.py measures on the same work, each in a database of its own (``pip install ".[bench]"``).

- OpenAI Agents SDK ``SQLAlchemySession`` (``openai-agents``): the last 20 items (or all of them), append 2; it
  keeps no state, so it does less than a run here (no state key, no conflict detection).
- ``community-agent-framework-postgres`` ``PostgresSessionStore`` (PostgreSQL only): the framework's
  ``SessionStore`` protocol, so a run loads and stores the whole session (every message, the state), and
  writes are last-writer-wins.
- Microsoft's ``agent-framework-postgres`` (PostgreSQL only) through core's ``VectorStoreHistoryProvider`` (no
  embedding generator: no vector column, so no pgvector extension): a run loads the whole transcript and appends
  two records; it keeps no state, so ``run`` and ``run_whole`` are one.

A run: load, append a user and an assistant message, set ``counter`` and ``user:last_seen`` (where the peer
keeps state), store. Peers that are not installed are skipped with a note.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any, Protocol

from agent_framework import AgentSession, Message

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the wire-counting proxy


class Peer(Protocol):
    name: str

    async def run(self, sid: str, n: int) -> None: ...

    async def run_whole(self, sid: str, n: int) -> None: ...

    async def close(self) -> None: ...


def available() -> dict[str, bool]:
    return {
        "openai-agents": importlib.util.find_spec("agents") is not None,
        "community-agent-framework-postgres": importlib.util.find_spec("agent_framework_community_postgres")
        is not None,
        "agent-framework-postgres": importlib.util.find_spec("agent_framework_postgres") is not None,
    }


def preload() -> None:
    """Import the installed peers' modules now: ``bench.py --freeze`` freezes after start-up, every side alike."""
    found = available()
    if found["openai-agents"]:
        importlib.import_module("agents.extensions.memory.sqlalchemy_session")
    if found["community-agent-framework-postgres"]:
        importlib.import_module("agent_framework_community_postgres")
    if found["agent-framework-postgres"]:
        importlib.import_module("agent_framework_postgres")


class OpenAIAgentsSession:
    name = "openai-agents SQLAlchemySession"

    def __init__(self, engine: Any, texts: Any) -> None:
        self.engine, self.texts = engine, texts

    @classmethod
    async def open(cls, url: str, size: int, texts: Any) -> OpenAIAgentsSession:
        from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
        from sqlalchemy.ext.asyncio import create_async_engine

        options: dict[str, Any] = {"pool_size": size, "max_overflow": 0} if url.startswith("postgresql") else {}
        engine = create_async_engine(url, **options)
        setup = SQLAlchemySession("setup", engine=engine, create_tables=True, **_TABLES)
        await setup.get_items(limit=1)  # creates the tables once; runs then use the production setting
        opened = [await engine.connect() for _ in range(options.get("pool_size", 1))]  # opened before timing
        for conn in opened:
            await conn.close()
        return cls(engine, texts)

    async def run(self, sid: str, n: int, limit: int | None = 20) -> None:
        from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession

        session = SQLAlchemySession(sid, engine=self.engine, **_TABLES)
        await session.get_items(limit=limit)
        question, answer = self.texts(n)
        await session.add_items([{"role": "user", "content": question}, {"role": "assistant", "content": answer}])

    async def run_whole(self, sid: str, n: int) -> None:
        await self.run(sid, n, None)

    async def close(self) -> None:
        await self.engine.dispose()


_TABLES: dict[str, Any] = {"sessions_table": "oa_sessions", "messages_table": "oa_messages"}


class CommunityPostgresStore:
    name = "community-agent-framework-postgres"

    def __init__(self, hub: Any, texts: Any) -> None:
        self.hub, self.store, self.texts = hub, hub.session_store(), texts

    @classmethod
    async def open(cls, url: str, size: int, texts: Any) -> CommunityPostgresStore:
        from agent_framework_community_postgres import PostgresPersistence

        dsn = url.replace("+asyncpg", "")
        hub = PostgresPersistence(
            application_id="bench", connection_string=dsn, pool_kwargs={"min_size": size, "max_size": size}
        )
        await hub.open()
        await hub.migrate()
        return cls(hub, texts)

    async def run(self, sid: str, n: int) -> None:
        session = await self.store.get(sid) or AgentSession(session_id=sid)
        question, answer = self.texts(n)
        history = session.state.setdefault("in_memory", {}).setdefault("messages", [])
        history += [Message(role="user", contents=[question]), Message(role="assistant", contents=[answer])]
        session.state["counter"] = n
        session.state["user:last_seen"] = n
        await self.store.set(sid, session)

    run_whole = run  # it always loads and stores the whole session

    async def close(self) -> None:
        await self.hub.close()


class MicrosoftPostgresHistory:
    name = "agent-framework-postgres"

    def __init__(self, pool: Any, provider: Any, texts: Any) -> None:
        self.pool, self.provider, self.texts = pool, provider, texts

    @classmethod
    async def open(cls, url: str, size: int, texts: Any) -> MicrosoftPostgresHistory:
        from agent_framework import VectorStoreHistoryProvider
        from agent_framework_postgres import PostgresStore
        from psycopg_pool import AsyncConnectionPool

        pool = AsyncConnectionPool(url.replace("+asyncpg", ""), min_size=size, max_size=size, open=False)
        await pool.open(wait=True)  # every connection opened before timing, as the other sides' pools
        provider = VectorStoreHistoryProvider(PostgresStore(client=pool), application_id="bench")
        await provider.save_messages("setup", [Message(role="user", contents=["setup"])])  # creates its table
        return cls(pool, provider, texts)

    async def run(self, sid: str, n: int) -> None:
        await self.provider.get_messages(sid)
        question, answer = self.texts(n)
        await self.provider.save_messages(sid, [Message(role="user", contents=[question]),
                                                Message(role="assistant", contents=[answer])])  # fmt: skip

    run_whole = run  # it always loads the whole transcript

    async def close(self) -> None:
        await self.pool.close()


PeerClass = type[OpenAIAgentsSession] | type[CommunityPostgresStore] | type[MicrosoftPostgresHistory]


def peers_for(backend: str) -> list[PeerClass]:
    found = available()
    chosen: list[PeerClass] = []
    if found["openai-agents"]:
        chosen.append(OpenAIAgentsSession)
    if backend == "postgresql" and found["community-agent-framework-postgres"]:
        chosen.append(CommunityPostgresStore)
    if backend == "postgresql" and found["agent-framework-postgres"]:
        chosen.append(MicrosoftPostgresHistory)
    return chosen


async def fresh_url(url: str, name: str) -> str:
    """A new, empty database (PostgreSQL) or file (SQLite) for one side of the comparison."""
    if url.startswith("postgresql"):
        import asyncpg

        database = "agent_store_bench_" + name
        admin = await asyncpg.connect(url.replace("+asyncpg", "").rsplit("/", 1)[0] + "/postgres")
        await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{database}"')
        await admin.close()
        return url.rsplit("/", 1)[0] + "/" + database
    folder = url.split("///", 1)[1].rsplit("/", 1)[0]
    return f"sqlite+aiosqlite:///{folder}/{name}.db"


async def round_trips_per_run(url: str, open_side: Any, runs: int = 20) -> float:
    """PostgreSQL requests per run on the wire (each waits for ReadyForQuery), in steady state on 1 connection."""
    from lost_reply_proxy import LostReplyProxy
    from sqlalchemy.engine import make_url

    port = make_url(url).port or 5432
    proxy = LostReplyProxy("127.0.0.1", port)
    local = await proxy.start()
    side = await open_side(url.replace(f":{port}/", f":{local}/"))
    try:
        for n in range(5):  # warm: sessions exist, statements prepared
            await side.run("rt", n)
        before = proxy.round_trips
        for n in range(runs):
            await side.run("rt", 5 + n)
        return float(proxy.round_trips - before) / runs
    finally:
        await side.close()
        await proxy.stop()
