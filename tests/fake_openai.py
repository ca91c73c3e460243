"""A small OpenAI-compatible server on 127.0.0.1 for the real OpenAI clients: Chat Completions, Responses and
Embeddings (the offline wordllama model's vectors).

It checks requests the way the service does (a tool result needs its call, a call needs its result before
the conversation goes on, ``previous_response_id`` must be a response it stored) and answers with the
offline client's deterministic replies, so a test can tell what history reached the model. Standard library
only; one thread per request. ``same_completion_id`` makes every completion reuse one id (servers with short
random ids do collide); ``forget()`` drops every stored response (stored responses expire at the service);
``forget_before_tool_results`` does so once, when the next tool result arrives (in the middle of a tool loop).
"""

from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agent_framework import Message

from agent_store.offline import answer

_ids = itertools.count(1)


def _new_id(prefix: str) -> str:
    return f"{prefix}_{next(_ids):06d}"


class Invalid(Exception):
    """The request is one the service would refuse with HTTP 400."""


def _check_pairs(turns: list[tuple[str, str | None, str | None]]) -> None:
    """turns: (kind, call_id, text) with kind user/assistant/call/result, in order."""
    open_calls: list[str] = []
    for kind, call_id, _ in turns:
        if kind == "call":
            open_calls.append(call_id or "")
        elif kind == "result":
            if call_id not in open_calls:
                raise Invalid(f"No tool call found for function call output with call_id {call_id}.")
            open_calls.remove(call_id)
        elif open_calls and kind == "user":
            raise Invalid(f"An assistant message with 'tool_calls' must be followed by tool messages: {open_calls}")
    if open_calls:
        raise Invalid(f"tool_calls {open_calls} have no tool message responding to them")


def _reply(turns: list[tuple[str, str | None, str | None]], tools: list[str], instructions: str) -> tuple[str, Any]:
    """('text', str) or ('call', (call_id, name)), from the conversation as the model sees it."""
    if turns and turns[-1][0] == "result":
        return "text", "工具结果：" + ", ".join(t or "" for k, _, t in turns if k == "result")
    messages = [Message(role="user" if k == "user" else "assistant", contents=[t or ""]) for k, _, t in turns
                if k in ("user", "assistant")]  # fmt: skip
    last = messages[-1].text if messages and messages[-1].role == "user" else ""
    for tool in tools:
        if f"call {tool}" in (last or ""):
            return "call", (_new_id("call"), tool)
    return "text", answer(messages, instructions)


