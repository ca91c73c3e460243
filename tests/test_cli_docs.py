"""The command-line lines docs/operations.md shows run, in order, on the quick start's data, on both backends."""

from __future__ import annotations

import asyncio
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import doc_block

from agent_store import SessionNotFoundError, Store
from agent_store.cli import main

QUICKSTART_URL = "sqlite+aiosqlite:///agent_store.db"
# said literally
VERBS = ("dropped", "cleared", "closed", "deleted", "imported", "erased", "exported", "ok:", "backed", "wrote")


def documented_lines() -> list[tuple[list[str], str]]:
    """Each `agent-store ...` line of the block: its arguments and the comment saying what it prints."""
    found = []
    for line in doc_block("docs/operations.md", "cli", "bash").splitlines():
        command, _, comment = line.partition("# ")
        words = shlex.split(command)
        assert words[0] == "agent-store", line
        found.append((words[1:], comment.strip()))
    return found


async def test_every_documented_command_line_runs(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    quick_start = doc_block("README.md", "quick-start", "python").replace(QUICKSTART_URL, url)
    (tmp_path / "quick_start.py").write_text(quick_start, encoding="utf-8")
    done = subprocess.run([sys.executable, "quick_start.py"], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    monkeypatch.chdir(tmp_path)  # `-o u1.jsonl` and `import u1.jsonl` use the working directory
    lines = documented_lines()
    assert len(lines) >= 15
    for args, comment in lines:
        result = await asyncio.to_thread(CliRunner().invoke, main, args, env={"AGENT_STORE_URL": url})
        assert result.exit_code == 0, (args, result.stderr)
        if comment.startswith(VERBS):
            assert result.stdout.startswith(comment.split()[0]), (args, result.stdout)
        if args[0] == "update":  # read back with the library: the command did what the line says
            async with Store.from_url(url) as store:
                info = await store.get("chat-42", user_id="u1")
            assert (info.title, info.metadata, info.expires_at is not None) == ("李明", {"topic": "greeting"}, True)
    async with Store.from_url(url) as store:
        for gone in ("chat-42", "chat-42-b"):  # deleted, then erased with its user
            with pytest.raises(SessionNotFoundError):
                await store.get(gone, user_id="u1")
        await store.db.check_schema()  # back at head after the downgrade and upgrade
