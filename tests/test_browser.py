"""`agent-store ui` in a real browser: the CLI serves a store (both backends), headless Chromium (Debian's, driven
by Selenium and Debian's chromedriver) clicks through it. Plus what must hold without a browser: it never writes,
it escapes, and off loopback it needs a token.

AGENT_STORE_UPDATE_SCREENSHOTS=1 saves into docs/ the screenshots the README and docs/search-and-browser.md show.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from agent_framework import Agent, AgentSession, Message, WorkflowCheckpoint, tool
from conftest import IN_CI
from helpers import expire_now, rows
from programs import missing

from agent_store import Store
from agent_store.agent_framework import StoreCheckpointStorage, UsageRecorder
from agent_store.offline import OfflineChatClient

DOCS = Path(__file__).resolve().parent.parent / "docs"
SCRIPT = "<script>alert(1)</script>"


@tool
def weather() -> str:
    """Today's weather."""
    return "晴"


async def populate(url: str) -> None:
    """li's conversation of 59 messages (two transcript pages), a tool call, a message that is HTML, state in
    every scope, a fork, a workflow checkpoint; and another user's session."""
    agent = Agent(client=OfflineChatClient(), name="Bot", tools=[weather], middleware=[UsageRecorder()])
    async with Store.from_url(url) as store:
        await store.migrate()
        async with store.session("chat-1", user_id="li") as session:
            await agent.run("我叫李明", session=session)
            await agent.run("call weather", session=session)
            session.state["in_memory"]["messages"] += [Message(role="user", contents=[f"note {i}"]) for i in range(50)]
            session.state["in_memory"]["messages"].append(Message(role="user", contents=[SCRIPT]))
            session.state.update({"mood": "good", "user:city": "上海", "app:motd": "<b>hi</b>"})
        await agent.run("我叫什么名字？", session=(s := await store.load("chat-1", user_id="li")).session)
        await s.commit()
        await store.update("chat-1", user_id="li", title="李明's chat <i>1</i>")
        await store.fork("chat-1", user_id="li", at_seq=1, new_id="chat-1-branch")
        async with store.session("other", user_id="wang") as session:
            await agent.run("我叫王芳", session=session)
        await StoreCheckpointStorage(store, user_id="li").save(
            WorkflowCheckpoint(workflow_name="review", graph_signature_hash="g", checkpoint_id="cp-1")
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(url: str, *args: str) -> Iterator[str]:
    """`agent-store ui` in a subprocess, as a user starts it; yields its base URL."""
    port = free_port()
    command = [sys.executable, "-m", "agent_store", "ui", "--url", url, "--port", str(port), *args]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60  # a loaded machine starts Python slowly
        while True:
            try:
                urllib.request.urlopen(base + "/sessions", timeout=5)
                break
            except urllib.error.HTTPError:
                break  # it answers (401 with a token)
            except OSError:
                assert server.poll() is None, server.stdout.read() if server.stdout else ""
                assert time.monotonic() < deadline, "the browser never answered"
                time.sleep(0.1)
        yield base
    finally:
        server.terminate()
        server.wait(timeout=10)


def get(url: str, method: str = "GET", **headers: str) -> tuple[int, str, Any]:
    request = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode(), response.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), exc.headers


@pytest.fixture
def chromium() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    reason = missing("chromium", "chromedriver")
    if reason:
        pytest.fail(reason) if IN_CI else pytest.skip(reason)
    binary, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    try:
        yield driver
    finally:
        driver.quit()


