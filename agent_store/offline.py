"""A deterministic chat client that needs no network: for the demo, the tests and the benchmarks.

It is built on the framework's own client layers (chat middleware, function invocation, telemetry), so an
``Agent`` drives it exactly as it drives a hosted model. Its answers come only from the messages it is
given, which is what makes it a test of persistence: it can name the user only if the history reached it.

- "我叫李明" / "my name is Ann"       -> a greeting that repeats the name
- "我叫什么名字？" / "what is my name?" -> the name found in earlier user messages, or "I don't know"
- instructions mentioning 翻译/translat -> "[译] <text>";  摘要/summar -> "摘要：<its first words>…"
- a user message "call <tool>" with that tool offered -> a function call, then a reply with its result
- "search <words>" / "搜索 <words>" with a ``search_history`` tool offered -> search_history(query=<words>)
- a name told while a ``remember`` tool is offered -> remember(key="name", value=<name>), then the greeting
- asked the name with none in the history -> the name from remembered facts in the instructions ("- name: X")

Like a hosted model API, it refuses a request whose tool history is invalid (a function result without its
call, or a call without its result): that is what makes a stored, interrupted tool loop a visible failure.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from typing import Any

from agent_framework import (
    BaseChatClient,
    ChatMiddlewareLayer,
    ChatResponse,
    ChatResponseUpdate,
    Content,
    FunctionInvocationLayer,
    Message,
    ResponseStream,
    UsageDetails,
)
from agent_framework.observability import ChatTelemetryLayer

_TELL = re.compile(r"(?:我叫(?!什么)|my name is\s+(?!what))([^\s，。,.!！?？]+)", re.IGNORECASE)
_ASK = re.compile(r"我叫什么|what(?:'s| is) my name", re.IGNORECASE)
_REMEMBERED = re.compile(r"^- name: (\S+)$", re.MULTILINE)  # MemoryProvider's instructions
_CALL = re.compile(r"\bcall (\w+)", re.IGNORECASE)
_SEARCH = re.compile(r"^(?:search(?: for)?|搜索|查找)\s*[:：]?\s*(.+)$", re.IGNORECASE)


def answer(messages: Sequence[Message], instructions: str = "") -> str:
    """The reply text for a conversation, computed only from what is passed in."""
    users = [m.text or "" for m in messages if m.role == "user"]
    last = users[-1] if users else ""
    if _ASK.search(last):
        names = [found.group(1) for text in users[:-1] for found in _TELL.finditer(text)]
        names = names or _REMEMBERED.findall(instructions)
        return f"你叫{names[-1]}。" if names else "我不知道你叫什么名字。"
    if told := _TELL.search(last):
        return f"你好，{told.group(1)}！很高兴认识你。"
    latest = messages[-1].text if messages else ""
    if "翻译" in instructions or "translat" in instructions.lower():
        return f"[译] {latest}"
    if "摘要" in instructions or "summar" in instructions.lower():
        return f"摘要：{_abridged(latest, 20)}"
    return f"收到：{last}（第 {len(users)} 条用户消息）"


def _abridged(text: str, limit: int) -> str:
    """The text's start, within ``limit`` characters and cut between words, with "…" where it was cut."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    return (cut[: cut.rfind(" ")] if " " in cut else cut).rstrip() + "…"


class OfflineChatClient(
    # The order the framework's own clients use: the function loop outside, chat middleware per model call.
    FunctionInvocationLayer[Any],
    ChatMiddlewareLayer[Any],
    ChatTelemetryLayer[Any],
    BaseChatClient[Any],
):
    """Offline, deterministic stand-in for a hosted chat model (see the module docstring)."""

    OTEL_PROVIDER_NAME = "agent_store.offline"

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Awaitable[ChatResponse] | ResponseStream[ChatResponseUpdate, ChatResponse]:
        check_request(messages)
        reply = self._reply(messages, options)
        if stream:
            return self._build_response_stream(self._stream(reply))

        async def respond() -> ChatResponse:
            return ChatResponse(messages=[reply], usage_details=_usage(messages, reply))

        return respond()

    def _reply(self, messages: Sequence[Message], options: Mapping[str, Any]) -> Message:
        tools = {getattr(tool, "name", None) for tool in options.get("tools") or []}
        instructions = str(options.get("instructions") or "")
        last = messages[-1] if messages else None
        if last is not None and last.role == "tool":
            called = {c.call_id: c.name for m in messages for c in m.contents if c.type == "function_call"}
            results = [c for c in last.contents if c.type == "function_result"]
            if all(called.get(c.call_id) == "remember" for c in results):
                return Message(role="assistant", contents=[answer(messages, instructions)])
            return Message(role="assistant", contents=[f"工具结果：{', '.join(str(c.result) for c in results)}"])
        text = (last.text or "") if last is not None and last.role == "user" else ""
        if (call := _CALL.search(text)) and call.group(1) in tools:
            return _call(call.group(1), {})
        if (asked := _SEARCH.search(text.strip())) and "search_history" in tools:
            return _call("search_history", {"query": asked.group(1)})
        if (told := _TELL.search(text)) and "remember" in tools:
            return _call("remember", {"key": "name", "value": told.group(1)})
        return Message(role="assistant", contents=[answer(messages, instructions)])

    async def _stream(self, reply: Message) -> AsyncIterator[ChatResponseUpdate]:
        if reply.text:
            for piece in re.findall(r".{1,4}", reply.text, flags=re.S):
                yield ChatResponseUpdate(role="assistant", contents=[Content.from_text(piece)])
        else:
            yield ChatResponseUpdate(role="assistant", contents=list(reply.contents))


class InvalidRequestError(ValueError):
    """What a hosted API answers with HTTP 400: the request's tool history is not valid."""


def check_request(messages: Sequence[Message]) -> None:
    """Every function result follows its call, and every call is answered before the request ends."""
    open_calls: set[str] = set()
    for message in messages:
        for content in message.contents:
            if content.type == "function_call" and content.call_id:
                open_calls.add(content.call_id)
            elif content.type == "function_result" and content.call_id:
                if content.call_id not in open_calls:
                    raise InvalidRequestError(f"a function result for {content.call_id!r} without its call")
                open_calls.discard(content.call_id)
    if open_calls:
        raise InvalidRequestError(f"function calls {sorted(open_calls)} have no result")


def _call(name: str, arguments: dict[str, Any]) -> Message:
    call_id = f"call_{uuid.uuid4().hex[:8]}"
    return Message(
        role="assistant", contents=[Content.from_function_call(call_id=call_id, name=name, arguments=arguments)]
    )


def _usage(messages: Sequence[Message], reply: Message) -> UsageDetails:
    prompt = sum(len(m.text or "") for m in messages)
    return UsageDetails(
        input_token_count=prompt,
        output_token_count=len(reply.text or ""),
        total_token_count=prompt + len(reply.text or ""),
    )
