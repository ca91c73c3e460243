"""Search by words and by meaning together: what ``Store.search(ranking=...)`` runs.

- ``keyword``: query.py's search, unchanged (and what a store without an embedder, or without vectors, uses).
- ``vector``: messages ranked by the cosine similarity of their vectors to the query's (vectors.py).
- ``hybrid``: both lists fused by reciprocal rank fusion: a message's score is the sum, over the lists it is in,
  of 1 / (60 + its rank there) (Cormack et al., 2009; k = 60 as they found best). Fusion needs no calibration
  between a count of matched words and a cosine, which share no scale; a message found both ways rises.
- ``auto``: ``hybrid`` if the store has an embedder, else ``keyword``.

Scoping is keyword search's: the vector scan reads only the sessions the same filters select (user, session,
agent, the agent's visibility), and every hit is read back through the same scoped query with the query's
``-exclusions`` applied, so a vector never brings in another user's message, an excluded term, or a message
deleted since (the vector went with it: a foreign key). Hybrid and vector results are one page of at most
``limit`` hits, best first (no cursor: a fused rank has no stable keyset while messages arrive).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, not_, select, tuple_

from agent_store.db import codec, tenancy
from agent_store.db.database import Database
from agent_store.db.tables import messages_t, sessions_t
from agent_store.errors import InvalidValueError, NotEmbeddedError
from agent_store.models import SearchHit, SearchPage
from agent_store.search import query as keyword
from agent_store.search.vectors import Embeddings

RANKINGS = ("auto", "keyword", "vector", "hybrid")
RRF_K = 60
POOL = 50  # candidates taken from each list before fusion
M, S = keyword.M, keyword.S


@tenancy.for_user
async def search(db: Database, embeddings: Embeddings, query_text: str, *, ranking: str, user_id: str | None,
                 session_id: str | None = None, agent_id: str | None = None, limit: int = 20,
                 cursor: str | None = None, exclude_session_id: str | None = None,
                 visible_to_agent: str | None = None, all_users: bool = False,
                 min_score: float | None = None) -> SearchPage:  # fmt: skip
    """``min_score``: a cosine similarity below which a message found by meaning alone is dropped (-1 to 1; a
    message the words found stays). A question of any length: the words' leg takes its longest terms."""
    if ranking not in RANKINGS:
        raise InvalidValueError(f"ranking must be one of {', '.join(RANKINGS)}, not {ranking!r}"[:200])
    if ranking == "auto":
        ranking = "hybrid" if embeddings.enabled else "keyword"
    scope: dict[str, Any] = {"user_id": user_id, "session_id": session_id, "agent_id": agent_id,
             "exclude_session_id": exclude_session_id, "visible_to_agent": visible_to_agent, "all_users": all_users}
    if min_score is not None and (isinstance(min_score, bool) or not isinstance(min_score, int | float)
                                  or not -1.0 <= min_score <= 1.0):  # fmt: skip
        raise InvalidValueError("min_score is a cosine similarity, a number from -1 to 1")
    if ranking == "keyword":
        if min_score is not None:
            raise InvalidValueError("min_score applies to search by meaning (ranking 'vector', 'hybrid' or 'auto')")
        return await keyword.search(db, query_text, limit=limit, cursor=cursor, **scope)
    if cursor is not None:
        raise InvalidValueError(f"{ranking} search returns one page (no cursor); ask for up to 100 hits with limit")
    codec.check_int(limit, "limit", low=1, high=101)  # at most 100 (the bound is exclusive)
    where, parsed = keyword.scoped(**scope), keyword.parse(query_text, max_terms=None)
    by_terms = None if ranking == "vector" else await keyword.search(
        db, query_text, limit=POOL, cursor=None, parsed=keyword.focus(parsed), **scope)  # fmt: skip
    words = by_terms.items if by_terms is not None else []
    try:
        meaning = await embeddings.nearest(" ".join(parsed.terms), where, POOL)
    except NotEmbeddedError:
        if ranking == "vector":
            raise
        meaning, ranking = [], "keyword"  # no vectors yet: the words' ranking, and the page says so
    similar = {(sid, seq): score for sid, seq, score in meaning if min_score is None or score >= min_score}
    by_words = [(h.session_id, h.seq) for h in words]  # already scoped and filtered by keyword search
    rows = await _rows(db, [k for k in similar if k not in set(by_words)], where, parsed)
    fused: dict[tuple[str, int], float] = {}
    for ranked in (by_words, [k for k in similar if k in rows or k in set(by_words)]):
        for place, key in enumerate(ranked):
            fused[key] = fused.get(key, 0.0) + 1.0 / (RRF_K + place + 1)
    hits = {(h.session_id, h.seq): h for h in words}
    for key, row in rows.items():
        text, marks = keyword.snippet(row.text, parsed, whole_words=True)  # found by meaning alone
        hits[key] = SearchHit(
            session_id=row.session_id, seq=row.seq, role=row.role, author_name=row.author_name,
            created_at=row.created_at, title=row.title, user_id=row.user_id, snippet=text, marks=marks, rank=0,
            excluded=bool(row.excluded), summarized_by=row.summarized_by,
        )  # fmt: skip
    best = sorted(fused, key=lambda k: (-fused[k], -hits[k].created_at.timestamp(), k))[:limit]
    items = [hits[k].model_copy(update={"score": round(fused[k], 6), "similarity": similar.get(k)}) for k in best]
    return SearchPage(items=items, next_cursor=None, ranking=ranking)


async def _rows(db: Database, keys: list[tuple[str, int]], where: list[ColumnElement[bool]],
                parsed: keyword.Query) -> dict[tuple[str, int], Any]:  # fmt: skip
    """The candidates' rows, read again through the scope, without those holding an excluded term."""
    if not keys:
        return {}
    async with db.transaction(write=False, replica=True, doing="reading search hits") as conn:
        dialect = conn.dialect.name
        shown = (M.session_id, M.seq, M.role, M.author_name, M.created_at, M.text, M.excluded, M.summarized_by)
        query = (select(*shown, S.title, S.user_id).select_from(messages_t.join(sessions_t,
                 S.id == M.session_id)).where(tuple_(M.session_id, M.seq).in_(keys), *where,
                 *(not_(keyword.matches(t, dialect)) for t in parsed.excluded)))  # fmt: skip
        return {(r.session_id, r.seq): r for r in (await conn.execute(query)).all()}
