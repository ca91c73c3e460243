"""What an export carries of a session's points (migrations 0016, 0017), and how an import checks it.

Rows of four kinds go with their session: ``mark_history`` (a message's compaction columns before a rewrite),
``state_history`` (an own key before a change), ``response`` (a key naming a point) and ``branch_mark`` (a
branch's compaction of its base's messages). A branch (``base_id``) is imported after its base (an export lists
sessions oldest first), and only onto a base of the same user that holds the history it reads.

Each row is checked against its session as a run would have written it, so that a fork, a truncation or a point
read back after the import gives what it gave before the export.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sqlalchemy import Boolean, Column, Integer, MetaData, Select, String, Table, false, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db import chains, message_rows
from agent_store.db.column_types import UTCDateTime
from agent_store.db.cut_points import GONE
from agent_store.db.history_tables import insert_row, key_hash, key_is
from agent_store.db.schema_base import ID_MAX
from agent_store.db.scopes import APP_PREFIX, TEMP_PREFIX, USER_PREFIX
from agent_store.db.tables import messages_t, responses_t, sessions_t
from agent_store.errors import InvalidValueError

__all__ = ["BASE_HISTORY", "KINDS", "RESPONSE_LINE", "carry_base_history", "check_row", "check_tree", "finish",
           "inherited", "insert_rows", "rows_of"]
KINDS = ("mark_history", "state_history", "response", "branch_mark")
# A response as a line of an export: its parent by key (rows name it by row id since 0021, which is the store's own
# numbering; the key is what another store can resolve). The same shape as before 0021.
RESPONSE_LINE = Table(
    "agent_responses", MetaData(),
    Column("session_id", String(ID_MAX), nullable=False), Column("response_id", String(ID_MAX), nullable=False),
    Column("user_id", String(ID_MAX)), Column("seq_end", Integer, nullable=False),
    Column("version", Integer, nullable=False), Column("parent_id", String(ID_MAX)),
    Column("created_at", UTCDateTime(), nullable=False), Column("moves", Boolean, server_default=false()),
)  # fmt: skip


def rows_of(kind: str, table: Table, sid: str) -> Select[Any]:
    """A session's rows of ``kind`` for an export, in the order an import inserts them (a parent first)."""
    if kind != "response":
        return select(table).where(table.c.session_id == sid).order_by(*table.primary_key.columns)
    r, up = responses_t.c, responses_t.alias("up")
    parent_key = func.coalesce(up.c.response_id, r.parent_id).label("parent_id")
    shape = [parent_key if c.name == "parent_id" else r[c.name] for c in RESPONSE_LINE.c]
    return select(*shape).outerjoin(up, up.c.id == r.parent).where(r.session_id == sid).order_by(r.id)


async def insert_rows(conn: AsyncConnection, kind: str, table: Table, rows: list[dict[str, Any]]) -> None:
    if kind != "response":
        await conn.execute(insert(table), rows)
        return
    for row in rows:  # one at a time: a row's parent may be the one before it
        await insert_row(conn, {k: v for k, v in row.items() if k != "parent_id"}, row.get("parent_id"))


def check_row(kind: str, values: dict[str, Any], max_bytes: int) -> None:
    """One row by itself: marks that are the compaction's and columns that say what they say."""
    if kind in ("mark_history", "branch_mark"):
        marks = json.loads(values["marks"]) if values.get("marks") is not None else None
        if marks is not None and (
            not isinstance(marks, dict) or not set(marks) <= {*message_rows.MARK_KEYS, message_rows.MESSAGE_ID_MARK}
        ):
            raise InvalidValueError(f"{kind}.marks must be a JSON object of the compaction's keys")  # fmt: skip
        same = message_rows.mark_columns(marks, where=kind, max_bytes=max_bytes)
        if (same["excluded"], same["exclude_reason"]) != (bool(values.get("excluded")), values.get("exclude_reason")):
            raise InvalidValueError(f"{kind}: excluded and exclude_reason must say what its marks say")
    if kind == "state_history" and values["key"].startswith((USER_PREFIX, APP_PREFIX, TEMP_PREFIX)):
        raise InvalidValueError(f"state_history key {values['key']!r}: only a session's own keys have a history")
    if kind == "state_history" and not values["existed"] and values.get("value") is not None:
        raise InvalidValueError("state_history: a key that did not exist has no value")


BASE_HISTORY = "base_history"  # a branch's session line: the digest of what it reads of its bases (inherited)
WITH_TEXTS = "2:"  # a digest of each message's id, role and text (an export before it: ids alone)


def carry_base_history(values: dict[str, Any], row: dict[str, Any]) -> None:
    """A branch's session line carries its digest (checked here, compared by check_tree, never stored)."""
    if (digest := row.get(BASE_HISTORY)) is not None:
        hexa = digest.removeprefix(WITH_TEXTS) if isinstance(digest, str) else None
        if not (hexa is not None and len(hexa) == 64 and all(c in "0123456789abcdef" for c in hexa)):
            raise InvalidValueError("session.base_history must be a SHA-256 in hex")
        values[BASE_HISTORY] = digest


