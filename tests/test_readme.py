"""The README is the front door: its quick start, its SQL and its commands run here, on both backends, and so
does every example and query of the docs/ pages (tests/helpers.py: DOC_PAGES, doc_blocks, doc_block)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from agent_framework import Content, Message
from fake_openai import FakeOpenAI
from helpers import DOC_PAGES, ROOT, doc_block, doc_blocks, rows
from sqlalchemy import text

from agent_store import Store

QUICKSTART_URL = "sqlite+aiosqlite:///agent_store.db"
# Every SQL block, by page and name: the tests below run them on their examples' data (the compaction ones:
# test_compaction_storage.py), and test_plans.py checks their plans.
SQL_BLOCKS = {
    ("docs/serving.md", "response-tree"),
    ("README.md", "transcript"),
    ("README.md", "sessions"),
    ("README.md", "matching"),
    ("README.md", "state"),
    ("docs/seams.md", "checkpoint-chain"),
    ("docs/schema-and-sql.md", "model-view"),
    ("docs/schema-and-sql.md", "excluded-why"),
    ("docs/schema-and-sql.md", "excluded-per-session"),
    ("docs/schema-and-sql.md", "tool-calls-per-tool"),
    ("docs/usage.md", "usage-daily"),
    ("docs/usage.md", "usage-per-run"),
}


def run_cli(*args: str, cwd: Path, url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AGENT_STORE_URL"}
    if url is not None:
        env["AGENT_STORE_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "agent_store", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )


def test_the_readme_and_the_docs_have_the_blocks_these_tests_run() -> None:
    pages = {"README.md", "docs/SCALING.md"} | {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert set(DOC_PAGES) | {"docs/SCALING.md"} == pages  # a new page's blocks run too
    assert len(doc_blocks("python")) == len(EXAMPLES) == 21
    assert {(b.page, b.name) for b in doc_blocks("sql")} == SQL_BLOCKS and len(doc_blocks("sql")) == 12


def run_example(source: str, url: str, cwd: Path) -> list[str]:
    """Run one README program against ``url``; returns its printed lines."""
    assert source.count(QUICKSTART_URL) >= 1
    script = cwd / "example.py"
    script.write_text(source.replace(QUICKSTART_URL, url), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=cwd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    # A newcomer's first run: no warning, no note of agent_store's (logging's last resort prints both); only the
    # notices azure-ai-agentserver prints of itself when the serving example imports and starts it (its experimental
    # classes; its in-process background tasks, which docs/serving.md says the store's providers stand behind).
    theirs = re.compile(r"^((Method|Class) azure\.ai\.agentserver\.\S+: This is an experimental |Responses "
                        r"resilience: DISABLED - )")  # fmt: skip
    assert [line for line in done.stderr.splitlines() if not theirs.match(line)] == []
    return done.stdout.splitlines()


def examples() -> list[object]:
    """Each python block of the README and the docs pages, named after its page and the heading above it."""
    return [
        pytest.param(b.source, id=f"{Path(b.page).stem}-" + re.sub(r"\W+", "-", b.heading.lower()).strip("-"))
        for b in doc_blocks("python")
    ]


EXAMPLES = examples()


@pytest.mark.parametrize("source", EXAMPLES)
def test_each_readme_example_prints_what_it_says(
    source: str, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = re.findall(r"# -> (.*)$", source, flags=re.M)
    assert expected, "an example must say what it prints"
    fake = FakeOpenAI().start()  # the OpenAI clients' example talks to the tests' own server, never the network
    monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    try:
        assert run_example(source, url, tmp_path) == expected
    finally:
        fake.stop()


async def test_the_readme_sql_runs_on_the_quick_starts_data(url: str, tmp_path: Path) -> None:
    run_example(doc_block("README.md", "quick-start", "python"), url, tmp_path)
    transcript, sessions, matching, state = (
        doc_block("README.md", n) for n in ("transcript", "sessions", "matching", "state")
    )
    async with Store.from_url(url) as store, store.engine.connect() as conn:

        def run(sql: str) -> list[tuple[object, ...]]:
            return [tuple(r) for r in conn.sync_connection.execute(text(sql.strip().rstrip(";"))).all()]

        assert [r[:3] for r in await conn.run_sync(lambda _: run(transcript))] == [
            (0, "user", None),
            (1, "assistant", "Assistant"),
            (2, "user", None),
            (3, "assistant", "Assistant"),
        ]
        assert [r[:3] for r in await conn.run_sync(lambda _: run(sessions))] == [("chat-42", None, 4)]
        assert [r[:3] for r in await conn.run_sync(lambda _: run(matching))] == [
            ("chat-42", 0, "user"),
            ("chat-42", 1, "assistant"),
            ("chat-42", 3, "assistant"),
        ]
        values = [
            (r[0], json.loads(r[1]) if isinstance(r[1], str) else r[1])
            for r in await conn.run_sync(lambda _: run(state))
        ]
        assert values == [("turns", 2)]


async def test_the_readme_response_tree_query_walks_the_example_s_tree(url: str, tmp_path: Path) -> None:
    run_example(doc_block("docs/serving.md", "hosting", "python"), url, tmp_path)
    async with Store.from_url(url) as store, store.engine.connect() as conn:
        tree = (await conn.execute(text(doc_block("docs/serving.md", "response-tree").strip().rstrip(";")))).all()
    root = tree[0].session_id
    # the first response (frozen where it was), the renamed one and the later one on the trunk, the other branch
    assert [(r.depth, r.parent_id is None) for r in tree] == [(0, True), (0, False), (0, False), (1, False)]
    assert tree[0].response_id == root and tree[1].parent_id == root == tree[3].parent_id
    assert tree[2].parent_id == tree[1].response_id and tree[3].base_seq == 2


async def test_the_readme_checkpoint_chain_query_runs_on_its_example_s_data(url: str, tmp_path: Path) -> None:
    run_example(doc_block("docs/seams.md", "checkpoints", "python"), url, tmp_path)
    async with Store.from_url(url) as store, store.engine.connect() as conn:
        chain = (await conn.execute(text(doc_block("docs/seams.md", "checkpoint-chain").strip().rstrip(";")))).all()
    assert [r[0] for r in chain] == list(range(1, len(chain) + 1)) and len(chain) >= 2
    assert chain[0][2] is None and [r[2] for r in chain[1:]] == [r[1] for r in chain[:-1]]


async def test_the_demo_runs_offline_and_remembers_across_processes(url: str, tmp_path: Path) -> None:
    done = run_cli("demo", "--url", url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "process A] user: 我叫李明  ->  Assistant: 你好，李明！" in done.stdout
    assert "process B] user: 我叫什么名字？  ->  Assistant: 你叫李明。" in done.stdout
    assert 'turn_count=2, preferences={"language": "zh", "theme": "dark"}' in done.stdout
    assert "Translator: [译]" in done.stdout and "Summarizer: 摘要：" in done.stdout
    # The state, read back with SQL, prints the same JSON on both backends (timestamps with their zone).
    assert re.search(r'history \| \[\{"timestamp": \{"\$datetime": "[^"]+\+00:00"\}, "turn": 1\}', done.stdout)
    async with Store.from_url(url) as store:
        assert (await store.list_sessions(user_id="li-ming")).items  # it wrote where --url said
    again = run_cli("demo", "--url", url, cwd=tmp_path)  # a database at head is used as it is
    assert again.returncode == 0 and not (tmp_path / "agent_store.db").exists()


async def test_the_demo_writes_only_where_it_is_told(url: str, tmp_path: Path) -> None:
    async with Store.from_url(url, check_schema=False) as store:
        await store.migrate("0002")  # someone's database, in AGENT_STORE_URL
    done = run_cli("demo", cwd=tmp_path, url=url)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "agent_store.db").is_file() and "你叫李明。" in done.stdout  # its own file
    async with Store.from_url(url, check_schema=False) as store:
        assert await store.db.revision() == "0002"  # untouched: not migrated, no demo rows
    told = run_cli("demo", "--url", url, cwd=tmp_path)  # told explicitly: still not migrated behind one's back
    assert told.returncode == 1 and told.stderr.startswith("Error: SchemaOutOfDateError: ")


def test_check_and_upgrade_report_in_one_line(url: str, tmp_path: Path) -> None:
    before = run_cli("check", cwd=tmp_path, url=url)
    assert before.returncode == 1
    assert before.stderr.strip().count("\n") == 0 and "agent-store upgrade" in before.stderr
    assert "Traceback" not in before.stderr
    assert run_cli("upgrade", cwd=tmp_path, url=url).returncode == 0
    after = run_cli("check", cwd=tmp_path, url=url)
    assert after.returncode == 0 and after.stdout.startswith("ok:")


def test_a_bad_url_fails_in_one_line_without_the_password(tmp_path: Path) -> None:
    done = run_cli("check", "--url", "mysql://app:s3cret@db/x", cwd=tmp_path)
    assert done.returncode == 1
    assert "ConfigurationError" in done.stderr and "s3cret" not in done.stderr and "Traceback" not in done.stderr


async def test_tool_calls_are_counted_in_their_table_where_the_view_shows_one_per_message(store: Store) -> None:
    parallel = Message(role="assistant", contents=[
        Content.from_function_call(call_id="c1", name="weather", arguments="{}"),
        Content.from_function_call(call_id="c2", name="clock", arguments="{}"),
        Content.from_function_call(call_id="c3", name="weather", arguments='{"city": "上海"}'),
    ])  # fmt: skip
    answers = Message(
        role="tool", contents=[Content.from_function_result(call_id=c, result="ok") for c in ("c1", "c2", "c3")]
    )
    async with store.session("s", user_id="u") as session:
        session.state["in_memory"]["messages"] += [Message(role="user", contents=["go"]), parallel, answers]
    counted = await rows(store, doc_block("docs/schema-and-sql.md", "tool-calls-per-tool").strip().rstrip(";"))
    assert sorted(counted) == [("clock", 1), ("weather", 2)]
    shown = await rows(store, "SELECT tool_name FROM agent_transcript WHERE session_id = 's' AND seq = 1")
    assert shown == [("clock",)]  # one name for three parallel calls: what the docs warn of
