"""Session lifecycle outside a run: list, inspect, update, close, clear, expire, erase, fork, truncate.

Every function takes the owner (``user_id``) and touches only that owner's sessions: a session id under
another user behaves exactly like an id that does not exist.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from agent_framework import Message
from sqlalchemy import ColumnElement, and_, delete, func, literal, or_, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db import chains, codec, message_rows, sealing, tenancy
from agent_store.db.branch_deletes import delete_with_branches
from agent_store.db.cut_points import cut_points
from agent_store.db.database import Database
from agent_store.db.scopes import owner_is
from agent_store.db.statements import not_found
from agent_store.db.tables import JsonText, message_marks_t, messages_t, sessions_t
from agent_store.errors import ContentSealedError, InvalidValueError, SessionExpiredError
from agent_store.models import MessageRecord, SessionInfo, SessionPage

S = sessions_t.c
_SCALARS = (str, int, float, bool)


def owned(session_id: str, user_id: str | None) -> tuple[ColumnElement[bool], ...]:
    codec.check_id(session_id, "session_id", required=True)
    codec.check_id(user_id, "user_id")
    return S.id == session_id, owner_is(S.user_id, user_id)


def info(row: Any) -> SessionInfo:
    return SessionInfo(
        id=row.id,
        user_id=row.user_id,
        agent_id=row.agent_id,
        title=row.title,
        metadata=row.metadata or {},
        message_count=row.next_seq,
        version=row.version,
        created_at=row.created_at,
        updated_at=row.updated_at,
        last_run_at=row.last_run_at,
        closed_at=row.closed_at,
        expires_at=row.expires_at,
        forked_from=row.forked_from,
        forked_at_seq=row.forked_at_seq,
    )


_INFO_COLUMNS = (
    S.id,
    S.user_id,
    S.agent_id,
    S.title,
    S["metadata"],
    S.next_seq,
    S.version,
    S.created_at,
    S.updated_at,
    S.last_run_at,
    S.closed_at,
    S.expires_at,
    S.forked_from,
    S.forked_at_seq,
)


def _metadata_filter(conn: AsyncConnection, metadata: dict[str, Any]) -> list[ColumnElement[bool]]:
    """Equality on top-level metadata keys (JSONB containment on PostgreSQL, json_extract on SQLite)."""
    for key, value in metadata.items():
        if type(value) is int and not -codec.INT64 <= value < codec.INT64:
            raise InvalidValueError(f"metadata filter {key!r}: the number is out of range")
        if type(value) not in _SCALARS or not isinstance(key, str) or '"' in key:
            raise InvalidValueError(f"metadata filter {key!r}: filter on string keys with str/int/float/bool values")
    if conn.dialect.name == "postgresql":
        return [S["metadata"].op("@>")(literal(codec.dumps(metadata, where="metadata filter"), JsonText()))]
    return [func.json_extract(S["metadata"], f'$."{key}"') == value for key, value in metadata.items()]


def _encode_cursor(row: Any) -> str:
    raw = json.dumps([row.updated_at.isoformat(), row.id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        updated_at, session_id = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        return datetime.fromisoformat(updated_at), str(session_id)
    except (ValueError, TypeError) as exc:
        raise InvalidValueError("cursor is not one this store handed out") from exc


@tenancy.for_user
async def list_sessions(
    db: Database,
    *,
    user_id: str | None,
    all_users: bool,
    agent_id: str | None,
    metadata: dict[str, Any] | None,
    limit: int,
    cursor: str | None,
    status: str | None = None,
) -> SessionPage:
    if status not in (None, "active", "closed", "expired"):
        raise InvalidValueError(f'status must be "active", "closed", "expired" or None, not {status!r}')
    if type(limit) is not int or not 1 <= limit <= 1000:
        raise InvalidValueError(f"limit must be an int from 1 to 1000, not {limit!r}")
    codec.check_id(user_id, "user_id")
    codec.check_id(agent_id, "agent_id")
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidValueError("metadata must be a dict of key/value pairs to match")
    async with db.transaction(write=False, replica=True, doing="listing sessions") as conn:
        query = select(*_INFO_COLUMNS)
        if not all_users:
            query = query.where(owner_is(S.user_id, user_id))
        if agent_id is not None:
            query = query.where(S.agent_id == agent_id)
        if metadata:
            query = query.where(*_metadata_filter(conn, metadata))
        if status is not None:  # active: open and not expired; closed wins over expired
            now = datetime.now(UTC)
            unexpired = or_(S.expires_at.is_(None), S.expires_at > now)
            query = query.where(
                S.closed_at.isnot(None) if status == "closed"
                else and_(S.closed_at.is_(None), S.expires_at <= now) if status == "expired"
                else and_(S.closed_at.is_(None), unexpired)
            )  # fmt: skip
        if cursor is not None:  # keyset pagination: resume strictly after the last row of the previous page
            query = query.where(tuple_(S.updated_at, S.id) < tuple_(*_decode_cursor(cursor)))
        query = query.order_by(S.updated_at.desc(), S.id.desc()).limit(limit + 1)
        rows = (await conn.execute(query)).all()
    more = len(rows) > limit
    return SessionPage(
        items=[info(r) for r in rows[:limit]], next_cursor=_encode_cursor(rows[limit - 1]) if more else None
    )


@tenancy.for_user
async def get(db: Database, session_id: str, user_id: str | None) -> SessionInfo:
    async with db.transaction(write=False, replica=True, doing="reading a session") as conn:
        row = (await conn.execute(select(*_INFO_COLUMNS).where(*owned(session_id, user_id)))).first()
    if row is None:
        raise not_found(session_id, user_id)
    return info(row)


@tenancy.for_user
async def messages(
    db: Database, session_id: str, user_id: str | None, after_seq: int, limit: int, *, sealed_ok: bool = False
) -> list[MessageRecord]:
    """A page of a transcript. ``sealed_ok`` (the browser): an encrypted message the store has no cipher for, or
    one it cannot open (a key gone, content moved or put there in clear), comes back with an empty body marked
    ``"encrypted": true`` and no text (a sealed message's text column is its blind index) instead of raising.
    A branch's transcript is what it reads: its bases' messages before it begins (each record's ``session_id``
    says whose), then its own."""
    codec.check_int(after_seq, "after_seq", low=-1, high=codec.INT32)
    codec.check_int(limit, "limit", low=1, high=10_001)
    M = messages_t.c
    async with db.transaction(write=False, replica=True, doing="reading messages") as conn:
        if (await conn.execute(select(S.id).where(*owned(session_id, user_id)))).first() is None:
            raise not_found(session_id, user_id)
        parts, end = [], None
        for row in await chains.chain_of(conn, session_id):  # its own rows, then each base's part (db/chains.py)
            low = row.base_seq or 0 if row.base_id is not None else 0
            parts.append(and_(M.session_id == row.id, M.seq >= low, *([M.seq < end] if end is not None else [])))
            end = low
        query = select(messages_t).where(or_(*parts), M.seq > after_seq).order_by(M.seq).limit(limit)
        rows = (await conn.execute(query)).mappings().all()
    cipher = await sealing.cipher_for(db, user_id)
    return [_record(row, cipher, sealed_ok) for row in rows]


@tenancy.for_user
async def messages_by_ids(db: Database, user_id: str | None, message_ids: list[str]) -> list[MessageRecord]:
    """The messages of ``user_id``'s sessions with these store ids (an index probe a session of the user's)."""
    M = messages_t.c
    owner = select(S.id).where(owner_is(S.user_id, user_id))
    query = select(messages_t).where(M.message_id.in_(message_ids), M.session_id.in_(owner))
    query = query.order_by(M.session_id, M.seq)
    async with db.transaction(write=False, replica=True, doing="reading messages") as conn:
        rows = (await conn.execute(query)).mappings().all()
    cipher = await sealing.cipher_for(db, user_id)
    return [_record(row, cipher, False) for row in rows]


def _record(row: Any, cipher: message_rows.MessageCipher | None, sealed_ok: bool) -> MessageRecord:
    """A transcript's message. Under per-user keys its text column holds its blind index: the text is its
    body's, or none when the body was not opened (``sealed_ok``)."""
    record = MessageRecord(**{**row, "body": _full(row, cipher, sealed_ok)})  # marks: in the body
    if record.body.get("encrypted") is True:
        return record.model_copy(update={"text": ""})
    if isinstance(cipher, sealing.UserCipher):
        return record.model_copy(update={"text": Message.from_dict(record.body).text})
    return record


