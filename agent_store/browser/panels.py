"""What the transcript browser reads besides the Store's own calls: first user messages for a listing, one
session's run log and model calls, state panel, forks and its served conversation's tree, a user's workflow checkpoints.

Every read is a read-only transaction (on the replica when there is one); nothing here writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from sqlalchemy import select

from agent_store.db import chains, message_decode, message_rows, sealing
from agent_store.db.database import Database
from agent_store.db.hosted_tables import checkpoints_of
from agent_store.db.scopes import USER_PREFIX
from agent_store.db.tables import (
    app_state_t,
    checkpoints_t,
    messages_t,
    runs_t,
    sessions_t,
    state_t,
    usage_t,
    user_state_t,
)
from agent_store.errors import ContentSealedError, InvalidValueError
from agent_store.operations import branching

M, S, R, C = messages_t.c, sessions_t.c, runs_t.c, checkpoints_t.c
SEALED_TEXT = "(sealed)"  # what cannot be opened here shows as this, never as its columns hold it
_TEXT = (M.message_id, M.role, M.author_name, M.text, M.body)  # what a message's text is read from


def shown_text(row: Any, cipher: Any) -> str:
    """A message's text as the browser shows it: read as the transcript reads it (opened with its user's keys;
    a keyed store refuses a body in clear). A sealed body's ``text`` column holds its blind index, never shown."""
    if isinstance(row.body, dict) and message_rows.ENCRYPTED in row.body and cipher is None:
        return SEALED_TEXT  # (this browser has no keys)
    try:
        return message_decode.message_from_row(row.body, cipher, identity=row.message_id, role=row.role,
                                               author_name=row.author_name, text=row.text).text  # fmt: skip
    except ContentSealedError:  # a key gone, content moved or put there in clear
        return SEALED_TEXT


def shown_value(cipher: Any, key: str, value: Any) -> tuple[Any, bool]:
    """A state value as the browser shows it, and whether it is shown: opened with its user's keys if sealed;
    refused in clear when the store has keys (as ``load`` refuses it)."""
    opener = cipher if isinstance(cipher, sealing.UserCipher) else None
    try:
        return sealing.open_json(opener, sealing.state_row(key), value)[0], True
    except (ContentSealedError, InvalidValueError):  # (InvalidValueError: sealed, and this browser has no keys)
        return None, False


async def first_user_texts(db: Database, sessions: list[tuple[str, str | None]]) -> dict[str, str]:
    """Each session's first user message (what a listing shows when a session has no title), by (id, user)."""
    found: dict[str, Any] = {}  # one short indexed read per session of the page (a page is at most 100)
    async with db.transaction(write=False, replica=True, doing="reading first messages") as conn:
        for sid, _ in sessions:
            query = select(*_TEXT).where(M.session_id == sid, M.role == "user").order_by(M.seq).limit(1)
            if (row := (await conn.execute(query)).first()) is not None:
                found[sid] = row
    users = {user for sid, user in sessions if sid in found}
    ciphers = {user: await sealing.cipher_for(db, user) for user in users}
    return {sid: shown_text(found[sid], ciphers[user]) for sid, user in sessions if sid in found}


async def session_panels(db: Database, session_id: str, user_id: str | None, app_id: str) -> dict[str, Any]:
    """The run log (by run id), the state rows of the session, its user and its app, and its branches."""
    async with db.transaction(write=False, replica=True, doing="reading a session's panels") as conn:
        runs = (await conn.execute(select(runs_t).where(R.session_id == session_id).order_by(R.version))).all()
        own = (await conn.execute(select(state_t).where(state_t.c.session_id == session_id).order_by("key"))).all()
        user: Sequence[Any] = []
        if user_id is not None:
            u = user_state_t.c
            user = (await conn.execute(select(user_state_t).where(u.user_id == user_id).order_by(u.key))).all()
        a = app_state_t.c
        app = (await conn.execute(select(app_state_t).where(a.app_id == app_id).order_by(a.key))).all()
        branches = (await conn.execute(select(S.id, S.forked_at_seq).where(S.forked_from == session_id))).all()
    cipher = await sealing.cipher_for(db, user_id)
    return {
        "runs": {r.run_id: r._mapping for r in runs},
        "calls": await run_calls(db, session_id),
        "state": [("", r.key, *shown_value(cipher, r.key, r.value)) for r in own]
        + [("user:", r.key, *shown_value(cipher, USER_PREFIX + r.key, r.value)) for r in user]
        + [("app:", r.key, r.value, True) for r in app],  # (app: state is the app's: never sealed)
        "branches": [(b.id, b.forked_at_seq) for b in branches],
        "tree": await conversation_tree(db, session_id, user_id),
    }


