"""A tool the agent can call to search the user's own past conversations (``store.search`` underneath).

``Agent(..., context_providers=[SearchHistoryProvider()])``: before each run of a stored session the provider
offers the model ``search_history(query)``, bound to the session's user (taken from the run that loaded the
session, never from the model), so the model can only ever search that user's messages; in an agent-bound
session, only the sessions that agent may open (its own and unbound ones). The current session is
left out: its messages are in the conversation already.

``SearchHistoryProvider(embeddings=store.embeddings)`` on a store opened with an embedder ranks by words and
meaning together (hybrid search): "the flight we talked about" finds "I booked a plane to Beijing".
"""

from __future__ import annotations

from typing import Any

from agent_framework import AgentSession, ContextProvider, SessionContext, tool

from agent_store.errors import InvalidValueError
from agent_store.run.commit import run_of
from agent_store.search import hybrid
from agent_store.search.vectors import Embeddings


class SearchHistoryProvider(ContextProvider):
    """Offers ``search_history(query)`` over the session user's other sessions (``limit`` hits per call)."""

    DEFAULT_SOURCE_ID = "agent_store_search"

    def __init__(self, source_id: str = DEFAULT_SOURCE_ID, *, limit: int = 5,
                 embeddings: Embeddings | None = None) -> None:  # fmt: skip
        super().__init__(source_id)
        self.limit = limit
        self.embeddings = embeddings  # a store's (store.embeddings): hybrid ranking where it has an embedder

    async def before_run(
        self, *, agent: Any, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        run = run_of(session)
        if run is None or run.user_id is None:  # nothing to scope a search to: offer nothing
            return
        db, user_id, agent_id, current, limit = run.db, run.user_id, run.agent_id, session.session_id, self.limit
        embeddings = self.embeddings if self.embeddings is not None else Embeddings(db, None)

        async def search_history(query: str) -> str:
            """Search this user's past conversations for words or phrases ("quoted"), OR, -exclusions; Chinese
            text matches inside words, and with embeddings, messages that mean what the query says. Returns the
            matching messages with their date and session."""
            try:
                page = await hybrid.search(db, embeddings, query, ranking="auto", user_id=user_id, limit=limit,
                                           exclude_session_id=current, visible_to_agent=agent_id)  # fmt: skip
            except InvalidValueError as exc:  # the model's query, not a failure of the run
                return f"invalid search: {exc}"
            lines = [f"{h.created_at:%Y-%m-%d} [{h.session_id}] {h.role}: {h.snippet}" for h in page.items]
            return "\n".join(lines) or "no earlier message matches"

        context.extend_tools(self.source_id, [tool(search_history, name="search_history")])
