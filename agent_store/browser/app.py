"""`agent-store ui`: a read-only transcript browser (Starlette + Jinja2; server-rendered pages, no JavaScript).

Every page is a GET that reads through the Store (on its replica when there is one); there is no route that
writes. Jinja2 escapes every stored string, and the Content-Security-Policy forbids scripts outright, so a
message ``<script>`` is shown as text and could not run even if it got through. Bound to anything but
loopback, the CLI refuses to start without a token; with one, every request must carry it (``?token=`` once,
then a cookie, or ``Authorization: Bearer``).

Every request must also name, in its ``Host`` header, a host the browser serves: the loopback names and its bind
address, plus any the operator allows (``allowed_hosts``, ``--allow-host``). Without that check, DNS rebinding
would let any web page the operator visits read every transcript from the loopback browser: the page's own
name is made to resolve to 127.0.0.1, so the browser lets it read the answers (same origin), and only the Host
header still shows the name the request was made for. Another name gets 400, as Starlette's TrustedHostMiddleware
and Django answer; not 421, which HTTP/2 clients take as "retry on another connection".
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
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

from agent_store.browser import panels as browse
from agent_store.errors import AgentStoreError, InvalidValueError, SessionNotFoundError
from agent_store.operations import lifecycle
from agent_store.store import Store

COOKIE = "agent_store_ui_token"
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")  # on any port: an SSH tunnel's local port is another one
SEQ_MAX = 2**31  # seq is a 32-bit column
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


def host_and_port(value: str) -> tuple[str, str | None]:
    """A ``Host`` header (or an allowed host) as a lower-case name and its port (None: none given); an IPv6
    address keeps its brackets. Anything malformed gives an empty name, which matches nothing."""
    value = value.strip().lower()
    if value.startswith("["):  # [::1] or [::1]:8765
        name, closed, rest = value.partition("]")
        if not closed or (rest and not rest.startswith(":")):
            return "", None
        name, port = name + "]", rest[1:] if rest else None
    elif value.count(":") == 1:
        name, _, port = value.partition(":")
    elif ":" in value:  # an IPv6 address without brackets is no Host
        return "", None
    else:
        name, port = value, None
    if port is not None and not (port.isascii() and port.isdigit()):
        return "", None
    return name.rstrip("."), port


class HostGate(BaseHTTPMiddleware):
    """Answer only requests whose ``Host`` names a host this browser serves (see the module docstring)."""

    def __init__(self, app: Any, allowed: Sequence[str]) -> None:
        super().__init__(app)
        self.allowed = [host_and_port(host) for host in allowed]

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        name, port = host_and_port(request.headers.get("host", ""))
        if name and any(name == n and p in (None, port) for n, p in self.allowed):
            return await call_next(request)
        return PlainTextResponse(
            "this browser does not serve the host this request names (the Host header); to open it under another "
            "name, start it with --allow-host NAME",
            400,
            headers=HEADERS,
        )


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


def create_app(
    store: Store, *, token: str | None = None, page_size: int = 50, owns_store: bool = False,
    allowed_hosts: Sequence[str] | None = None, trace_url: str | None = None,
) -> Starlette:  # fmt: skip
    """The browser's ASGI app over ``store`` (``owns_store``: close it when the app shuts down).

    ``allowed_hosts``: the names (``"host"``: any port; ``"host:port"``: that port) a request's ``Host`` header may
    give; None: the loopback names (:data:`LOOPBACK_HOSTS`); ``["*"]``: any (no check, e.g. behind a proxy that
    checks it). Another name is answered 400. ``trace_url``: where a model call's trace id links to, with
    ``{trace_id}`` (and ``{span_id}``) in it, e.g. ``"http://localhost:16686/trace/{trace_id}"`` (Jaeger).
    """
    if trace_url is not None and (not trace_url.startswith(("http://", "https://")) or "{trace_id}" not in trace_url):
        raise InvalidValueError("trace_url must be an http(s) URL with {trace_id} in it")
    if isinstance(allowed_hosts, str):
        raise InvalidValueError("allowed_hosts is a list of host names, not one string")
    allowed = list(LOOPBACK_HOSTS if allowed_hosts is None else allowed_hosts)
    env = Environment(loader=PackageLoader("agent_store.browser", "templates"), autoescape=True)
    env.filters.update(marked=marked, json=_json, query=lambda params: urlencode(params, doseq=True))

    def page(name: str, status: int = 200, **context: Any) -> HTMLResponse:
        return HTMLResponse(env.get_template(name).render(**context), status, headers=HEADERS)

    def jsonl(items: list[Any]) -> Response:
        body = "".join(item.model_dump_json() + "\n" for item in items)
        return Response(body, headers=HEADERS, media_type="application/x-ndjson; charset=utf-8")

    def read_only(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def guarded(request: Request) -> Response:
            typed = {"q": request.query_params.get("q"), "user": request.query_params.get("user")}  # kept in the box
            try:
                return await handler(request)
            except SessionNotFoundError:  # said in the browser's terms (the exception's hint is the CLI's)
                sid, user = request.query_params.get("id", ""), typed["user"]
                whose = f"for user {user!r}" if user else "without a user: a user's session opens with ?user=ID"
                return page("error.html", 404, message=f"no session {sid!r} {whose}", **typed)
            except AgentStoreError as exc:  # bad input (a cursor, a query) or a database error: said, not traced
                status = 400 if isinstance(exc, InvalidValueError) else 503
                return page("error.html", status, message=str(exc), **typed)

        return guarded

    def filters(request: Request) -> dict[str, Any]:
        q = request.query_params
        if any(pair and "=" not in pair for pair in q.getlist("meta")):
            raise InvalidValueError("meta filters are key=value")
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
        firsts = await browse.first_user_texts(store.db, [(s.id, s.user_id) for s in listed.items if not s.title])
        keep = [(k, v) for k, v in request.query_params.multi_items() if k not in ("cursor", "token")]
        return page("sessions.html", f=f, page=listed, firsts=firsts, keep=keep)

    @read_only
    async def sessions_jsonl(request: Request) -> Response:
        return jsonl((await sessions_page(request))[1].items)

    async def transcript(request: Request) -> tuple[Any, list[Any], int]:
        q = request.query_params
        sid, user, after = q.get("id") or "", q.get("user") or None, q.get("after") or "-1"
        # ASCII digits only: str.isdigit() takes "²", which int() then refuses (that was an HTTP 500).
        if not re.fullmatch(r"-1|[0-9]{1,10}", after) or int(after) >= SEQ_MAX:
            raise InvalidValueError(f"after must be a message seq (-1, or 0 to {SEQ_MAX - 1}), not {after[:40]!r}")
        info = await store.get(sid, user_id=user)
        # Encrypted messages (the browser holds no cipher) show as such; the rest of the page still works.
        messages = await lifecycle.messages(store.db, sid, user, int(after), page_size, sealed_ok=True)
        return info, messages, int(after)

    @read_only
    async def session(request: Request) -> Response:
        info, messages, after = await transcript(request)
        panels = await browse.session_panels(store.db, info.id, info.user_id, store.app_id)
        results = {c["call_id"]: c for m in messages for c in m.body.get("contents", [])
                   if c.get("type") == "function_result" and c.get("call_id")}  # fmt: skip  # none: shown alone
        # A compaction's summaries fold what they replaced; an excluded message links to its summary.
        summaries = [m.message_id for m in messages if _summary_of(m.body)]
        folded = await browse.summarized(store.db, info.id, info.user_id, summaries)
        seq_of = {m.message_id: m.seq for m in messages}
        return page("session.html", s=info, messages=messages, after=after, panels=panels, results=results,
                    checkpoints=await browse.user_checkpoints(store.db, info.user_id), page_size=page_size,
                    user=info.user_id, folded=folded, seq_of=seq_of, trace_url=trace_url)  # fmt: skip

    @read_only
    async def session_jsonl(request: Request) -> Response:
        return jsonl((await transcript(request))[1])

    async def hits(request: Request) -> tuple[str | None, str, Any]:
        q = request.query_params
        user, text = q.get("user") or None, q.get("q") or ""  # no user: every user's sessions, as /sessions lists
        found = await store.search(text, user_id=user, all_users=user is None, limit=min(page_size, 100),
                                   session_id=q.get("session") or None, cursor=q.get("cursor") or None,
                                   ranking=q.get("ranking") or "auto")  # fmt: skip
        return user, text, found

    @read_only
    async def search(request: Request) -> Response:
        user, text, found = await hits(request)
        return page("search.html", user=user, q=text, page=found, can_mean=store.embeddings.enabled)

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
    middleware = [] if "*" in allowed else [Middleware(HostGate, allowed=allowed)]  # the outermost: first
    middleware += [Middleware(TokenGate, token=token)] if token else []

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        if owns_store:
            await store.close()

    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)


def _summary_of(body: dict[str, Any]) -> bool:
    """Whether a message is a compaction's summary (it names the messages it replaced)."""
    group = body.get("additional_properties", {}).get("_group")
    return isinstance(group, dict) and bool(group.get("_summary_of_message_ids") or group.get("_summary_of_group_ids"))
