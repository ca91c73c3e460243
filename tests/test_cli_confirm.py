"""Every destructive command asks the same way (issue 37, item 8): on a terminal it asks, unless --yes (or -y);
with no terminal it never waits. Off a terminal, one session's delete, clear and truncate and one checkpoint's
delete go ahead as scripts have always run them; a whole user's erasure and a downgrade need --yes."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_support import cli, filled, ok  # noqa: F401  (filled is a fixture)

from agent_store import Store

DESTRUCTIVE = {  # command -> (arguments, the question's start)
    "delete": (["delete", "chat-2", "--user", "li"], "Delete session 'chat-2'"),
    "clear": (["clear", "chat-2", "--user", "li"], "Delete every message of 'chat-2'"),
    "truncate": (["truncate", "chat-2", "--user", "li", "--after-seq", "0"], "Drop the messages of 'chat-2'"),
    "erase-user": (["erase-user", "wang"], "Erase everything stored for user 'wang'"),
    "checkpoints delete": (["checkpoints", "delete", "cp", "--user", "li"], "Delete checkpoint 'cp'"),
    "purge": (["purge"], "Delete the expired sessions"),
}


def on_a_terminal(args: list[str], url: str, cwd: Path, answer: str | None) -> tuple[int, str]:
    """Run the CLI with stdin and stderr on a pseudo-terminal; type ``answer`` once the question shows."""
    master, slave = pty.openpty()
    env = {**os.environ, "AGENT_STORE_URL": url}
    process = subprocess.Popen([sys.executable, "-m", "agent_store", *args], cwd=cwd, env=env, stdin=slave,
                               stderr=slave, stdout=subprocess.PIPE)  # fmt: skip
    os.close(slave)
    seen, deadline = b"", time.monotonic() + 60
    try:
        while process.poll() is None and time.monotonic() < deadline:
            try:
                seen += os.read(master, 4096)
            except OSError:
                break
            if answer is not None and b"[y/N]" in seen:
                os.write(master, answer.encode() + b"\n")
                answer = None
        process.wait(timeout=60)
        return process.returncode, seen.decode(errors="replace")
    finally:
        os.close(master)


async def _counts(store: Store) -> int:
    return len((await store.list_sessions(user_id="li")).items)


@pytest.mark.parametrize("command", sorted(DESTRUCTIVE))
def test_on_a_terminal_every_destructive_command_asks_and_no_keeps_everything(
    filled: Store, url: str, tmp_path: Path, command: str  # noqa: F811
) -> None:
    args, question = DESTRUCTIVE[command]
    code, seen = on_a_terminal(args, url, tmp_path, answer="n")
    assert question in seen and code == 1, seen
    code, seen = on_a_terminal([*args, "--yes"], url, tmp_path, answer=None)  # --yes: no question
    assert question not in seen, seen
    assert code == (1 if command == "checkpoints delete" else 0), seen  # (no such checkpoint: not found)


async def test_no_on_a_terminal_leaves_the_session_and_yes_deletes_it(
    filled: Store, url: str, tmp_path: Path  # noqa: F811
) -> None:
    before = await _counts(filled)
    code, _ = on_a_terminal(DESTRUCTIVE["delete"][0], url, tmp_path, answer="n")
    assert code == 1 and await _counts(filled) == before
    code, _ = on_a_terminal(DESTRUCTIVE["delete"][0], url, tmp_path, answer="y")
    assert code == 0 and await _counts(filled) == before - 1


def test_off_a_terminal_nothing_waits(filled: Store, url: str, tmp_path: Path) -> None:  # noqa: F811
    # one session's commands go ahead, as scripts have always run them; -y is taken everywhere
    assert json.loads(ok(cli("truncate", "chat-1", "--user", "li", "--after-seq", "1", "-y", "--json", url=url,
                             cwd=tmp_path)))["ok"] is True  # fmt: skip
    assert json.loads(ok(cli("clear", "chat-1", "--user", "li", "--json", url=url, cwd=tmp_path)))["ok"] is True
    # a whole user's erasure refuses without --yes, at once
    refused = cli("erase-user", "wang", url=url, cwd=tmp_path, stdin="")
    assert refused.returncode != 0 and "--yes" in refused.stderr
