"""Which messages of a history provider's save replay the stored tail, decided under the session's lock.

The framework's own providers treat a save whose messages repeat the end of the stored history (the same
``message_id``s; the same content where a message has none) as a replay and store only what follows it
(``filter_new_messages``): a request retried after a timeout, an AG-UI client resending its messages.
``StoreHistoryProvider`` saves on a plain ``AgentSession`` follow the same rule, against the tail as committed,
read inside the commit's transaction after the session row's lock (checked_commit.py): two replays racing each other are
ordered by that lock, and the second finds the first's messages.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent_framework import Message
from agent_framework._sessions import filter_new_messages
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_store.db import message_decode, message_rows
from agent_store.db.message_rows import STORE_ID, EncodedMessage
from agent_store.db.tables import messages_t

__all__ = ["as_given", "not_replayed"]


def as_given(message: Message) -> Message:
    """A stored message as its provider gave it: one that came with no id is known by its content (the store
    gave it its own id as ``id``, or before 0013 as ``message_id``), as the framework's de-duplication knows it."""
    if message.message_id is not None and message.message_id != message.additional_properties.get(STORE_ID):
        return message
    return Message(role=message.role, contents=message.contents)


async def not_replayed(
    db: AsyncConnection, session_id: str, records: Sequence[EncodedMessage], messages: dict[str, Message],
    before_seq: int, cipher: message_rows.MessageCipher | None,
) -> list[EncodedMessage]:  # fmt: skip
    """The records (of ``messages``, by store id) that do not replay the session's last messages before
    ``before_seq``: as many are read as the save holds, enough for the framework's rule."""
    m = messages_t.c
    tail = (
        select(m.message_id, m.role, m.author_name, m.text, m.body)
        .where(m.session_id == session_id, m.seq < before_seq)
        .order_by(m.seq.desc())
        .limit(len(records))
    )
    stored = [
        as_given(message_decode.message_from_row(r.body, cipher, identity=r.message_id, role=r.role,
                                        author_name=r.author_name, text=r.text))
        for r in reversed((await db.execute(tail)).all())
    ]  # fmt: skip
    # The save's messages as their provider gave them, too (the store has given each its id by now). What the
    # framework keeps is always a suffix of what it was given.
    kept = filter_new_messages(stored, [as_given(messages[r.message_id]) for r in records])
    return list(records[len(records) - len(kept) :])