def arrived(driver: Any, element_id: str) -> Any:
    """Wait for the page a click led to (a click does not wait for the navigation it starts)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, 15).until(expected_conditions.presence_of_element_located((By.ID, element_id)))


def shot(driver: Any, name: str, backend: str, tmp_path: Path) -> None:
    path = tmp_path / name
    assert driver.save_screenshot(str(path)) and path.stat().st_size > 10_000
    if os.environ.get("AGENT_STORE_UPDATE_SCREENSHOTS") == "1" and backend == "sqlite":
        shutil.copy(path, DOCS / name)


async def test_click_through_the_browser(url: str, chromium: Any, tmp_path: Path) -> None:
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    backend = "postgresql" if url.startswith("postgresql") else "sqlite"
    await populate(url)
    with serving(url) as base:
        chromium.get(base + "/")
        rows_shown = chromium.find_elements(By.CSS_SELECTOR, "#sessions .session-row")
        assert {r.find_element(By.CSS_SELECTOR, "a").text for r in rows_shown} == {"chat-1", "chat-1-branch", "other"}
        assert "李明's chat <i>1</i>" in chromium.find_element(By.ID, "sessions").text  # a title, escaped
        shot(chromium, "ui-sessions.png", backend, tmp_path)

        chromium.find_element(By.LINK_TEXT, "chat-1").click()
        assert arrived(chromium, "session-title").text == "李明's chat <i>1</i>"
        first_page = [m.get_attribute("id") for m in chromium.find_elements(By.CSS_SELECTOR, ".msg")]
        assert first_page == [f"m{i}" for i in range(50)]
        assert "→ weather({})" in chromium.find_element(By.ID, "m3").text and '← "晴"' in chromium.page_source
        state = chromium.find_element(By.ID, "state").text
        assert "mood" in state and "user:city" in state and "上海" in state and "<b>hi</b>" in state
        assert "chat-1-branch" in chromium.find_element(By.ID, "lineage").text
        assert "review" in chromium.find_element(By.ID, "checkpoints").text
        shot(chromium, "ui-session.png", backend, tmp_path)

        chromium.find_element(By.ID, "next-page").click()
        arrived(chromium, "m50")
        second = chromium.find_elements(By.CSS_SELECTOR, ".msg")
        assert [m.get_attribute("id") for m in second][:3] == ["m50", "m51", "m52"]
        assert SCRIPT in chromium.find_element(By.ID, "m56").text  # shown as text ...
        with pytest.raises(NoAlertPresentException):
            chromium.switch_to.alert.accept()  # ... never run
        assert "你叫李明。" in chromium.page_source

        who = chromium.find_element(By.NAME, "user")
        assert who.get_attribute("value") == "li"  # the session's user, filled in
        who.clear()
        who.send_keys("li")
        chromium.find_element(By.NAME, "q").send_keys("李明")
        chromium.find_element(By.ID, "search-button").click()
        arrived(chromium, "hits")
        hits = chromium.find_elements(By.CSS_SELECTOR, "#hits .hit")
        assert len(hits) >= 3 and all("李明" in h.text for h in hits)
        assert {m.text for m in chromium.find_elements(By.CSS_SELECTOR, "#hits mark")} == {"李明"}
        assert "王芳" not in chromium.page_source  # another user's session
        shot(chromium, "ui-search.png", backend, tmp_path)
        hits[0].find_element(By.CSS_SELECTOR, "a").click()
        assert arrived(chromium, "session-title").text == "李明's chat <i>1</i>"


async def test_it_never_writes_and_exports_what_is_on_screen(url: str) -> None:
    await populate(url)
    async with Store.from_url(url) as store:
        before = await rows(store, "SELECT id, version, next_seq, updated_at FROM agent_sessions ORDER BY id")
    with serving(url) as base:
        for path in ("/sessions", "/session?id=chat-1&user=li", "/search?user=li&q=李明", "/session?id=chat-1&user=x",
                     "/session?id=chat-1&user=li&after=oops", "/session.jsonl?id=chat-1&user=li&after=oops",
                     "/search?q=x", "/sessions?cursor=bad", "/search?user=li&q=%00", "/session?id=%00"):  # fmt: skip
            status, body, headers = get(base + urllib.parse.quote(path, safe="/?=&%"))
            assert status in (200, 400, 404) and "Traceback" not in body and "Internal Server Error" not in body
            assert "script-src" not in headers["Content-Security-Policy"]  # default-src 'none': no script at all
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            assert get(base + "/session?id=chat-1&user=li", method)[0] == 405
        status, body, _ = get(base + "/session?id=chat-1")  # a user's session, opened without its user
        assert status == 404 and "?user=ID" in body and "--user" not in body and "user None" not in body
        status, body, _ = get(base + "/session?id=chat-1&user=li")
        assert status == 200 and 'id="usage"' in body and "model calls · in " in body  # the session's totals
        assert "every workflow, not only this session" in body  # checkpoints are the user's
        status, body, _ = get(base + "/session.jsonl?id=chat-1&user=li&after=49")
        assert status == 200 and [line.count('"seq"') for line in body.splitlines()] == [1] * 9
        assert '"seq":50' in body.splitlines()[0] and SCRIPT in body
    async with Store.from_url(url) as store:
        assert await rows(store, "SELECT id, version, next_seq, updated_at FROM agent_sessions ORDER BY id") == before


def test_off_loopback_it_refuses_to_start_without_a_token_and_then_requires_it(sqlite_url: str) -> None:
    command = [sys.executable, "-m", "agent_store", "ui", "--url", sqlite_url, "--host", "0.0.0.0"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "refusing to serve 0.0.0.0 without --token" in done.stderr
    subprocess.run([sys.executable, "-m", "agent_store", "upgrade", "--url", sqlite_url], check=True, timeout=60)
    with serving(sqlite_url, "--token", "s3cret") as base:
        assert get(base + "/sessions")[0] == 401
        assert get(base + "/sessions?token=wrong")[0] == 401
        assert get(base + "/sessions", Authorization="Bearer s3cret")[0] == 200
        assert get(base + "/sessions", Authorization="s3cret")[0] == 401  # a bare token is not a bearer token
        status, _, headers = get(base + "/sessions?token=s3cret")
        assert status == 200 and "HttpOnly" in headers["Set-Cookie"]
        assert get(base + "/sessions", Cookie=headers["Set-Cookie"].split(";")[0])[0] == 200


async def test_the_session_list_filters_and_pages(store: Store) -> None:
    """In-process (httpx over ASGI), two sessions a page: every filter, and the keyset pages add up."""
    import re

    import httpx

    from agent_store.browser.app import create_app

    for i in range(5):
        async with store.session(f"s{i}", user_id="u") as session:
            session.state["n"] = i
        await store.update(f"s{i}", user_id="u", metadata={"topic": "x" if i % 2 == 0 else "y"})
    await store.close_session("s1", user_id="u")
    await expire_now(store, "s2")
    async with store.session("theirs", user_id="v") as session:
        session.state["n"] = 0

    def listed(html: str) -> list[str]:
        return re.findall(r'class="session-link" href="[^"]*">([^<]*)</a>', html)

    transport = httpx.ASGITransport(app=create_app(store, page_size=2))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        seen, path = [], "/sessions?user=u"
        while path:
            html = (await client.get(path)).text
            seen.append(listed(html))
            found = re.search(r'id="next-page" href="([^"]*)"', html)
            path = found.group(1).replace("&amp;", "&") if found else ""
        assert [len(p) for p in seen] == [2, 2, 1] and sorted(s for page in seen for s in page) == [
            f"s{i}" for i in range(5)
        ]
        assert listed((await client.get("/sessions?user=u&status=closed")).text) == ["s1"]
        assert listed((await client.get("/sessions?user=u&status=expired")).text) == ["s2"]
        active = listed((await client.get("/sessions?user=u&status=active&meta=topic=x")).text)
        assert sorted(active) == ["s0", "s4"]
        assert "theirs" in listed((await client.get("/sessions")).text + (await client.get("/sessions?cursor=")).text)
        assert len((await client.get("/sessions.jsonl?user=u")).text.splitlines()) == 2
        bad = await client.get("/sessions?status=gone")
        assert bad.status_code == 400 and "status must be" in bad.text


async def test_odd_ids_and_encrypted_sessions_still_open(url: str) -> None:
    """An id with "/" (the store takes it) opens by its own link; a session stored encrypted shows everything
    but the messages' content, which the browser cannot read without the cipher."""
    import re

    import httpx
    from test_core import ReversingCipher

    from agent_store.browser.app import create_app

    async with Store.from_url(url, message_cipher=ReversingCipher()) as sealed:
        await sealed.migrate()
        async with sealed.session("x/export.jsonl", user_id="u") as session:
            session.state["in_memory"]["messages"].append(Message(role="user", contents=["secret"]))
            session.state["k"] = "visible"
    async with Store.from_url(url) as store:
        async with store.session("a/b", user_id="u") as session:
            session.state["in_memory"]["messages"].append(Message(role="user", contents=["slash 100%"]))
        transport = httpx.ASGITransport(app=create_app(store))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            listing = (await client.get("/sessions?user=u")).text
            links = dict(re.findall(r'class="session-link" href="([^"]*)">([^<]*)</a>', listing))
            assert set(links.values()) == {"a/b", "x/export.jsonl"}
            pages = {name: (await client.get(href.replace("&amp;", "&"))) for href, name in links.items()}
            assert pages["a/b"].status_code == 200 and "slash 100%" in pages["a/b"].text
            opened = pages["x/export.jsonl"]
            assert opened.status_code == 200 and "(encrypted" in opened.text and "visible" in opened.text
            assert "secret" not in opened.text
            meta = await client.get("/sessions?meta=a=1&meta=b=2&status=active")
            assert meta.status_code == 200 and meta.text.count('name="meta"') == 3  # both kept, one empty