def _full(row: Any, cipher: message_rows.MessageCipher | None, sealed_ok: bool = False) -> Any:
    unopened = {"type": "message", "role": row["role"], "contents": [], "encrypted": True}
    if sealed_ok and cipher is None and isinstance(row["body"], dict) and message_rows.ENCRYPTED in row["body"]:
        return unopened
    try:
        body = message_rows.full_body(row["body"], cipher, message_id=row["message_id"], role=row["role"],
                                      author_name=row["author_name"], text=row["text"])  # fmt: skip
    except ContentSealedError:
        if not sealed_ok:
            raise
        return unopened
    return dict(message_rows.with_marks(body, message_rows.with_links(row.get("marks"), row.get("summary_of"))))


async def _change(db: Database, doing: str, session_id: str, user_id: str | None, **values: Any) -> None:
    async with db.transaction(write=True, doing=doing) as conn:
        done = await conn.execute(update(sessions_t).where(*owned(session_id, user_id)).values(**values))
    if not done.rowcount:
        raise not_found(session_id, user_id)


@tenancy.for_user
async def update_info(db: Database, session_id: str, user_id: str | None, changes: dict[str, Any]) -> None:
    values: dict[str, Any] = {"updated_at": datetime.now(UTC)}
    if "title" in changes:
        if changes["title"] is not None and (not isinstance(changes["title"], str) or len(changes["title"]) > 512):
            raise InvalidValueError("title must be a string of at most 512 characters, or None")
        values["title"] = changes["title"]
    if "metadata" in changes:
        if not isinstance(changes["metadata"], dict):
            raise InvalidValueError("metadata must be a dict")
        values["metadata"] = codec.dumps(codec.encode_state(changes["metadata"], key="metadata"), where="metadata")
    if "ttl" in changes:
        # ttl=None drops the session's own TTL: from now on it follows the store's idle_ttl (none: it never
        # expires), and its expiry is recomputed now, as a commit would; the old deadline does not linger.
        values["ttl_seconds"] = seconds = codec.check_ttl(changes["ttl"], "ttl")
        seconds = db.settings.idle_ttl_seconds if seconds is None else seconds
        values["expires_at"] = values["updated_at"] + timedelta(seconds=seconds) if seconds else None
    async with db.transaction(write=True, doing="updating a session") as conn:
        row = (await conn.execute(select(S.closed_at, S.expires_at).where(*owned(session_id, user_id)))).first()
        if row is None:
            raise not_found(session_id, user_id)
        if "ttl" in changes and row.closed_at is not None and row.expires_at is not None:
            if row.expires_at <= values["updated_at"]:
                # Closed and expired: purge closes a session it has begun to empty. A new TTL would leave it
                # half gone for good; it stays expired, and the next purge finishes it.
                raise SessionExpiredError(f"session {session_id!r} is closed and expired: its TTL can no longer change")
        await conn.execute(update(sessions_t).where(*owned(session_id, user_id)).values(**values))


