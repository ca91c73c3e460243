"""A hosted response's history, read through the chain (migration 0018; agent_store/agentserver/responses.py).

A response's *full* list is its history, then its input, then its output, each id once (first place kept): what a
request continuing from it is given, cut to the server's limit. The server hands ``create_response`` that history
explicitly; when it is the end of another response's full list (a ``previous_response_id`` chain, or a
conversation's latest response), the row points there instead of repeating the ids (``history_from``, from
``history_skip``, ``history_len`` ids), except every ``MAX_HOPS``-th, which keeps rows of its own: a chain stores
its items' links and a window's every ``MAX_HOPS`` responses, not a window per response. Reading walks at most
``MAX_HOPS`` pointers: one recursive statement for the rows and their links, then lists built oldest first.

A row's full list must never change once another row points at it: before its output ids change (an update) or
it is created again after a delete, the rows pointing at it get their history as rows of their own
(:func:`materialize_children`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, bindparam, func, literal_column, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db.hosted_tables import MAX_HOPS
from agent_store.db.tables import hosted_items_t, hosted_links_t, hosted_responses_t

__all__ = ["ITEMS", "MAX_HOPS", "ONE_RESPONSE", "Spec", "compress", "full_lists", "link_rows", "materialize_children",
           "specs", "specs_from", "walk"]
R, L, T = hosted_responses_t.c, hosted_links_t.c, hosted_items_t.c


@dataclass
class Spec:
    """One response's row as the history reads it, with its links by kind (h, i, o)."""

    response_id: str
    history_from: str | None
    skip: int
    length: int
    deleted: bool
    links: dict[str, list[str]] = field(default_factory=dict)


def dedup(ids: list[str]) -> list[str]:
    return list(dict.fromkeys(ids))


def _walk_statement(one: bool) -> Any:
    """The rows of ``starts`` (``one``: of ``start``) and every row their history points through (recursive), each
    with its links in order: built once (its compiled form is cached by the statement), bound per call."""
    user: Any = bindparam("user")
    seed = R.response_id == bindparam("start") if one else R.response_id.in_(bindparam("starts", expanding=True))
    walk: Any = select(R.response_id, R.history_from).where(R.user_id == user, seed)
    walk = walk.cte("walk", recursive=True)
    up = hosted_responses_t.alias("up")
    walk = walk.union(select(up.c.response_id, up.c.history_from)
                      .where(up.c.user_id == user, up.c.response_id == walk.c.history_from))  # fmt: skip
    # Driven from the walk (a few rows): each row and its links by their keys, whatever the tables' statistics say.
    joined = walk.join(hosted_responses_t, and_(R.user_id == user, R.response_id == walk.c.response_id)).outerjoin(
        hosted_links_t, and_(L.user_id == user, L.response_id == walk.c.response_id))  # fmt: skip
    return (select(R.response_id, R.history_from, R.history_skip, R.history_len, R.deleted_at, L.kind, L.item_id)
            .select_from(joined).order_by(R.response_id, L.kind, L.pos))  # fmt: skip


_WALK, _WALK_ONE = _walk_statement(False), _walk_statement(True)


def walk(user: str, starts: list[str]) -> tuple[Any, dict[str, Any]]:
    """The statement and its parameters (a database's one_statement takes the one-start form only)."""
    if len(starts) == 1:
        return _WALK_ONE, {"user": user, "start": starts[0]}
    return _WALK, {"user": user, "starts": list(dict.fromkeys(starts))}


async def specs(conn: AsyncConnection, user: str, starts: list[str]) -> dict[str, Spec]:
    """The rows of ``starts`` and of every row their history points through, with their links: one statement."""
    return specs_from(list(await conn.execute(*walk(user, starts))) if starts else [])


def specs_from(rows: list[Any]) -> dict[str, Spec]:
    out: dict[str, Spec] = {}
    for r in rows:
        spec = out.get(r.response_id)
        if spec is None:
            spec = out[r.response_id] = Spec(r.response_id, r.history_from, r.history_skip, r.history_len,
                                             r.deleted_at is not None)  # fmt: skip
        if r.kind is not None:
            spec.links.setdefault(r.kind, []).append(r.item_id)
    return out


