"""Issue 22, item 10: the browser answers only under its own names, and a malformed query is a 400, not a 500.

DNS rebinding: a web page the operator visits makes its own name resolve to 127.0.0.1, and the operator's web
browser then lets it read what the loopback transcript browser answers. Only the ``Host`` header still carries
the page's name, so that is what the browser checks. Real HTTP against ``agent-store ui`` started as a user
starts it (test_browser.serving), on both backends.
"""

from __future__ import annotations

from urllib.parse import quote

from agent_framework import Agent, Content, Message
from test_browser import get, serving

from agent_store import Store
from agent_store.browser.app import host_and_port

SECRET = "the transcript a rebinding page must not read"


async def one_session(url: str, agent: Agent) -> None:
    async with Store.from_url(url) as store:
        await store.migrate()
        async with store.session("chat", user_id="u") as session:
            await agent.run(SECRET, session=session)


async def test_only_loopback_names_the_bind_address_and_allowed_hosts_are_answered(url: str, agent: Agent) -> None:
    await one_session(url, agent)
    with serving(url) as base:
        port = base.rsplit(":", 1)[1]
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LocalHost.:{port}", f"[::1]:{port}", "localhost"):
            status, body, _ = get(base + "/session?id=chat&user=u", Host=host)
            assert status == 200 and SECRET in body, host
        for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}", f"localhost:{port}x",
                     f"localhost.evil.example:{port}", f"[::1]x:{port}", "::1", f"localhost:{port}:1"):  # fmt: skip
            for path in ("/session?id=chat&user=u", "/session.jsonl?id=chat&user=u", "/sessions", "/"):
                status, body, headers = get(base + path, Host=host)
                assert status == 400 and SECRET not in body and "--allow-host" in body, (host, path)
                assert headers["Cache-Control"] == "no-store"
    with serving(url, "--allow-host", "chat.internal", "--token", "s3cret") as base:
        port = base.rsplit(":", 1)[1]
        assert get(base + "/sessions?token=s3cret", Host=f"chat.internal:{port}")[0] == 200
        assert get(base + "/sessions?token=s3cret", Host=f"localhost:{port}")[0] == 200
        assert get(base + "/sessions?token=s3cret", Host=f"evil.example:{port}")[0] == 400  # the token is no pass


def test_host_headers_are_read_as_http_writes_them() -> None:
    assert host_and_port("LOCALHOST:8765") == ("localhost", "8765")
    assert host_and_port("[::1]:8765") == ("[::1]", "8765") and host_and_port("[::1]") == ("[::1]", None)
    assert host_and_port("example.com.") == ("example.com", None)
    for malformed in ("", "a:b", "[::1", "[::1]8765", "::1", "a:1:2", "a:", "a:\u0663"):
        assert host_and_port(malformed) == ("", None), malformed


async def test_a_malformed_query_parameter_is_a_400_that_says_so(url: str, agent: Agent) -> None:
    await one_session(url, agent)
    with serving(url) as base:
        for after in ("--1", "²", "\u0663", "-2", "1e5", "+1", "2147483648", " 1", "x", "-"):
            for path in ("/session", "/session.jsonl"):
                status, body, _ = get(f"{base}{path}?id=chat&user=u&after={quote(after)}")
                assert status == 400 and "after must be a message seq" in body, (path, after, status)
        assert get(base + "/session?id=chat&user=u&after=0")[0] == 200
        assert get(base + "/session?id=chat&user=u&after=2147483647")[0] == 200  # the largest seq: an empty page


async def test_a_function_result_without_a_call_id_is_shown_not_a_500(url: str) -> None:
    """A stored result with no ``call_id`` (a commit accepts one; so does an import): the page shows it."""
    async with Store.from_url(url) as store:
        await store.migrate()
        async with store.session("odd", user_id="u") as session:
            result = Content.from_function_result(call_id=None, result="no id at all")  # type: ignore[arg-type]
            session.state["in_memory"]["messages"] += [Message(role="user", contents=["a question"]),
                                                       Message(role="tool", contents=[result])]  # fmt: skip
    with serving(url) as base:
        status, body, _ = get(base + "/session?id=odd&user=u")
        assert status == 200 and "a question" in body
