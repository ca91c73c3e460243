"""A Responses server's own store (migration 0018): what ``azure-ai-agentserver-responses`` keeps through a
``ResponseProviderProtocol`` (agent_store/agentserver/responses.py).

- ``agent_hosted_responses``: a response envelope (without its output items), partitioned by the request's user;
  ``deleted_at`` set by a delete (the row stays: later responses' history reads through it). Its history is either
  its own rows in ``agent_hosted_links`` or, when it is the end of another response's history (a chain, or a
  conversation's latest response, as the server asks for it), ``history_from`` / ``history_skip`` / ``history_len``:
  the items of that response's history, input and output, from ``history_skip``, ``history_len`` of them.
- ``agent_hosted_items``: an item (input or output), stored once per user, by its id.
- ``agent_hosted_links``: a response's items in order, by kind (``h`` its own history rows, ``i`` input, ``o`` output).

Every row is a user's: ``erase_user`` deletes them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import BigInteger, Boolean, ForeignKeyConstraint, Index, Integer, String, Table, false, func, text
from sqlalchemy.orm import Mapped, mapped_column

from agent_store.db.column_types import JsonText, UTCDateTime
from agent_store.db.schema_base import ID_MAX, Base

# A user's workflow checkpoints for one hosted workflow context (agentserver/foundry.py): the owner column is the
# user id, this, and a hash of the context id, so erase_user finds them by prefix.
CHECKPOINT_CONTEXT = "\x1fcontext:"
CONTEXT_HASH_LENGTH = 24  # hex characters of the context id's SHA-256 after it


def checkpoint_user(owner: str) -> str:
    """Whose a checkpoint collection is: a hosted workflow context's (``user`` + CHECKPOINT_CONTEXT + a hash) is its
    user's, so its saves take that user's lock and fence, seal with that user's keys (erase_user destroys them)
    and act as that user under row-level security (migration 0025); any other owner is its own."""
    tail = len(CHECKPOINT_CONTEXT) + CONTEXT_HASH_LENGTH
    if len(owner) > tail and owner[:-CONTEXT_HASH_LENGTH].endswith(CHECKPOINT_CONTEXT):
        return owner[:-tail]
    return owner


def checkpoints_of(owner: Any, user_id: str) -> Any:
    """SQL: a checkpoint owner that is the user's (``checkpoint_user`` in SQL): the user id, or one of the user's
    hosted workflow contexts (exactly the prefix and a hash, never a longer owner that only starts with it)."""
    prefix = user_id + CHECKPOINT_CONTEXT
    context = (func.substr(owner, 1, len(prefix)) == prefix) & (func.length(owner) == len(prefix) + CONTEXT_HASH_LENGTH)
    return (owner == user_id) | context


def checkpoint_binding(owner: str, workflow_name: str, checkpoint_id: str) -> str:
    """The row a checkpoint's seal binds to (db/sealing.py): its workflow and id, and a context's whole owner (one
    user's key seals all their contexts: a checkpoint moved to another of them does not open)."""
    row = "c\0" + workflow_name + "\0" + checkpoint_id
    return row if checkpoint_user(owner) == owner else row + "\0" + owner


# A reading follows at most this many pointers (agentserver/history.py): every MAX_HOPS-th response of a chain keeps
# its history as rows of its own (a window of W ids: W/MAX_HOPS links per response, amortized), so a read is bounded.
MAX_HOPS = 16


class HostedResponseRow(Base):
    __tablename__ = "agent_hosted_responses"

    user_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)  # "": a request with no user
    response_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    conversation_id: Mapped[str | None] = mapped_column(String(ID_MAX))
    previous_id: Mapped[str | None] = mapped_column(String(ID_MAX))
    status: Mapped[str | None] = mapped_column(String(64))
    envelope: Mapped[Any] = mapped_column(JsonText())  # the response, its "output" emptied (items are rows)
    history_from: Mapped[str | None] = mapped_column(String(ID_MAX))
    history_skip: Mapped[int] = mapped_column(Integer)
    history_len: Mapped[int] = mapped_column(Integer)
    created_seq: Mapped[int] = mapped_column(BigInteger)  # a conversation's order
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    transcribed: Mapped[bool] = mapped_column(Boolean, server_default=false())  # its turn is in the transcript (0028)

    __table_args__ = (
        Index("ix_agent_hosted_responses_conversation", "user_id", "conversation_id", "created_seq"),
        Index("ix_agent_hosted_responses_history_from", "user_id", "history_from"),
        Index("ix_agent_hosted_responses_untranscribed", "created_seq", postgresql_where=text("NOT transcribed"),
              sqlite_where=text("NOT transcribed")),
        {"sqlite_with_rowid": False},
    )


class HostedItemRow(Base):
    __tablename__ = "agent_hosted_items"

    user_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    item_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    type: Mapped[str | None] = mapped_column(String(64))
    body: Mapped[Any] = mapped_column(JsonText())

    __table_args__ = ({"sqlite_with_rowid": False},)


class HostedLinkRow(Base):
    __tablename__ = "agent_hosted_links"

    user_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    response_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    kind: Mapped[str] = mapped_column(String(1), primary_key=True)  # h, i, o
    pos: Mapped[int] = mapped_column(Integer, primary_key=True)
    item_id: Mapped[str] = mapped_column(String(ID_MAX))

    __table_args__ = (
        ForeignKeyConstraint(
            ["user_id", "response_id"],
            ["agent_hosted_responses.user_id", "agent_hosted_responses.response_id"],
            ondelete="CASCADE",
        ),
        {"sqlite_with_rowid": False},
    )


hosted_responses_t = cast(Table, HostedResponseRow.__table__)
hosted_items_t = cast(Table, HostedItemRow.__table__)
hosted_links_t = cast(Table, HostedLinkRow.__table__)
