"""Row-level security's switch and status (issue 41; migration 0024 made the policies; db/tenancy.py names each
transaction's user). Run by the tables' owner: altering a table is the owner's right."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from agent_store.db import tenancy
from agent_store.db.database import Database
from agent_store.db.translation import translated
from agent_store.errors import ConfigurationError, SchemaOutOfDateError

SWITCH = text("SELECT agent_store_row_security(:enabled)")
POLICIES = text("SELECT count(*) FROM pg_policies WHERE policyname = 'agent_store_tenant' "
                "AND schemaname = current_schema()")  # fmt: skip


async def status(db: Database) -> dict[str, Any]:
    """Whether it is on and forced, how many tables have the policy, and whether this role bypasses it."""
    _postgresql_only(db)
    with translated(db.url, "reading row-level security's status"):
        async with db.engine.connect() as conn:
            row = (await conn.execute(tenancy.STATUS)).first()
            policies = int((await conn.execute(POLICIES)).scalar_one())
    if row is None:
        raise ConfigurationError("no agent_store tables here: run `agent-store upgrade` first")
    return {"enabled": bool(row.enabled), "forced": bool(row.forced), "tables_with_policy": policies,
            "role": row.role, "role_bypasses": bool(row.bypasses)}  # fmt: skip


async def switch(db: Database, *, enabled: bool) -> dict[str, Any]:
    """Enable and force (or disable) the policies on every table migration 0024 lists, in one transaction."""
    _postgresql_only(db)
    if (await db.revision() or "") < "0024":  # the migration that made the switch (revisions are 4 digits)
        raise SchemaOutOfDateError("row-level security needs schema 0024: run `agent-store upgrade` first")
    with translated(db.url, "switching row-level security"):
        async with db.engine.begin() as conn:
            await conn.execute(SWITCH, {"enabled": enabled})
    return await status(db)


def _postgresql_only(db: Database) -> None:
    if db.dialect != "postgresql":
        raise ConfigurationError("row-level security is PostgreSQL's: SQLite has none (one file, one application)")
