"""The middleware `StoreHistoryProvider` installs for one run: what happens at the model call and at a tool.

- ``ContinueLocally`` (chat): the service forgot a service-kept conversation -> send the local transcript.
- ``ResultSizeGuard`` (function): a tool result too big to store stops the run before the model sees it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from agent_framework import (
    AgentSession,
    ChatContext,
    ChatMiddleware,
    ChatResponse,
    Content,
    FunctionInvocationContext,
    FunctionMiddleware,
    Message,
    ResponseStream,
)
from agent_framework._middleware import MiddlewareFailure

from agent_store.db import codec, message_rows
from agent_store.errors import InvalidValueError

logger = logging.getLogger("agent_store")
# What the model would get from the store for a session without a service-side conversation.
LocalHistory = Callable[[AgentSession], Awaitable[list[Message]]]


def service_keeps_history(agent: Any) -> bool:
    """Whether this agent's client keeps the conversation on the service (the framework's own rule, at agent level)."""
    store = (getattr(agent, "default_options", None) or {}).get("store")
    return bool(store if store is not None else getattr(getattr(agent, "client", None), "STORES_BY_DEFAULT", False))


def _forgotten(exc: BaseException) -> bool:
    """The service answered that it does not know the conversation (an expired or deleted stored response)."""
    text = " ".join(str(e) for e in (exc, exc.__cause__) if e is not None).lower()
    return "not found" in text and (
        "previous response" in text or "previous_response" in text or "conversation" in text
    )


class ContinueLocally(ChatMiddleware):
    """Chat middleware: if the service has forgotten the conversation, send the local transcript and start anew.

    One instance serves one run, so it also keeps what this run already exchanged with the service (the input,
    tool calls and results of earlier steps of a tool loop): a conversation forgotten in the middle of a tool
    loop continues with the stored transcript, then those, then the request that failed (pairs kept whole).
    """

    def __init__(
        self, local_history: Callable[[AgentSession], Awaitable[list[Message]]], session: AgentSession
    ) -> None:
        self.local_history, self.session = local_history, session
        self.exchanged: list[Message] = []

    async def process(self, context: ChatContext, call_next: Callable[[], Awaitable[None]]) -> None:
        sent = list(context.messages)
        try:
            await call_next()
        except Exception as exc:
            if not _forgotten(exc):
                raise
            await self._send_local_transcript(context, sent)
            await call_next()
        if context.stream and isinstance(context.result, ResponseStream):
            context.result = self._restartable(context, call_next, sent, context.result)
        elif isinstance(context.result, ChatResponse):
            self.exchanged += [*sent, *context.result.messages]

    async def _send_local_transcript(self, context: ChatContext, sent: list[Message]) -> None:
        logger.warning("the service no longer knows conversation %r: continuing from the local transcript",
                       self.session.service_session_id)  # fmt: skip
        history = await self.local_history(self.session)
        context.messages = [*history, *self.exchanged, *sent]
        context.options = {**(context.options or {}), "conversation_id": None}

    def _restartable(
        self,
        context: ChatContext,
        call_next: Callable[[], Awaitable[None]],
        sent: list[Message],
        first: ResponseStream[Any, Any],
    ) -> ResponseStream[Any, Any]:
        """A streamed request fails only when its first update is pulled: restart it there, before anything
        reached the caller, and finish with the final response of the stream that was actually consumed."""
        used = [first]

        async def updates() -> AsyncIterator[Any]:
            try:
                async for update in first:
                    yield update
                return
            except Exception as exc:
                if first.updates or not _forgotten(exc):  # updates already went out: not ours to restart
                    raise
            await self._send_local_transcript(context, sent)
            await call_next()
            assert isinstance(context.result, ResponseStream)
            used.append(context.result)
            async for update in context.result:
                yield update

        async def final(_: Sequence[Any]) -> Any:
            response = await used[-1].get_final_response()
            self.exchanged += [*sent, *response.messages]
            return response

        return ResponseStream(updates(), finalizer=final)


class ToolResultTooLargeError(InvalidValueError, MiddlewareFailure):
    """A tool returned more than the store keeps in one message (``max_value_bytes``); the run stops there.

    Also a ``MiddlewareFailure``: the framework's tool loop lets it end the run instead of handing the model an
    error result, so the caller sees it before any reply, and nothing of the run is stored.
    """

    def __init__(self, message: str) -> None:
        InvalidValueError.__init__(self, message)


# What the stored message adds around a result (its ids, the store's id, the real call id, provider data):
# the guard refuses a result within this many bytes of the limit, so it never lets through one the commit refuses.
HEADROOM = 1024


class ResultSizeGuard(FunctionMiddleware):
    """Function middleware: refuse a tool result the store could not keep, before the model sees it."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes

    async def process(self, context: FunctionInvocationContext, call_next: Callable[[], Awaitable[None]]) -> None:
        await call_next()
        name = getattr(context.function, "name", "?")
        content = Content.from_function_result(call_id="size-check", result=context.result)
        body = message_rows.compact_body(Message(role="tool", contents=[content]).to_dict())
        size = len(codec.dumps(body, where=f"tool {name!r}", max_bytes=2**62).encode()) + HEADROOM
        if size > self.max_bytes:
            raise ToolResultTooLargeError(
                f"tool {name!r} returned about {size} bytes as a stored message, over the limit of {self.max_bytes} "
                "(Store max_value_bytes); nothing of this run is stored: return less (e.g. a truncated result)"
            )