class FakeOpenAI:
    def __init__(self, *, same_completion_id: bool = False) -> None:
        self.same_completion_id = same_completion_id
        self.responses: dict[str, list[tuple[str, str | None, str | None]]] = {}
        self.requests: list[dict[str, Any]] = []
        self.refused: list[str] = []
        self.forget_before_tool_results = False
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def forget(self) -> None:
        self.responses.clear()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append({"path": self.path, **body})
                try:
                    if self.path.endswith("/chat/completions"):
                        fake._chat(self, body)
                    elif self.path.endswith("/responses"):
                        fake._responses(self, body)
                    elif self.path.endswith("/embeddings"):
                        fake._embeddings(self, body)
                    else:
                        self.send_error(404)
                except Invalid as exc:
                    fake.refused.append(str(exc))
                    error = {"error": {"message": str(exc), "type": "invalid_request_error", "code": None}}
                    _send_json(self, error, status=400)

        return Handler

    # ---- Embeddings: the offline wordllama model's vectors, as the service sends them -----------------------

    def _embeddings(self, http: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        import asyncio

        from agent_store.search.embedders import WordLlamaEmbedder

        texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
        if not hasattr(FakeOpenAI, "_embedder"):
            FakeOpenAI._embedder = WordLlamaEmbedder()  # type: ignore[attr-defined]
        vectors = asyncio.run(FakeOpenAI._embedder.embed(texts))  # type: ignore[attr-defined]
        data = [{"object": "embedding", "index": i, "embedding": [float(x) for x in v]} for i, v in enumerate(vectors)]
        _send_json(http, {"object": "list", "data": data, "model": body.get("model", "fake"),
                          "usage": {"prompt_tokens": len(texts), "total_tokens": len(texts)}})  # fmt: skip

    # ---- Chat Completions --------------------------------------------------------------------------------

    def _chat(self, http: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        turns: list[tuple[str, str | None, str | None]] = []
        instructions = ""
        for m in body["messages"]:
            text = m.get("content") if isinstance(m.get("content"), str) else _joined(m.get("content"))
            if m["role"] == "system":
                instructions += text or ""
            elif m["role"] == "tool":
                turns.append(("result", m.get("tool_call_id"), text))
            else:
                turns.append((m["role"], None, text))
                turns += [("call", c["id"], None) for c in m.get("tool_calls") or []]
        _check_pairs(turns)
        tools = [t["function"]["name"] for t in body.get("tools") or []]
        kind, value = _reply(turns, tools, instructions)
        completion_id = "chatcmpl-same" if self.same_completion_id else _new_id("chatcmpl")
        usage = {
            "prompt_tokens": 10 + len(turns),
            "completion_tokens": 5,
            "total_tokens": 15 + len(turns),
            "prompt_tokens_details": {"cached_tokens": 3},
            "completion_tokens_details": {"reasoning_tokens": 2},
        }
        message: dict[str, Any] = {"role": "assistant", "content": value if kind == "text" else None}
        if kind == "call":
            call = {"id": value[0], "type": "function", "function": {"name": value[1], "arguments": "{}"}}
            message["tool_calls"] = [call]
        finish = "tool_calls" if kind == "call" else "stop"
        base = {"id": completion_id, "created": 1, "model": body["model"]}
        if not body.get("stream"):
            choice = {"index": 0, "message": message, "finish_reason": finish}
            _send_json(http, {**base, "object": "chat.completion", "choices": [choice], "usage": usage})
            return
        chunks = [{"role": "assistant", "content": piece} for piece in _pieces(value)] if kind == "text" else [
            {"role": "assistant", "tool_calls": [{"index": 0, **message["tool_calls"][0]}]}
        ]  # fmt: skip
        chunk = {**base, "object": "chat.completion.chunk"}
        events = [{**chunk, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in chunks]
        events.append({**base, "object": "chat.completion.chunk",
                       "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})  # fmt: skip
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append({**base, "object": "chat.completion.chunk", "choices": [], "usage": usage})
        _send_events(http, [json.dumps(e) for e in events] + ["[DONE]"])

    # ---- Responses ---------------------------------------------------------------------------------------

    def _responses(self, http: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        previous = body.get("previous_response_id")
        items = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
        if self.forget_before_tool_results and any(i.get("type") == "function_call_output" for i in items):
            self.forget_before_tool_results = False
            self.forget()
        if previous is not None and previous not in self.responses:
            raise Invalid(f"Previous response with id '{previous}' not found.")
        turns = list(self.responses.get(previous, [])) if previous else []
        for item in items:
            kind = item.get("type", "message")
            if kind == "function_call":
                turns.append(("call", item["call_id"], None))
            elif kind == "function_call_output":
                turns.append(("result", item["call_id"], str(item.get("output"))))
            elif kind == "message":
                text = item["content"] if isinstance(item["content"], str) else _joined(item["content"])
                turns.append(("user" if item["role"] == "user" else "assistant", None, text))
        _check_pairs(turns)
        tools = [t["name"] for t in body.get("tools") or [] if t.get("type") == "function"]
        kind, value = _reply(turns, tools, str(body.get("instructions") or ""))
        response_id = _new_id("resp")
        if kind == "call":
            output = [{"type": "function_call", "id": _new_id("fc"), "call_id": value[0], "name": value[1],
                       "arguments": "{}", "status": "completed"}]  # fmt: skip
            turns.append(("call", value[0], None))
        else:
            content = [{"type": "output_text", "text": value, "annotations": []}]
            output = [{"type": "message", "id": _new_id("msg"), "status": "completed", "role": "assistant",
                       "content": content}]  # fmt: skip
            turns.append(("assistant", None, value))
        if body.get("store", True):
            self.responses[response_id] = turns
        usage = {"input_tokens": 10 + len(turns), "output_tokens": 5, "total_tokens": 15 + len(turns),
                 "input_tokens_details": {"cached_tokens": 3},
                 "output_tokens_details": {"reasoning_tokens": 2}}  # fmt: skip
        response = {"id": response_id, "object": "response", "created_at": 1, "status": "completed",
                    "model": body["model"], "output": output, "usage": usage, "parallel_tool_calls": True,
                    "tool_choice": "auto", "tools": [], "previous_response_id": previous}  # fmt: skip
        if not body.get("stream"):
            _send_json(http, response)
            return
        item = output[0]
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": {**response, "status": "in_progress", "output": []}},
            {"type": "response.output_item.added", "output_index": 0, "item": {**item, "status": "in_progress"}},
        ]
        if kind == "call":
            events.append({"type": "response.function_call_arguments.delta", "output_index": 0,
                           "item_id": item["id"], "delta": "{}"})  # fmt: skip
        else:
            events += [{"type": "response.output_text.delta", "output_index": 0, "content_index": 0,
                        "item_id": item["id"], "delta": piece, "logprobs": []} for piece in _pieces(value)]  # fmt: skip
        events.append({"type": "response.completed", "response": response})
        for number, event in enumerate(events):
            event["sequence_number"] = number
        _send_events(http, [json.dumps(e) for e in events], named=True)


def _joined(content: Any) -> str:
    if not content:
        return ""
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def _pieces(text: str) -> list[str]:
    return [text[i : i + 4] for i in range(0, len(text), 4)] or [""]


def _send_json(http: BaseHTTPRequestHandler, payload: Any, status: int = 200) -> None:
    data = json.dumps(payload).encode()
    http.send_response(status)
    http.send_header("Content-Type", "application/json")
    http.send_header("Content-Length", str(len(data)))
    http.end_headers()
    http.wfile.write(data)


def _send_events(http: BaseHTTPRequestHandler, events: list[str], named: bool = False) -> None:
    http.send_response(200)
    http.send_header("Content-Type", "text/event-stream")
    http.end_headers()
    for event in events:
        prefix = f"event: {json.loads(event)['type']}\n" if named and event != "[DONE]" else ""
        http.wfile.write(f"{prefix}data: {event}\n\n".encode())
        http.wfile.flush()