@tenancy.for_user
async def close(db: Database, session_id: str, user_id: str | None) -> None:
    await _change(db, "closing a session", session_id, user_id, closed_at=datetime.now(UTC))


@tenancy.for_user
async def clear(db: Database, session_id: str, user_id: str | None, *, only: frozenset[str] | None = None) -> int:
    """Delete the session's messages (its state stays); returns how many were deleted. ``only``: refused unless
    those are the session's messages' ids, all of them (checked under the session's lock: a message written
    meanwhile is never deleted unseen)."""
    async with db.transaction(write=True, doing="clearing a session") as conn:
        if (
            await conn.execute(
                update(sessions_t)
                .where(*owned(session_id, user_id))
                .values(next_seq=0, version=S.version + 1, included_from=None)
            )
        ).rowcount == 0:
            raise not_found(session_id, user_id)
        # seq starts again at 0: earlier rewrites' values (0016) must never be put back on new messages; the
        # points on it (0017) named messages that are gone; a branch reading them would lose its history.
        if (await conn.execute(select(S.id).where(chains.branches_of(session_id)).limit(1))).first() is not None:
            raise InvalidValueError(f"session {session_id!r} has branches that read its history: delete them first")
        # A branch's history is its base's up to base_seq, which a clear of the branch cannot take: its next
        # messages would go below base_seq, where no read looks (found by an outside review).
        if (await conn.execute(select(S.base_id).where(S.id == session_id))).scalar() is not None:
            raise InvalidValueError(f"session {session_id!r} is a branch: its history is its base's; delete the "
                                    "branch, or truncate it after its base_seq")  # fmt: skip
        M = messages_t.c
        if only is not None and set((await conn.execute(select(M.message_id).where(M.session_id == session_id)))
                                    .scalars()) != only:  # fmt: skip
            raise InvalidValueError(f"session {session_id!r} holds other messages too: only its whole history goes")
        await conn.execute(delete(message_marks_t).where(message_marks_t.c.session_id == session_id))
        await cut_points(conn, session_id, None)
        return int((await conn.execute(delete(messages_t).where(messages_t.c.session_id == session_id))).rowcount)


@tenancy.for_user
async def delete_session(db: Database, session_id: str, user_id: str | None) -> bool:
    """Delete a session, and the branches that read their history through it (0017)."""
    async with db.transaction(write=True, doing="deleting a session") as conn:
        if (await conn.execute(select(S.id).where(*owned(session_id, user_id)))).first() is None:
            return False
        return bool(await delete_with_branches(conn, [session_id]))
