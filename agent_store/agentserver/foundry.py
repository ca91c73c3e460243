"""The stores ``agent-framework-foundry-hosting``'s ``ResponsesHostServer`` takes, on the store's tables:

    ResponsesHostServer(agent, response_store=StoreResponseProvider(store),
                        agent_session_store_provider=StoreSessionStoreProvider(store),
                        checkpoint_store_provider=StoreCheckpointStoreProvider(store))

Its defaults keep sessions and checkpoints in Foundry's hosted state store (ETags against lost updates); these
keep them in the store's database, per request user: sessions through :class:`StoreSessionStore` (response ids
as points that never change, conversation ids as heads under the conflict check), checkpoints through
:class:`StoreCheckpointStorage`, one collection per workflow context (its id hashed, as the package's own store
names it). On a hosted server the user is the platform's trusted identity (``FoundryRequestScope``, which refuses
a request without one); locally it is the ``x-agent-user-id`` header, or none.
"""

from __future__ import annotations

import hashlib
from typing import Any

from agent_framework import AgentSession, CheckpointStorage, SessionStore
from agent_framework_foundry_hosting import AgentSessionStoreProvider, CheckpointStoreProvider, FoundryRequestScope

from agent_store.agent_framework import StoreCheckpointStorage, StoreSessionStore
from agent_store.db.hosted_tables import CHECKPOINT_CONTEXT, CONTEXT_HASH_LENGTH
from agent_store.errors import ConflictError, InvalidValueError
from agent_store.store import Store

__all__ = ["ConversationSessionStore", "StoreCheckpointStoreProvider", "StoreSessionStoreProvider", "request_user"]


def request_user(config: Any, platform_context: Any) -> str | None:
    """The user a request's state belongs to: the trusted platform identity when hosted, else the header's."""
    if config.is_hosted:
        return FoundryRequestScope.from_context(config, platform_context).user_id
    return platform_context.user_id or None


_SOURCE_CONVERSATION = "_foundry_source_conversation"  # the host's state key: the conversation a session serves
_ADVANCED = "Another request advanced this agent session; reload before writing."  # the host's public conflict


class ConversationSessionStore(StoreSessionStore):
    """:class:`StoreSessionStore` as ResponsesHostServer uses it: each request's session is set under its response
    id (a point) and, in a conversation, under the conversation id too, which names the head and moves with it. A
    conflict is the host's own conflict error, which it shows the caller as such."""

    def names_head(self, key: str, session: AgentSession) -> bool:
        # The host's mark, or a key it loaded by and found nothing under (a conversation's first turn claims its
        # id before the agent runs: a response id that is not found ends the request instead).
        return key == session.state.get(_SOURCE_CONVERSATION) or self._absent.earliest(key) is not None

    def claims(self, key: str, session: AgentSession) -> str | None:
        # A conversation's first turn, set under its response id first: it takes the conversation id in the same
        # commit, so of two requests starting one conversation, the second conflicts having written nothing.
        conversation = session.state.get(_SOURCE_CONVERSATION)
        if isinstance(conversation, str) and conversation != key and self._absent.earliest(conversation) is not None:
            return conversation
        return None

    async def set(self, session_id: str, session: AgentSession) -> None:
        try:
            await super().set(session_id, session)
        except ConflictError as exc:
            raise RuntimeError(_ADVANCED) from exc


class StoreSessionStoreProvider(AgentSessionStoreProvider):
    """Agent sessions in the store (one :class:`StoreSessionStore` per request, for the request's user)."""

    def __init__(self, store: Store, *, history_limit: int | None = None) -> None:
        super().__init__()
        self.store, self.history_limit = store, history_limit

    def get_store(self, *, config: Any, platform_context: Any) -> SessionStore:
        user = request_user(config, platform_context)
        return ConversationSessionStore(self.store, user_id=user, history_limit=self.history_limit)


class StoreCheckpointStoreProvider(CheckpointStoreProvider):
    """Workflow checkpoints in the store, one collection per user and workflow context."""

    def __init__(self, store: Store, *, allowed_checkpoint_types: list[str] | None = None) -> None:
        super().__init__(allowed_checkpoint_types=allowed_checkpoint_types)
        self.store = store

    def get_store(self, *, config: Any, context_id: str, platform_context: Any) -> CheckpointStorage:
        if not context_id:
            raise ValueError("context_id must be provided to get a checkpoint store.")
        return self._for(request_user(config, platform_context), context_id)

    def get_store_for_scope(self, *, scope: Any, context_id: str, platform_context: Any) -> CheckpointStorage:
        return self._for(scope.user_id if scope is not None else platform_context.user_id or None, context_id)

    def _for(self, user: str | None, context_id: str) -> CheckpointStorage:
        if user is not None and "\x1f" in user:  # a user id that could name another user's collection: refused
            raise InvalidValueError("a request's user id must not contain the character \\x1f")
        digest = hashlib.sha256(context_id.encode()).hexdigest()[:CONTEXT_HASH_LENGTH]
        collection = f"{user or ''}{CHECKPOINT_CONTEXT}{digest}"
        return StoreCheckpointStorage(self.store, user_id=collection,
                                      allowed_checkpoint_types=self._allowed_checkpoint_types)  # fmt: skip
