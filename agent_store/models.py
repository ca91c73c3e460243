"""Pydantic models at the API edge: what agent_store hands back to callers."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, computed_field, field_validator


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class CommitResult(_Model):
    """What one committed run wrote. ``version`` is the session's version after the commit."""

    session_id: str
    run_id: str
    version: int
    messages_written: int = 0
    state_keys_written: int = 0
    messages_rewritten: int = 0  # stored messages whose compaction marks or place this commit changed


class SessionInfo(_Model):
    """One session as listings show it."""

    id: str
    user_id: str | None
    agent_id: str | None
    title: str | None
    metadata: dict[str, Any]
    message_count: int
    version: int
    created_at: datetime
    updated_at: datetime
    last_run_at: datetime | None
    closed_at: datetime | None
    expires_at: datetime | None
    forked_from: str | None = None  # Store.fork: the session this one was branched from ...
    forked_at_seq: int | None = None  # ... and the last message it copied

    @computed_field  # type: ignore[prop-decorator]
    @property
    def status(self) -> Literal["active", "closed", "expired"]:
        """As ``list_sessions(status=...)`` filters: closed wins; expired once its idle TTL ran out."""
        if self.closed_at is not None:
            return "closed"
        return "expired" if self.expires_at is not None and self.expires_at <= datetime.now(UTC) else "active"


class SessionPage(_Model):
    """A page of sessions, newest first; pass ``next_cursor`` back for the next page (None: no more)."""

    items: list[SessionInfo]
    next_cursor: str | None


class MessageRecord(_Model):
    """One stored message; ``body`` is its ``Message.to_dict()`` (``agent_framework.Message.from_dict`` rebuilds it)."""

    session_id: str
    seq: int
    message_id: str
    run_id: str
    role: str
    author_name: str | None
    text: str
    created_at: datetime
    body: dict[str, Any]  # with its compaction marks in additional_properties, as the framework left them
    # Compaction (see docs/seams.md): left out of what the model sees, why, by which summary (its message_id), and
    # its place in the framework's list where that is not its seq's (pos; the order is coalesce(pos, seq << 32)).
    excluded: bool = False
    exclude_reason: str | None = None
    summarized_by: str | None = None
    pos: int | None = None


class SearchHit(_Model):
    """One message that matched a search: where it is, who said it, and the text around the match."""

    session_id: str
    seq: int
    role: str
    author_name: str | None
    created_at: datetime
    title: str | None  # the session's
    user_id: str | None = None  # the session's owner (a search across users finds any)
    snippet: str  # up to ~120 characters around the first match ("…" where cut)
    marks: list[tuple[int, int]]  # (start, end) of each match within ``snippet``
    rank: int  # how many of the query's terms the message holds
    excluded: bool = False  # a compaction left it out of what the model sees
    summarized_by: str | None = None  # the store id (agent_messages.message_id) of the summary that replaced it
    similarity: float | None = None  # cosine similarity to the query, where it was ranked by meaning too
    score: float | None = None  # hybrid ranking: its reciprocal rank fusion score (search/hybrid.py)


class SearchPage(_Model):
    """A page of hits, best first; pass ``next_cursor`` back for the next page (None: no more)."""

    items: list[SearchHit]
    next_cursor: str | None
    # What ranked the page: "keyword", "vector" or "hybrid". Hybrid asked of a store with no vectors yet is
    # "keyword" (the backfill has not run): the caller can say so rather than pass words off as meaning.
    ranking: str = "keyword"


class TreeNode(_Model):
    """One session of a conversation tree (migration 0017) and one response id on it, if any: the session's depth
    below the tree's root, where its own history begins (``base_seq``: before it, ``base_id``'s), the response
    id, the point it continued from (``parent_id``), and the seq after its last message (``seq_end``)."""

    depth: int
    session_id: str
    base_id: str | None
    base_seq: int | None
    response_id: str | None
    parent_id: str | None
    seq_end: int | None


class ErasureReport(_Model):
    """What ``erase_user`` removed."""

    user_id: str
    sessions: int
    messages: int
    state_rows: int
    user_state_rows: int
    checkpoints: int = 0  # workflow checkpoints saved with this user_id
    usage_calls: int = 0  # usage-ledger rows (model calls) of the user's sessions
    hosted_responses: int = 0  # a Responses server's responses of the user (agent_store.agentserver, 0018)
    batches: int = 0  # transactions it took (the last one deletes the user's own rows and leaves the fence)
    keys_destroyed: int = 0  # the user's data keys shredded (a store with per-user keys, agent_store/keys.py)


class TransferReport(_Model):
    """What an import did: sessions written, and sessions skipped because they exist already."""

    imported: int
    skipped: int
    checkpoints: int = 0  # workflow checkpoints written (those whose id existed are skipped)
    hosted_responses: int = 0  # a Responses server's responses written (those there already are skipped)


class UsageLine(_Model):
    """One line of a usage report: the calls of one user, agent, model, day or session over the period."""

    key: str | None  # the user id, agent name, model, UTC date (YYYY-MM-DD) or session id; None: not known
    calls: int
    input_tokens: int | None
    output_tokens: int | None
    total_tokens: int | None
    cache_read_input_tokens: int | None
    reasoning_output_tokens: int | None
    cost: float | None  # from agent_usage_prices; None unless every call of the line has a price

    @field_validator("cost")
    @classmethod
    def _no_float_noise(cls, cost: float | None) -> float | None:
        """To a billionth of the price's unit: a sum of per-token products prints 0.00069, not 0.0006900000000000001."""
        return None if cost is None else round(cost, 9)


class BudgetInfo(_Model):
    """A token budget and its use in the current period (``store.usage.budget``)."""

    scope: Literal["user", "app"]
    subject: str  # the user id, or the app id
    period: Literal["day", "month", "total"]
    token_limit: int
    used: int  # in the current period
    period_start: datetime
    crossed_by_run: str | None  # the run whose commit reached the limit in this period
    crossed_at: datetime | None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def exceeded(self) -> bool:
        """Whether the next run is refused at load."""
        return self.used >= self.token_limit
