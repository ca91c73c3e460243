"""Rolling upgrades (migration 0020): which older code runs on a newer schema, written by the schema itself.

The rule: a migration that only adds (tables, columns with defaults, indexes, views), in a way the code before it
never notices, leaves ``agent_schema_compat.oldest_code`` as it is; one that older code would misread raises it
to its own revision. Code at revision N opens a database at M > N when ``oldest_code <= N``, and refuses it
(``SchemaTooNewError``) otherwise. So during a rollout the workers still on the old code keep starting after the
database was upgraded, as long as every migration in between only added. (Code before 0020 does not read it: it
needs ``check_schema=False`` on 0020, which only adds this table.)
"""

from __future__ import annotations

from typing import cast

from sqlalchemy import SmallInteger, String, Table, select
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.orm import Mapped, mapped_column

from agent_store.db.schema_base import Base

__all__ = ["compat_t", "oldest_code"]


class SchemaCompatRow(Base):
    """One row: the oldest code revision that runs on this schema."""

    __tablename__ = "agent_schema_compat"

    id: Mapped[int] = mapped_column(SmallInteger, primary_key=True, autoincrement=False)  # always 1
    oldest_code: Mapped[str] = mapped_column(String(32))


compat_t = cast(Table, SchemaCompatRow.__table__)


async def oldest_code(conn: AsyncConnection) -> str | None:
    """The schema's ``oldest_code``, or None where the table is missing (a schema from before the rule)."""

    def has_table(sync_conn: object) -> bool:
        from sqlalchemy import inspect

        return bool(inspect(sync_conn).has_table("agent_schema_compat"))

    if not await conn.run_sync(has_table):
        return None
    return cast("str | None", (await conn.execute(select(compat_t.c.oldest_code).where(compat_t.c.id == 1))).scalar())
