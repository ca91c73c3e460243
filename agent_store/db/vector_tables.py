"""Message embeddings (migration 0023): what hybrid search ranks by meaning (agent_store/search/vectors.py).

- ``agent_embedding_profiles``: one row per embedding space: the model, its dimensions, a version and the
  quantization, named together (``name``). A vector is only ever compared with a query embedded in its own
  profile; a store whose embedder is in another profile is refused, not answered.
- ``agent_message_vectors``: a message's vector in one profile, 4 bits a dimension (128 bytes at 256
  dimensions). Its key is the message's, and the foreign key deletes it with the message: erased, purged,
  deleted or truncated messages leave no vector behind. A trigger deletes it when the message's text changes,
  so a backfill embeds the new text.

Rows are written by a backfill pass, never by a run's commit (the hot path has no model call in it).
"""

from __future__ import annotations

from datetime import datetime
from typing import cast

from sqlalchemy import ForeignKeyConstraint, Integer, LargeBinary, String, Table
from sqlalchemy.orm import Mapped, mapped_column

from agent_store.db.column_types import UTCDateTime
from agent_store.db.schema_base import ID_MAX, Base


class EmbeddingProfileRow(Base):
    __tablename__ = "agent_embedding_profiles"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)  # search/vectors.py: profile_key
    name: Mapped[str] = mapped_column(String(ID_MAX), unique=True)  # model/dimensions/version/quantization
    model: Mapped[str] = mapped_column(String(ID_MAX))
    dimensions: Mapped[int] = mapped_column(Integer)
    version: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class MessageVectorRow(Base):
    __tablename__ = "agent_message_vectors"

    session_id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    profile_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    vec: Mapped[bytes] = mapped_column(LargeBinary)  # 4-bit codes, two a byte (search/embedders.py: pack)

    __table_args__ = (
        ForeignKeyConstraint(["session_id", "seq"], ["agent_messages.session_id", "agent_messages.seq"],
                             ondelete="CASCADE"),
        ForeignKeyConstraint(["profile_id"], ["agent_embedding_profiles.id"], ondelete="CASCADE"),
        {"sqlite_with_rowid": False},
    )


profiles_t = cast(Table, EmbeddingProfileRow.__table__)
vectors_t = cast(Table, MessageVectorRow.__table__)