def _chunks(ids: list[str], size: int = 500) -> list[list[str]]:
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def full_lists(found: dict[str, Spec], wanted: list[str]) -> dict[str, list[str]]:
    """Each wanted response's full list (history, input, output; each id once), oldest pointer first."""
    memo: dict[str, list[str]] = {}
    for rid in wanted:
        path: list[str] = []
        at: str | None = rid
        while at is not None and at not in memo and at in found:
            path.append(at)
            at = found[at].history_from
        for node in reversed(path):
            spec = found[node]
            if spec.history_from is None:
                history = spec.links.get("h", [])
            else:  # a row erased or missing reads as no history (never another's)
                history = memo.get(spec.history_from, [])[spec.skip : spec.skip + spec.length]
            memo[node] = dedup([*history, *spec.links.get("i", []), *spec.links.get("o", [])])
    return {rid: memo.get(rid, []) for rid in wanted}


async def history_of(conn: AsyncConnection, user: str, response_id: str) -> list[str]:
    """A response's own history (what it was created with)."""
    found = await specs(conn, user, [response_id])
    spec = found.get(response_id)
    if spec is None:
        return []
    if spec.history_from is None:
        return spec.links.get("h", [])
    base = full_lists(found, [spec.history_from]).get(spec.history_from, [])
    return base[spec.skip : spec.skip + spec.length]


async def compress(conn: AsyncConnection, user: str, history: list[str], candidates: list[str | None]) -> tuple[
    str | None, int
]:  # fmt: skip
    """(history_from, skip) when ``history`` is the end of a candidate's full list; (None, 0): rows of its own."""
    named = [c for c in dict.fromkeys(candidates) if c is not None]
    if not history or not named:
        return None, 0
    if conn.dialect.name == "postgresql":  # an update of a candidate's output waits until this row points at it
        await conn.execute(select(R.response_id).where(R.user_id == user, R.response_id.in_(named))
                           .with_for_update(read=True))  # fmt: skip
    found = await specs(conn, user, named)
    lists = full_lists(found, named)
    for candidate in named:
        full = lists[candidate]
        skip = len(full) - len(history)
        if skip >= 0 and full[skip:] == history:
            if _hops(found, candidate) >= MAX_HOPS - 1:  # a reading would walk too far: rows of its own instead
                return None, 0
            return candidate, skip
    return None, 0


def _hops(found: dict[str, Spec], rid: str) -> int:
    """How many pointers a reading of ``rid``'s list follows before rows of their own."""
    hops, at = 0, found.get(rid)
    while at is not None and at.history_from is not None:
        hops, at = hops + 1, found.get(at.history_from)
    return hops


def link_rows(user: str, response_id: str, kind: str, ids: list[str]) -> list[dict[str, Any]]:
    return [{"user_id": user, "response_id": response_id, "kind": kind, "pos": n, "item_id": item_id}
            for n, item_id in enumerate(ids)]  # fmt: skip


async def materialize_children(conn: AsyncConnection, user: str, response_id: str) -> None:
    """Give every row pointing at ``response_id`` its history as rows of its own (its full list is about to
    change). Their own children point at them, whose full lists do not change: one level is enough."""
    children = list((await conn.execute(
        select(R.response_id).where(R.user_id == user, R.history_from == response_id)
    )).scalars())  # fmt: skip
    for child in children:
        ids = await history_of(conn, user, child)
        if ids:
            await conn.execute(hosted_links_t.insert(), link_rows(user, child, "h", ids))
        await conn.execute(update(hosted_responses_t).where(R.user_id == user, R.response_id == child)
                           .values(history_from=None, history_skip=0, history_len=len(ids)))  # fmt: skip


# The provider's two one-statement reads (responses.py).
def _one_response() -> Any:
    """A response's envelope with its output items in order: one statement, built once (bound per call)."""
    joined = hosted_responses_t.outerjoin(
        hosted_links_t, and_(L.user_id == R.user_id, L.response_id == R.response_id, L.kind == "o")
    ).outerjoin(hosted_items_t, and_(T.user_id == L.user_id, T.item_id == L.item_id))
    query = select(R.envelope, R.deleted_at, T.item_id, T.body).select_from(joined)
    return query.where(R.user_id == bindparam("user"), R.response_id == bindparam("rid")).order_by(L.pos)


ONE_RESPONSE = _one_response()
# Items by id, one statement with the ids as one parameter (a list on PostgreSQL, a JSON array on SQLite).
ITEMS = {
    True: select(T.item_id, T.body).where(T.user_id == bindparam("user"), T.item_id == func.any(bindparam("ids"))),
    False: select(T.item_id, T.body).where(T.user_id == bindparam("user"), T.item_id.in_(
        select(literal_column("value")).select_from(func.json_each(bindparam("ids"))))),
}
