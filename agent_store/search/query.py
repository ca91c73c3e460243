"""Search over message text, scoped to one user: what ``Store.search``, ``agent-store search``, the agent's
search tool and the browser all call.

Query syntax (``websearch_to_tsquery``'s): words, ``"quoted phrases"``, ``OR`` between two terms, ``-term`` to
exclude. The query is data: it is split into terms here, and each term reaches the database as a bound
parameter (FTS5 gets every term as a quoted string), so no query is ever SQL or FTS syntax.

Matching, the same on both backends:
- a term of one or two ASCII letters or digits ("AI", "ok") matches as a whole word (a substring would find
  "ai" in "said"), case-insensitively;
- every other term matches as a case-insensitive substring: Chinese and Japanese put no spaces between words,
  so "李明" must find "我叫李明"; "pass" finds "password".

Indexes (migrations 0007 and 0009): PostgreSQL serves substrings of three or more characters with a trigram
index and short words with a full-text index of short words; SQLite finds three-plus-character substrings'
candidates with an FTS5 trigram table (which messages hold each trigram), checks the substring on those rows,
and checks short words on the user's own messages. A term of one or two characters that is not an ASCII word
("李明", "名字") no index can serve (trigrams need three characters): it is checked on the user's messages,
found through the user's sessions, never by reading the whole table.

Ranking: messages holding more of the query's terms first, then the newest. The rank depends on the message
alone, so the keyset cursor stays exact while new messages arrive.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    and_,
    case,
    column,
    func,
    literal,
    literal_column,
    not_,
    or_,
    select,
    table,
    tuple_,
)

from agent_store.db import codec, message_decode, message_rows, sealing, tenancy, text_match
from agent_store.db.database import Database
from agent_store.db.tables import messages_t, sessions_t
from agent_store.errors import ConfigurationError, InvalidValueError
from agent_store.models import SearchHit, SearchPage

M, S = messages_t.c, sessions_t.c
MAX_QUERY = 1000  # characters
MAX_TERMS = 16
SNIPPET = 120  # characters of context around the first match
_TOKEN = re.compile(r'(-?)"([^"]*)"|(\S+)')
_SIMPLE: ColumnElement[Any] = literal_column("'simple'::regconfig")  # a constant, as in the index's expression
# Short words: the runs of one or two letters and digits (in the database's locale) of a message's first 100,000
# characters, exactly the expression of the full-text index (migration 0009 says why only those).
_WORDS: ColumnElement[Any] = func.to_tsvector(_SIMPLE, func.regexp_replace(
    func.left(M.text, literal_column("100000")), literal_column("'[[:alnum:]]{3,}|[^[:alnum:]]+'"),
    literal_column("' '"), literal_column("'g'"),
))  # fmt: skip
_TRIGRAMS = 32  # at most this many of a long term's trigrams go to FTS5; the row check decides anyway
_FTS = table("agent_messages_fts", column("rowid"), column("agent_messages_fts"))  # SQLite's, migration 0007


@dataclass(frozen=True)
class Query:
    clauses: list[list[str]]  # every clause must match; a clause matches when one of its terms does
    excluded: list[str]

    @property
    def terms(self) -> list[str]:
        return [t for clause in self.clauses for t in clause]


def parse(text: str, *, max_terms: int | None = MAX_TERMS) -> Query:
    """Terms, phrases, ``OR`` and ``-exclusions``; anything else is a literal term (``"``, ``*``, ``NEAR(``).
    ``max_terms`` None: any number (a question for search by meaning; :func:`focus` picks the words' terms)."""
    if not isinstance(text, str):
        raise InvalidValueError(f"query must be text, not {type(text).__name__}")
    if len(text) > MAX_QUERY:
        raise InvalidValueError(f"query is {len(text)} characters; at most {MAX_QUERY}")
    if "\x00" in text or (not text.isprintable() and codec.has_surrogate(text)):
        raise InvalidValueError("query must be text without NUL or lone surrogate characters")
    clauses: list[list[str]] = []
    excluded: list[str] = []
    pending_or = False
    for match in _TOKEN.finditer(text):
        negated, phrase, word = match.group(1), match.group(2), match.group(3)
        if word == "OR" and clauses and not pending_or:
            pending_or = True
            continue
        if phrase is None and word.startswith("-") and len(word) > 1:
            negated, phrase = "-", word[1:]
        term = (word if phrase is None else phrase).strip()
        if not term:
            continue
        if negated:
            excluded.append(term)
        elif pending_or:
            clauses[-1].append(term)
        else:
            clauses.append([term])
        pending_or = False
    if pending_or:
        clauses.append(["OR"])  # a trailing OR is a word
    query = Query(clauses, excluded)
    if not clauses:
        raise InvalidValueError("a search needs at least one term to find (exclusions alone match everything)")
    if max_terms is not None and len(query.terms) + len(excluded) > max_terms:
        raise InvalidValueError(f"a search by words takes at most {max_terms} terms (search by meaning, ranking "
                                "'hybrid' or 'vector', takes a question of any length)")  # fmt: skip
    return query


def focus(query: Query, max_terms: int = MAX_TERMS) -> Query:
    """The words' leg of a long question: every exclusion, and the clauses holding its longest terms (the ones
    most likely to be names, codes and rare words), in the question's order, at most ``max_terms`` terms in all."""
    room = max_terms - len(query.excluded)
    if room < 1:
        raise InvalidValueError(f"a search takes at most {max_terms - 1} exclusions")
    if len(query.terms) <= room:
        return query
    by_length = sorted(range(len(query.clauses)), key=lambda n: -max(len(t) for t in query.clauses[n]))
    kept: set[int] = set()
    for n in by_length:
        if sum(len(query.clauses[k]) for k in kept) + len(query.clauses[n]) <= room:
            kept.add(n)
    return Query([clause for n, clause in enumerate(query.clauses) if n in kept], list(query.excluded))


def short_word(term: str) -> bool:
    return len(term) < 3 and term.isascii() and term.isalnum()


def _like(term: str) -> str:
    return "%" + re.sub(r"([\\%_])", r"\\\1", term) + "%"


def matches(term: str, dialect: str) -> ColumnElement[bool]:
    """The SQL condition "this message holds ``term``" (see the module docstring for the rules)."""
    if dialect == "postgresql":
        if short_word(term):  # the expression of the full-text index (migration 0007), exactly
            return _WORDS.op("@@")(func.plainto_tsquery(_SIMPLE, term))
        return M.text.ilike(_like(term), escape="\\")
    if short_word(term):  # SQLite: text_match.has_word, registered on every connection
        return func.agent_store_word(M.text, term) == 1
    holds = func.instr(func.agent_store_lower(M.text), term.lower()) > 0  # SQLite's own lower() folds only A-Z
    if len(term) < 3:
        return holds
    fts = select(_FTS.c.rowid).where(_FTS.c.agent_messages_fts.op("MATCH")(trigram_query(term)))
    return and_(literal_column("agent_messages.rowid").in_(fts.scalar_subquery()), holds)


def trigram_query(term: str) -> str:
    """FTS5's candidates for ``term``: the messages holding its trigrams, wherever they are.

    The index keeps no positions (migration 0009), so it cannot match a phrase; every trigram is a quoted
    string (data, never FTS syntax), and the caller checks the term itself on each candidate.
    """
    grams = list(dict.fromkeys(term[i : i + 3] for i in range(len(term) - 2)))
    if len(grams) > _TRIGRAMS:  # spread over the whole term: the rarest trigram may be anywhere
        grams = [grams[i * (len(grams) - 1) // (_TRIGRAMS - 1)] for i in range(_TRIGRAMS)]
    return " AND ".join('"' + gram.replace('"', '""') + '"' for gram in grams)


def _encode(row: Any) -> str:
    raw = json.dumps([row.rank, row.created_at.isoformat(), row.session_id, row.seq])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode(cursor: str) -> tuple[int, datetime, str, int]:
    try:
        rank, created_at, session_id, seq = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        when = datetime.fromisoformat(created_at)
        if not (type(rank) is int and type(seq) is int and when.tzinfo is not None):
            raise ValueError(cursor)
        if not (0 <= rank <= MAX_TERMS and 0 <= seq <= codec.INT32 and when.astimezone(UTC).year > 1):
            raise ValueError(cursor)  # out of what any hit has (and of what the databases take)
        codec.check_id(session_id, "cursor")
        return rank, when, session_id, seq
    except (ValueError, TypeError, OverflowError, json.JSONDecodeError, InvalidValueError) as exc:
        raise InvalidValueError("cursor is not one this store handed out") from exc


def snippet(text: str, query: Query, *, whole_words: bool = False) -> tuple[str, list[tuple[int, int]]]:
    """Up to SNIPPET characters around the first match, and where each match is in it (start, end).
    ``whole_words``: a hit found by meaning alone marks only the question's whole words (never "off[sit]e"); a
    term in a script written without spaces (Chinese, Japanese) is a word wherever it is."""
    spans: list[tuple[int, int]] = []
    for term in query.terms:
        whole = short_word(term) or (whole_words and not _unspaced(term))
        pattern = text_match.word_pattern(term) if whole else re.compile(re.escape(term), re.IGNORECASE)
        spans += [m.span() for m in pattern.finditer(text)]
    spans.sort()
    first = spans[0][0] if spans else 0
    start = max(0, min(first - SNIPPET // 3, len(text) - SNIPPET))
    end = min(len(text), start + SNIPPET)
    lead = "…" if start > 0 else ""
    marks: list[tuple[int, int]] = []
    for a, b in spans:
        if a >= start and b <= end:
            a, b = a - start + len(lead), b - start + len(lead)
            if marks and a < marks[-1][1]:  # overlapping matches mark one span
                marks[-1] = (marks[-1][0], max(b, marks[-1][1]))
            else:
                marks.append((a, b))
    return lead + text[start:end] + ("…" if end < len(text) else ""), marks


def _unspaced(term: str) -> bool:
    """A term with a character of a script written without spaces between words (CJK ideographs, kana, hangul)."""
    return any("\u3040" <= c <= "\u30ff" or "\u3400" <= c <= "\u9fff" or "\uac00" <= c <= "\ud7af" for c in term)


def scoped(*, user_id: str | None, session_id: str | None, agent_id: str | None, exclude_session_id: str | None,
           visible_to_agent: str | None, all_users: bool) -> list[ColumnElement[bool]]:  # fmt: skip
    """A search's scope, as conditions on agent_sessions: one user's sessions (or, for an operator, everyone's),
    narrowed to a session or an agent, without the current session, and only what ``visible_to_agent`` may open
    (its own sessions and unbound ones). Keyword and vector ranking both read through it (hybrid.py)."""
    if all_users and user_id is not None:
        raise InvalidValueError("search takes user_id or all_users=True, not both")
    codec.check_id(user_id, "user_id", required=not all_users)
    ids = {"session_id": session_id, "agent_id": agent_id, "exclude_session_id": exclude_session_id,
           "visible_to_agent": visible_to_agent}  # fmt: skip
    for name, value in ids.items():
        codec.check_id(value, name)
    where: list[ColumnElement[bool]] = [] if all_users else [S.user_id == user_id]
    where += [S.id == session_id] if session_id is not None else []
    where += [S.agent_id == agent_id] if agent_id is not None else []
    where += [S.id != exclude_session_id] if exclude_session_id is not None else []
    if visible_to_agent is not None:
        where.append(or_(S.agent_id.is_(None), S.agent_id == visible_to_agent))
    return where


@tenancy.for_user
async def search(
    db: Database, query_text: str, *, user_id: str | None, session_id: str | None, agent_id: str | None, limit: int,
    cursor: str | None, exclude_session_id: str | None = None, visible_to_agent: str | None = None,
    all_users: bool = False, parsed: Query | None = None,
) -> SearchPage:  # fmt: skip
    """``parsed``: the query already parsed (hybrid.py's words' leg of a longer question), else ``query_text``'s."""
    scope = scoped(user_id=user_id, session_id=session_id, agent_id=agent_id,
                   exclude_session_id=exclude_session_id, visible_to_agent=visible_to_agent, all_users=all_users)
    codec.check_int(limit, "limit", low=1, high=1001)
    query = asked = parse(query_text) if parsed is None else parsed
    after = _decode(cursor) if cursor is not None else None
    cipher = None
    if db.settings.keys is not None:  # sealed messages: their terms' tokens under the user's keys (db/sealing.py)
        if all_users:
            raise InvalidValueError("a store with per-user keys searches one user's messages at a time")
        cipher = await sealing.cipher_for(db, user_id)
        query = Query([[k for t in clause for k in cipher.tokens(t)] for clause in query.clauses],
                      [k for t in query.excluded for k in cipher.tokens(t)])  # fmt: skip
        if not all(query.clauses):  # a clause none of whose terms the user's keys have a token of: no hit
            return SearchPage(items=[], next_cursor=None)
    async with db.transaction(write=False, replica=True, doing="searching messages") as conn:
        dialect = conn.dialect.name
        rank = sum((case((matches(t, dialect), 1), else_=0) for t in query.terms), literal(0))
        # Scoped to the user before anything is ranked, counted or limited (an operator may search everyone's).
        where = [*scope, *(or_(*(matches(t, dialect) for t in clause)) for clause in query.clauses)]
        where += [not_(matches(t, dialect)) for t in query.excluded]
        shown = (M.session_id, M.seq, M.role, M.author_name, M.created_at, M.text, M.excluded, M.summarized_by,
                 *((M.message_id, M.body) if cipher is not None else ()))  # fmt: skip
        hits = (
            select(*shown, S.title, S.user_id, rank.label("rank"))
            .select_from(messages_t.join(sessions_t, S.id == M.session_id))
            .where(*where)
            .subquery()
        )
        page = select(hits).order_by(hits.c.rank.desc(), hits.c.created_at.desc(), hits.c.session_id.desc(),
                                     hits.c.seq.desc()).limit(limit + 1)  # fmt: skip
        if after is not None:
            keyset = tuple_(hits.c.created_at, hits.c.session_id, hits.c.seq) < tuple_(*after[1:])
            page = page.where(or_(hits.c.rank < after[0], and_(hits.c.rank == after[0], keyset)))
        rows = (await conn.execute(page)).all()
        if not rows and cipher is None and await _sealed_in(conn, scope):
            raise ConfigurationError("messages in this search's scope are sealed with per-user keys: search them with "
                                     "the store's keys (keys=; the CLI: $AGENT_STORE_KEYS)")  # fmt: skip
    items = []
    for row in rows[:limit]:
        text, marks = snippet(_said(row, cipher) if cipher is not None else row.text, asked)
        items.append(SearchHit(
            session_id=row.session_id, seq=row.seq, role=row.role, author_name=row.author_name,
            created_at=row.created_at, title=row.title, user_id=row.user_id, snippet=text, marks=marks, rank=row.rank,
            excluded=bool(row.excluded), summarized_by=row.summarized_by,
        ))  # fmt: skip
    return SearchPage(items=items, next_cursor=_encode(rows[limit - 1]) if len(rows) > limit else None)


async def _sealed_in(conn: Any, scope: list[ColumnElement[bool]]) -> bool:
    """Whether one of the scope's newest sessions ends with a sealed message (a store with keys seals every
    message it writes): the last message of each of the PROBED most recently updated (by the sessions' indexes
    and the messages' key), so an operator's empty search of every user costs 100 probes, not a scan."""
    last = select(M.body).where(M.session_id == S.id).order_by(M.seq.desc()).limit(1).scalar_subquery()
    newest = select(last.label("body")).select_from(sessions_t).where(*scope).order_by(S.updated_at.desc(), S.id.desc())
    marker = sealing.sealed_marker(newest.limit(PROBED).subquery().c.body, message_rows.ENCRYPTED,
                                   conn.dialect.name == "postgresql")
    return bool((await conn.execute(select(func.count()).where(marker.like(sealing.PREFIX + "%")))).scalar_one() > 0)


PROBED = 100


def _said(row: Any, cipher: Any) -> str:
    """A sealed message's text, opened with the user's keys (its column holds its blind index)."""
    return message_decode.message_from_row(row.body, cipher, identity=row.message_id, role=row.role,
                                           author_name=row.author_name, text=row.text).text  # fmt: skip
