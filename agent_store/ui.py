"""`agent-store ui`: a read-only transcript browser (Starlette + Jinja2; server-rendered pages, no JavaScript).

Every page is a GET that reads through the Store (on its replica when there is one); there is no route that
writes. Jinja2 escapes every stored string, and the Content-Security-Policy forbids scripts outright, so a
message ``<script>`` is shown as text and could not run even if it got through. Bound to anything but
loopback, the CLI refuses to start without a token; with one, every request must carry it (``?token=`` once,
then a cookie, or ``Authorization: Bearer``).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader
from markupsafe import Markup, escape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from . import browse, lifecycle
from .errors import AgentStoreError, InvalidValueError, SessionNotFoundError
from .store import Store

COOKIE = "agent_store_ui_token"
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # a ?token= must not leak through a link
    "Cache-Control": "no-store",
}


def marked(snippet: str, marks: list[tuple[int, int]]) -> Markup:
    """The snippet, escaped, with each match in <mark>."""
    out, last = Markup(""), 0
    for start, end in marks:
        out += escape(snippet[last:start]) + Markup("<mark>") + escape(snippet[start:end]) + Markup("</mark>")
        last = end
    return out + escape(snippet[last:])


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=repr)


class TokenGate(BaseHTTPMiddleware):
    def __init__(self, app: Any, token: str) -> None:
        super().__init__(app)
        self.token = token.encode()

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
        bearer = bearer.strip() if scheme.lower() == "bearer" else ""
        given = request.query_params.get("token") or request.cookies.get(COOKIE) or bearer
        if not given or not hmac.compare_digest(given.encode(), self.token):
            return PlainTextResponse("a token is required: open the URL the command printed", 401, headers=HEADERS)
        response = await call_next(request)
        if request.query_params.get("token"):
            response.set_cookie(COOKIE, given, httponly=True, samesite="strict")
        return response


def create_app(store: Store, *, token: str | None = None, page_size: int = 50, owns_store: bool = False) -> Starlette:
    """The browser's ASGI app over ``store`` (``owns_store``: close it when the app shuts down)."""
    env = Environment(loader=PackageLoader("agent_store", "templates"), autoescape=True)
    env.filters.update(marked=marked, json=_json, query=lambda params: urlencode(params, doseq=True))

    def page(name: str, status: int = 200, **context: Any) -> HTMLResponse:
        return HTMLResponse(env.get_template(name).render(**context), status, headers=HEADERS)

    def jsonl(items: list[Any]) -> Response:
        body = "".join(item.model_dump_json() + "\n" for item in items)
        return Response(body, headers=HEADERS, media_type="application/x-ndjson; charset=utf-8")

    def read_only(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except SessionNotFoundError as exc:
                return page("error.html", 404, message=str(exc))
            except AgentStoreError as exc:  # bad input (a cursor, a query) or a database error: said, not traced
                return page("error.html", 400 if isinstance(exc, InvalidValueError) else 503, message=str(exc))

        return guarded

    def filters(request: Request) -> dict[str, Any]:
        q = request.query_params
        meta = dict(pair.split("=", 1) for pair in q.getlist("meta") if "=" in pair)
        return {"user": q.get("user") or None, "agent": q.get("agent") or None, "status": q.get("status") or None,
                "meta": meta, "cursor": q.get("cursor") or None}  # fmt: skip

    async def sessions_page(request: Request) -> Any:
        f = filters(request)
        listed = await store.list_sessions(
            user_id=f["user"], all_users=f["user"] is None, agent_id=f["agent"], metadata=f["meta"] or None,
            status=f["status"], limit=page_size, cursor=f["cursor"],
        )  # fmt: skip
        return f, listed

    @read_only
    async def sessions(request: Request) -> Response:
        f, listed = await sessions_page(request)
        firsts = await browse.first_user_texts(store.db, [s.id for s in listed.items if not s.title])
        keep = [(k, v) for k, v in request.query_params.multi_items() if k not in ("cursor", "token")]
        return page("sessions.html", f=f, page=listed, firsts=firsts, keep=keep)

    @read_only
    async def sessions_jsonl(request: Request) -> Response:
        return jsonl((await sessions_page(request))[1].items)

    async def transcript(request: Request) -> tuple[Any, list[Any], int]:
        q = request.query_params
        sid, user, after = q.get("id") or "", q.get("user") or None, q.get("after") or "-1"
        if not after.lstrip("-").isdigit():
            raise InvalidValueError(f"after must be a message seq, not {after!r}")
        info = await store.get(sid, user_id=user)
        # Encrypted messages (the browser holds no cipher) show as such; the rest of the page still works.
        messages = await lifecycle.messages(store.db, sid, user, int(after), page_size, sealed_ok=True)
        return info, messages, int(after)

    @read_only
    async def session(request: Request) -> Response:
        info, messages, after = await transcript(request)
        panels = await browse.session_panels(store.db, info.id, info.user_id, store.app_id)
        results = {c["call_id"]: c for m in messages for c in m.body.get("contents", [])
                   if c.get("type") == "function_result"}  # fmt: skip
        return page("session.html", s=info, messages=messages, after=after, panels=panels, results=results,
                    checkpoints=await browse.user_checkpoints(store.db, info.user_id), page_size=page_size,
                    user=info.user_id)  # fmt: skip

    @read_only
    async def session_jsonl(request: Request) -> Response:
        return jsonl((await transcript(request))[1])

    async def hits(request: Request) -> tuple[str, str, Any]:
        q = request.query_params
        user, text = q.get("user") or "", q.get("q") or ""
        if not user:
            raise InvalidValueError("search needs a user: search is per user")
        return user, text, await store.search(text, user_id=user, session_id=q.get("session") or None,
                                              cursor=q.get("cursor") or None, limit=page_size)  # fmt: skip

    @read_only
    async def search(request: Request) -> Response:
        user, text, found = await hits(request)
        return page("search.html", user=user, q=text, page=found)

    @read_only
    async def search_jsonl(request: Request) -> Response:
        return jsonl((await hits(request))[2].items)

    async def home(request: Request) -> Response:
        return RedirectResponse("/sessions", headers=HEADERS)

    routes = [
        Route("/", home),
        Route("/sessions", sessions),
        Route("/sessions.jsonl", sessions_jsonl),
        Route("/session", session),  # ?id=: any id, "/" included
        Route("/session.jsonl", session_jsonl),
        Route("/search", search),
        Route("/search.jsonl", search_jsonl),
    ]  # Route's default methods: GET and HEAD only; anything else is 405
    middleware = [Middleware(TokenGate, token=token)] if token else []

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        if owns_store:
            await store.close()

    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
