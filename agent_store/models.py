"""Pydantic models at the API edge: what agent_store hands back to callers."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class CommitResult(BaseModel):
    """What one committed run wrote. ``version`` is the session's version after the commit."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    run_id: str
    version: int
    messages_written: int = 0
    state_keys_written: int = 0