async def inherited(conn: AsyncConnection, branch_id: str, *, texts: bool = True) -> str:
    """A digest of the history the branch ``branch_id`` reads from its bases, through every base of the chain (each
    message's store id, role and text, in order; ``texts`` False: ids alone, as an export before WITH_TEXTS): an
    export carries it, an import compares it ("" for a chain that is not whole here, by the walk's one rule, or
    that comes back to the branch). Texts too, not a count or ids alone: a base truncated and written again has
    other messages, perhaps under the same ids (found by an outside review: a client can send a stored id again)."""
    M = messages_t.c
    parts: list[list[bytes]] = []
    chain = await chains.chain_of(conn, branch_id)  # the branch, then the bases it reads (db/chains.py)
    if len(chain) < 2 or chain[-1].base_id is not None or any(row.id == branch_id for row in chain[1:]):
        return ""  # not whole here (gone, taken again, too deep, another's), or a cycle through the branch
    end = chain[0].base_seq
    for row in chain[1:]:
        low = row.base_seq or 0
        found = await conn.execute(select(M.message_id, M.role, M.text)
                                   .where(M.session_id == row.id, M.seq >= low, M.seq < end).order_by(M.seq))
        parts.append([(json.dumps([r.message_id, r.role, r.text]) if texts else r.message_id).encode() + b"\n"
                      for r in found])  # fmt: skip
        end = low
    digest = hashlib.sha256()
    for lines in reversed(parts):  # oldest part first
        for line in lines:
            digest.update(line)
    return (WITH_TEXTS if texts else "") + digest.hexdigest()


async def check_tree(conn: AsyncConnection, session: dict[str, Any], rest: list[tuple[str, dict[str, Any]]],
                     base_history: str | None = None) -> None:  # fmt: skip
    """The session's base (if a branch) and its point rows, against the session and what the database holds."""
    sid, end, version = session["id"], session.get("next_seq") or 0, session.get("version") or 0
    where = f"import: session {sid!r}"
    base_seq = session.get("base_seq")
    own = {row["message_id"]: row["seq"] for kind, row in rest if kind == "message"}
    if session.get("base_id") is not None:
        S = sessions_t.c
        query = select(S.user_id, S.next_seq, S.incarnation).where(S.id == session["base_id"])
        base = (await conn.execute(query)).first()
        if base is None or base.user_id != session.get("user_id") or base_seq is None or not 0 <= base_seq <= end \
                or base_seq > base.next_seq:  # fmt: skip
            raise InvalidValueError(f"{where}: a branch whose base is not here (import its base first), another "
                                    "user's, or shorter than the branch reads")  # fmt: skip
        if base_history is None:  # an export made before it was carried: what the branch read cannot be checked
            raise InvalidValueError(f"{where}: a branch's line must carry base_history (the history it reads): "
                                    "export it again with this agent_store, with its base")  # fmt: skip
        # the base it reads is the one here (db/chains.py): never an incarnation of another database
        await conn.execute(update(sessions_t).where(S.id == sid).values(base_incarnation=base.incarnation))
        if await inherited(conn, sid, texts=base_history.startswith(WITH_TEXTS)) != base_history:
            raise InvalidValueError(f"{where}: its base's history here is not the one it was exported with (the "
                                    "base changed since, or it reads through itself): import the base as it was, or "
                                    "start the branch anew")  # fmt: skip
    elif base_seq is not None:
        raise InvalidValueError(f"{where}: base_seq without a base_id")
    M, R = messages_t.c, responses_t.c
    keys: set[str] = set()  # one key, one point: a second row of a key in the file is refused as one in the database is
    for kind, row in rest:
        if kind == "mark_history" and not (row["message_id"] in own and own[row["message_id"]] < row["horizon"] <= end):
            raise InvalidValueError(f"{where}: a mark_history row names a message it lacks, or a horizon out of range")
        if kind in ("mark_history", "branch_mark") and not 0 <= row["version"] <= version:
            raise InvalidValueError(f"{where}: a {kind} row of a version the session never had")
        if kind == "state_history" and not 1 <= row["until_version"] <= version:
            raise InvalidValueError(f"{where}: a state_history row of a version the session never had")
        if kind == "branch_mark":
            found = (await conn.execute(select(M.seq).where(M.session_id == session.get("base_id"),
                                                            M.message_id == row["message_id"]))).first()  # fmt: skip
            if base_seq is None or not row["horizon"] <= end or (found is not None and found.seq >= base_seq):
                raise InvalidValueError(f"{where}: a branch_mark row of no branch, or out of range")
        if kind == "response":
            gone = (row["seq_end"], row["version"], row["response_id"]) == (GONE, GONE, sid)  # cut_points.py
            if row.get("user_id") != session.get("user_id") or row["version"] > version or not (
                    gone or (base_seq or 0) <= row["seq_end"] <= end):  # fmt: skip
                raise InvalidValueError(f"{where}: response {row['response_id']!r} is another user's or out of range")
            owner = R.user_id.is_(None) if row.get("user_id") is None else R.user_id == row["user_id"]  # per user
            keyed = key_is(R, row["response_id"], key_hash(row["response_id"]))
            if row["response_id"] in keys or (await conn.execute(select(R.session_id).where(keyed, owner))).first():
                raise InvalidValueError(f"{where}: response id {row['response_id']!r} already names a point here")
            keys.add(row["response_id"])


async def finish(conn: AsyncConnection, session: dict[str, Any]) -> None:
    """The session keeps its history from now on, if it did before (set last: the import's own state rows are not
    changes, and the history rows were imported as they were)."""
    if session.get("keeps_history"):
        await conn.execute(update(sessions_t).where(sessions_t.c.id == session["id"]).values(keeps_history=True))