async def conversation_tree(db: Database, session_id: str, user_id: str | None) -> list[Any]:
    """The served conversation (0017) the session is part of, from its root down (each session once, with its
    response ids); empty for a session with no base and no branch."""
    async with db.transaction(write=False, replica=True, doing="reading a conversation tree") as conn:
        chain = await chains.chain_of(conn, session_id)
        below = (await conn.execute(select(S.id).where(chains.branches_of(session_id)).limit(1))).first()
    if len(chain) < 2 and below is None:
        return []
    nodes: dict[str, dict[str, Any]] = {}
    for node in await branching.tree(db, chain[-1].id, user_id):
        entry = nodes.setdefault(node.session_id, {"node": node, "responses": []})
        if node.response_id is not None:
            entry["responses"].append((node.response_id, node.seq_end))
    return list(nodes.values())


async def run_calls(db: Database, session_id: str) -> dict[str, list[Any]]:
    """The session's model calls from the usage ledger, by run id, in call order."""
    U = usage_t.c
    async with db.transaction(write=False, replica=True, doing="reading a session's model calls") as conn:
        found = await conn.execute(
            select(U.run_id, U.call_no, U.purpose, U.model, U.input_tokens, U.output_tokens, U.latency_ms,
                   U.finish_reason, U.streamed, U.trace_id, U.span_id)
            .where(U.session_id == session_id).order_by(U.run_id, U.call_no)
        )  # fmt: skip
        calls: dict[str, list[Any]] = {}
        for row in found:
            calls.setdefault(row.run_id, []).append(row)
    return calls


async def user_checkpoints(db: Database, user_id: str | None, limit: int = 20) -> list[Any]:
    """The user's newest workflow checkpoints (payloads are not read: they may hold pickled objects)."""
    owner = user_id or ""  # checkpoints saved without a user are stored under ''
    columns = (C.workflow_name, C.seq, C.checkpoint_id, C.previous_checkpoint_id, C.iteration_count, C.saved_at)
    async with db.transaction(write=False, replica=True, doing="reading workflow checkpoints") as conn:
        mine = checkpoints_of(C.user_id, owner)  # (their hosted workflow contexts' too)
        query = select(*columns).where(mine).order_by(C.saved_at.desc(), C.seq.desc()).limit(limit)
        return list((await conn.execute(query)).all())


async def summarized(
    db: Database, session_id: str, user_id: str | None, summary_ids: Sequence[str]
) -> dict[str, list[Any]]:
    """For each summary (by store id), the messages it replaced: (seq, role, text), in the session's order."""
    if not summary_ids:
        return {}
    found: dict[str, list[Any]] = {}
    async with db.transaction(write=False, replica=True, doing="reading summarized messages") as conn:
        query = (
            select(M.summarized_by, M.seq, *_TEXT)
            .where(M.session_id == session_id, M.summarized_by.in_(list(summary_ids)))
            .order_by(M.seq)
        )
        rows = (await conn.execute(query)).all()
    cipher = await sealing.cipher_for(db, user_id)
    for row in rows:
        found.setdefault(row.summarized_by, []).append(SimpleNamespace(seq=row.seq, role=row.role,
                                                                       text=shown_text(row, cipher)))  # fmt: skip
    return found
