"""The README is the front door: its quick start, its SQL and its commands run here, on both backends."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI
from sqlalchemy import text

from agent_store import Store

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
QUICKSTART_URL = "sqlite+aiosqlite:///chat.db"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def run_cli(*args: str, cwd: Path, url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AGENT_STORE_URL"}
    if url is not None:
        env["AGENT_STORE_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "agent_store", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )


def test_the_readme_has_the_blocks_these_tests_run() -> None:
    assert len(blocks("python")) == len(EXAMPLES) == 14
    assert len(blocks("sql")) == 8


def run_example(source: str, url: str, cwd: Path) -> list[str]:
    """Run one README program against ``url``; returns its printed lines."""
    assert source.count(QUICKSTART_URL) >= 1
    script = cwd / "example.py"
    script.write_text(source.replace(QUICKSTART_URL, url), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=cwd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def examples() -> list[object]:
    """Each python block of the README, named after the heading above it."""
    found: list[object] = []
    for section in re.split(r"^#+ ", README, flags=re.M)[1:]:
        title = section.splitlines()[0]
        for source in re.findall(r"```python\n(.*?)```", section, flags=re.S):
            found.append(pytest.param(source, id=re.sub(r"\W+", "-", title.lower()).strip("-")))
    return found


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
    run_example(blocks("python")[0], url, tmp_path)
    _checkpoints, transcript, sessions, matching, state = blocks("sql")[:5]
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


async def test_the_readme_checkpoint_chain_query_runs_on_its_example_s_data(url: str, tmp_path: Path) -> None:
    (example,) = [source for source in blocks("python") if "StoreCheckpointStorage(store" in source]
    run_example(example, url, tmp_path)
    async with Store.from_url(url) as store, store.engine.connect() as conn:
        chain = (await conn.execute(text(blocks("sql")[0].strip().rstrip(";")))).all()
    assert [r[0] for r in chain] == list(range(1, len(chain) + 1)) and len(chain) >= 2
    assert chain[0][2] is None and [r[2] for r in chain[1:]] == [r[1] for r in chain[:-1]]


def test_the_demo_runs_offline_and_remembers_across_processes(url: str, tmp_path: Path) -> None:
    done = run_cli("demo", cwd=tmp_path, url=url)
    assert done.returncode == 0, done.stderr
    assert "process A] user: 我叫李明  ->  Assistant: 你好，李明！" in done.stdout
    assert "process B] user: 我叫什么名字？  ->  Assistant: 你叫李明。" in done.stdout
    assert "turn_count=2" in done.stdout
    assert "Translator: [译]" in done.stdout and "Summarizer: 摘要：" in done.stdout


def test_the_demo_uses_the_embedded_default_without_a_url(tmp_path: Path) -> None:
    done = run_cli("demo", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "agent_store.db").is_file()
    assert "你叫李明。" in done.stdout


def test_check_and_upgrade_report_in_one_line(url: str, tmp_path: Path) -> None:
    before = run_cli("check", cwd=tmp_path, url=url)
    assert before.returncode == 1
    assert before.stderr.strip().count("\n") == 0 and "agent-store upgrade" in before.stderr
    assert "Traceback" not in before.stderr
    assert run_cli("upgrade", cwd=tmp_path, url=url).returncode == 0
    after = run_cli("check", cwd=tmp_path, url=url)
    assert after.returncode == 0 and after.stdout.startswith("ok:")


def test_a_bad_url_fails_in_one_line_without_the_password(tmp_path: Path) -> None:
    done = run_cli("check", "--url", "postgresql://app:s3cret@db/x", cwd=tmp_path)
    assert done.returncode == 1
    assert "ConfigurationError" in done.stderr and "s3cret" not in done.stderr and "Traceback" not in done.stderr
