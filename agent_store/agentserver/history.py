"""A hosted response's history, read through the chain (migration 0018; agent_store/agentserver/responses.py).

A response's *full* list is its history, then its input, then its output, each id once (first place kept): what a
request continuing from it is given, cut to the server's limit. The server hands ``create_response`` that history
explicitly; when it is the end of another response's full list (a ``previous_response_id`` chain, or a
conversation's latest response), the row points there instead of repeating the ids (``history_from``, from
``history_skip``, ``history_len`` ids), so a chain of N responses stores O(N) links, not O(N^2). Reading walks the
pointers: one recursive statement for the rows, one for their links, then lists built from the oldest up (no
recursion in Python: chains may be deep).

A row's full list must never change once another row points at it: before its output ids change (an update) or
it is created again after a delete, the rows pointing at it get their history as rows of their own
(:func:`materialize_children`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db.tables import hosted_links_t, hosted_responses_t

__all__ = ["Spec", "compress", "full_lists", "link_rows", "materialize_children", "specs"]
R, L = hosted_responses_t.c, hosted_links_t.c


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


async def specs(conn: AsyncConnection, user: str, starts: list[str]) -> dict[str, Spec]:
    """The rows of ``starts`` and of every row their history points through, with their links: two statements."""
    if not starts:
        return {}
    seed = select(R.response_id, R.history_from).where(R.user_id == user, R.response_id.in_(starts))
    walk: Any = seed.cte("walk", recursive=True)
    up = hosted_responses_t.alias("up")
    walk = walk.union(select(up.c.response_id, up.c.history_from)
                      .where(up.c.user_id == user, up.c.response_id == walk.c.history_from))  # fmt: skip
    rows = (await conn.execute(
        select(R.response_id, R.history_from, R.history_skip, R.history_len, R.deleted_at)
        .where(R.user_id == user, R.response_id.in_(select(walk.c.response_id)))
    )).all()  # fmt: skip
    out = {r.response_id: Spec(r.response_id, r.history_from, r.history_skip, r.history_len, r.deleted_at is not None)
           for r in rows}  # fmt: skip
    for ids in _chunks(list(out)):
        links = await conn.execute(select(L.response_id, L.kind, L.item_id)
                                   .where(L.user_id == user, L.response_id.in_(ids)).order_by(L.response_id, L.kind,
                                                                                              L.pos))  # fmt: skip
        for link in links:
            out[link.response_id].links.setdefault(link.kind, []).append(link.item_id)
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
    lists = full_lists(await specs(conn, user, named), named)
    for candidate in named:
        full = lists[candidate]
        skip = len(full) - len(history)
        if skip >= 0 and full[skip:] == history:
            return candidate, skip
    return None, 0


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
