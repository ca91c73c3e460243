"""A whole-user export's Responses-server rows (migration 0018, agentserver/responses.py), and their import.

After the user's sessions, state and checkpoints, a whole-user export carries the user's partition of
``agent_hosted_responses``, ``agent_hosted_items`` and ``agent_hosted_links`` (``""``, the partition of requests
with no user, for an export with no user), read in one transaction (one snapshot: a response's links and items
are exported with it), as ``hosted_response``, ``hosted_item`` and ``hosted_link`` rows.

Import inserts them beside what is there: a response already there (by user and id) is skipped with its links, and
an item already there is kept (an item id names one item). Before the import's transaction commits, every
imported link must name an item of its user and every history pointer a response of its user, with no cycle and
no longer walk than a reading follows (``MAX_HOPS``): a file that breaks this imports nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from sqlalchemy import Table, exists, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db.database import Database
from agent_store.db.hosted_tables import MAX_HOPS, hosted_items_t, hosted_links_t, hosted_responses_t
from agent_store.db.statements import lock_user
from agent_store.errors import InvalidValueError

__all__ = ["KINDS", "Imported", "export"]
KINDS: dict[str, Table] = {
    "hosted_response": hosted_responses_t, "hosted_item": hosted_items_t, "hosted_link": hosted_links_t,
}  # fmt: skip
R, T = hosted_responses_t.c, hosted_items_t.c


async def export(db: Database, user_id: str | None, line: Callable[[str, Table, Any], str]) -> AsyncIterator[str]:
    """The partition's rows, responses first (a link needs its response), each table in its key's order."""
    owner = user_id or ""
    async with db.transaction(write=False, replica=True, doing="exporting hosted responses") as conn:
        found = {}
        for kind, table in KINDS.items():
            query = select(table).where(table.c.user_id == owner).order_by(*table.primary_key.columns)
            found[kind] = (await conn.execute(query)).all()
    for kind, table in KINDS.items():
        for row in found[kind]:
            yield line(kind, table, row)


class Imported:
    """The hosted rows of one import, inserted as they come and checked together before it commits."""

    def __init__(self) -> None:
        self.skipped: set[tuple[str, str]] = set()  # responses already there: their links are theirs
        self.checked: set[str] = set()  # users whose links and pointers this import wrote (check() reads them)
        self.responses: list[dict[str, Any]] = []
        self.locked: set[str] = set()

    async def add(self, conn: AsyncConnection, kind: str, values: dict[str, Any]) -> None:
        user = values["user_id"]
        if user and user not in self.locked:  # as a request of the user does: never beside their erasure
            await lock_user(conn, user, exclusive=False)
            self.locked.add(user)
        if kind == "hosted_response":
            _check_response(values)
            key = (R.user_id == user, R.response_id == values["response_id"])
            if (await conn.execute(select(R.response_id).where(*key))).first() is not None:
                self.skipped.add((user, values["response_id"]))
                return
            self.responses.append(values)
            self.checked.add(user)
            await conn.execute(insert(hosted_responses_t), values)
        elif kind == "hosted_item":
            if not isinstance(values.get("body"), str) or not values["body"].startswith("{"):
                raise InvalidValueError("hosted_item.body must be a JSON object (the item)")
            key = (T.user_id == user, T.item_id == values["item_id"])
            if (await conn.execute(select(T.item_id).where(*key))).first() is None:
                await conn.execute(insert(hosted_items_t), values)
        elif (user, values["response_id"]) not in self.skipped:
            if values.get("kind") not in ("h", "i", "o") or values["pos"] < 0:
                raise InvalidValueError('hosted_link.kind must be "h", "i" or "o", and its pos at least 0')
            self.checked.add(user)
            await conn.execute(insert(hosted_links_t), values)

    async def check(self, conn: AsyncConnection) -> None:
        """Every imported link names an item of its user; every imported pointer walks, within the user, to a
        response with rows of its own in at most MAX_HOPS steps (no cycle). Two statements per user."""
        L = hosted_links_t.c
        for user in sorted(self.checked):
            lacking = select(L.response_id, L.item_id).where(L.user_id == user, ~exists().where(
                T.user_id == L.user_id, T.item_id == L.item_id)).limit(1)  # fmt: skip
            if (bad := (await conn.execute(lacking)).first()) is not None:
                raise InvalidValueError(f"import: hosted response {bad.response_id!r} links item {bad.item_id!r}, "
                                        "which its user does not have; nothing was imported")  # fmt: skip
            pointers = dict((await conn.execute(select(R.response_id, R.history_from).where(R.user_id == user))).all())
            for response in (r for r in self.responses if r["user_id"] == user):
                at, hops = response["history_from"], 0
                while at is not None:
                    hops += 1
                    if at not in pointers or hops > MAX_HOPS:
                        raise InvalidValueError(
                            f"import: hosted response {response['response_id']!r}: its history points at {at!r}, "
                            f"which is missing, or walks a cycle or more than {MAX_HOPS} pointers; nothing was "
                            "imported")  # fmt: skip
                    at = pointers[at]


def _check_response(values: dict[str, Any]) -> None:
    if not isinstance(values.get("envelope"), str) or not values["envelope"].startswith("{"):
        raise InvalidValueError("hosted_response.envelope must be a JSON object (the response)")
    if values["history_skip"] < 0 or values["history_len"] < 0:
        raise InvalidValueError("hosted_response.history_skip and history_len must be at least 0")
    if values.get("history_from") == values["response_id"]:
        raise InvalidValueError("hosted_response.history_from must name another response")