async def test_a_served_conversations_tree_opens_every_branch(store: Store) -> None:
    """A branch's page shows the conversation's tree (its root, every branch, their response ids), each session a
    link that opens it, and where a branch's own history begins; a plain session shows no tree."""
    import re

    import httpx

    from agent_store.agent_framework import StoreSessionStore
    from agent_store.browser.app import create_app

    sessions = StoreSessionStore(store, user_id="u")
    await sessions.set("r0", AgentSession(session_id="r0"))
    for key, parent in (("r1", "r0"), ("r2", "r1"), ("b1", "r1")):
        session = await sessions.get(parent)
        assert session is not None
        session.state.setdefault("in_memory", {}).setdefault("messages", []).append(
            Message(role="user", contents=[f"to {key}"])
        )
        await sessions.set(key, session)
    branch = (await rows(store, "SELECT id FROM agent_sessions WHERE base_id = 'r0'"))[0][0]
    async with store.session("plain", user_id="u") as session:
        session.state["n"] = 1
    transport = httpx.ASGITransport(app=create_app(store))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        html = (await client.get("/session", params={"id": branch, "user": "u"})).text
        tree = html[html.index('id="tree"') :]
        assert f"<b>{branch}</b>" in tree and "continues" in tree and "before #1" in tree
        assert [r for r in ("r0", "r1", "r2", "b1") if f"response {r} " in tree] == ["r0", "r1", "r2", "b1"]
        links = [link.replace("&amp;", "&") for link in re.findall(r'class="tree-link" href="([^"]*)"', tree)]
        assert len(links) == 1 and "id=r0" in links[0]
        root = await client.get(links[0])
        assert root.status_code == 200 and "to r2" in root.text and "tree-link" in root.text
        assert 'id="tree"' not in (await client.get("/session", params={"id": "plain", "user": "u"})).text
