"""Alembic environment for agent_store: async engines, or a connection handed over by Store.migrate()."""

from __future__ import annotations

import asyncio
from logging.config import fileConfig
from typing import Any

from alembic import context
from sqlalchemy import inspect, text

from agent_store.db.engine import foreign_revision, make_engine, migration_connection
from agent_store.db.tables import Base
from agent_store.db.urls import resolve_url
from agent_store.errors import SchemaError

config = context.config
if config.config_file_name is not None and config.attributes.get("connection") is None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata
# Any fixed 64-bit number: concurrent `upgrade`s (several app replicas starting) queue instead of racing.
_PG_MIGRATION_LOCK = 0x6167656E7473746F


def _refuse_foreign_versions(connection: Any) -> None:
    """An alembic_version that another Alembic project wrote: say so, before Alembic's "Can't locate revision"."""
    if not inspect(connection).has_table("alembic_version"):
        return
    ours = {script.revision for script in context.script.walk_revisions()}
    for (found,) in connection.execute(text("SELECT version_num FROM alembic_version")):
        if found not in ours and not (found.isdigit() and len(found) == 4):  # (a newer agent_store's: Alembic says)
            url = connection.engine.url.render_as_string(hide_password=True)
            raise SchemaError(foreign_revision(url, found))


def _run(connection: Any) -> None:
    _refuse_foreign_versions(connection)
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
        context.run_migrations()


async def _run_async() -> None:
    url = context.get_x_argument(as_dictionary=True).get("url")
    engine = make_engine(url)
    try:
        async with migration_connection(engine) as connection:
            await connection.run_sync(_run)
    finally:
        await engine.dispose()


def _run_offline() -> None:
    url = resolve_url(context.get_x_argument(as_dictionary=True).get("url"))
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    _run_offline()
elif (shared := config.attributes.get("connection")) is not None:
    _run(shared)
else:
    asyncio.run(_run_async())
