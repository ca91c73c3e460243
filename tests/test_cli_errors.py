"""Every command through every bad input: one ``Error: <Type>: <reason>`` line, exit status 1, never a traceback;
with ``--json``, ``{"ok": false, "error", "message", "retryable"}`` on stdout.

The walk runs the real root group in-process (click's runner: hundreds of cases in seconds); a few cases go
through the installed entry point in a subprocess as well, to show the runner hides nothing.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest
from agent_framework import Message
from click.testing import CliRunner
from helpers import expire_now
from sqlalchemy.engine import make_url

from agent_store import Store
from agent_store.cli import main

ONE_LINE = re.compile(r"Error: (\w+): \S.*\n")
COMMANDS: list[list[str]] = [
    ["check"], ["upgrade"], ["downgrade", "0012", "--yes"], ["sessions", "--all-users"], ["show", "s"],
    ["fork", "s"], ["truncate", "s", "--after-seq", "0"], ["clear", "s"], ["close", "s"], ["delete", "s"],
    ["update", "s", "--title", "t"], ["export"], ["purge"], ["erase-user", "u", "--yes"], ["stats"],
    ["search", "x", "--all-users"], ["checkpoints", "list", "w"], ["checkpoints", "show", "c"],
    ["checkpoints", "delete", "c"], ["ui", "--port", "0"], ["demo"],
]  # fmt: skip
CREATING = {"upgrade", "demo"}  # the commands that may bring a new SQLite file into being


def invoke(args: list[str], *, as_json: bool) -> tuple[str, dict[str, Any] | None]:
    """Run one failing command line; returns the error type, and the JSON object when --json was given."""
    done = CliRunner().invoke(main, [*args, *(["--json"] if as_json else [])], env={"AGENT_STORE_URL": None})
    assert done.exit_code == 1, (args, done.output, done.exception)
    assert "Traceback" not in done.output + done.stderr, args
    line = ONE_LINE.fullmatch(done.stderr)
    assert line, (args, done.stderr)
    if not as_json:
        assert done.stdout == "", args
        return line[1], None
    answer = json.loads(done.stdout)
    assert answer["ok"] is False and answer["error"] == line[1] and isinstance(answer["retryable"], bool), args
    assert answer["message"] and "\n" not in answer["message"]
    return line[1], answer


def walk(url: str, expected: str, *, skip: set[str] = frozenset(), retryable: bool = False) -> None:  # type: ignore[assignment]
    """Each command (URL before the subcommand for half of them, after it for the rest), plain and --json."""
    for i, command in enumerate(c for c in COMMANDS if c[0] not in skip):
        args = ["--url", url, *command] if i % 2 else [*command, "--url", url]
        for as_json in (False, True):
            kind, answer = invoke(args, as_json=as_json)
            assert kind == expected, (command, kind)
            assert answer is None or answer["retryable"] is retryable, command
            assert "s3cret" not in json.dumps(answer), command


@pytest.mark.parametrize(
    ("url", "expected", "retryable"),
    [
        pytest.param("notaurl s3cret", "ConfigurationError", False, id="malformed"),
        pytest.param("mysql://app:s3cret@db/x", "ConfigurationError", False, id="another-database"),
        pytest.param("postgres://app:s3cret@db/x?sslmode=maybe", "ConfigurationError", False, id="bad-sslmode"),
        pytest.param("sqlite+aiosqlite:///:memory:", "ConfigurationError", False, id="in-memory"),
        pytest.param("postgresql://app:s3cret@127.0.0.1:1/x", "StorageUnavailableError", True, id="unreachable"),
    ],
)
def test_a_bad_url_fails_every_command_in_one_line(url: str, expected: str, retryable: bool) -> None:
    walk(url, expected, retryable=retryable)


def test_a_missing_sqlite_file_is_named_and_never_created(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    walk(f"sqlite:///{missing}", "ConfigurationError", skip=CREATING)
    assert not missing.exists()
    kind, answer = invoke(["upgrade", "--url", f"sqlite:///{tmp_path}/not-a-dir.txt/x.db"], as_json=True)
    assert kind == "ConfigurationError" and "folder does not exist" in answer["message"]  # type: ignore[index]


@pytest.mark.parametrize("part", ["database", "role"])
def test_a_missing_database_or_role_fails_every_command(pg_url: str, part: str) -> None:
    base = make_url(pg_url)
    bad = base.set(database="no_such_db_xyz") if part == "database" else base.set(username="no_such_role")
    walk(bad.render_as_string(hide_password=False), "ConfigurationError")


async def test_a_schema_behind_or_ahead_fails_every_command_that_needs_it(url: str, tmp_path: Path) -> None:
    async with Store.from_url(url, check_schema=False) as store:
        await store.migrate("0002")
    await asyncio.to_thread(walk, url, "SchemaOutOfDateError", skip={"upgrade", "downgrade"})
    async with Store.from_url(url, check_schema=False) as store:
        await store.migrate()
        async with store.engine.begin() as conn:
            await conn.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
            # a newer schema that this code would misread (one that only added would let it run: compat.py)
            await conn.exec_driver_sql("UPDATE agent_schema_compat SET oldest_code = '9999'")
    await asyncio.to_thread(walk, url, "SchemaTooNewError")


def test_bad_flags_and_arguments_are_usage_errors(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/x.db"
    assert invoke(["upgrade", "--url", url, "--nope"], as_json=True)[0] == "UsageError"
    for command in COMMANDS:
        assert invoke([*command, "--no-such-flag"], as_json=False)[0] == "UsageError", command
        assert invoke([*command, "--no-such-flag"], as_json=True)[0] == "UsageError", command
    assert invoke(["show"], as_json=False)[0] == "UsageError"  # a missing argument
    assert invoke(["no-such-command"], as_json=True)[0] == "UsageError"
    assert invoke(["import", str(tmp_path / "missing.jsonl"), "--url", url], as_json=True)[0] == "UsageError"
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    CliRunner().invoke(main, ["upgrade", "--url", url])
    assert invoke(["import", str(binary), "--url", url], as_json=False)[0] == "UsageError"


def test_an_unwritable_output_and_a_port_in_use_are_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/x.db"
    assert CliRunner().invoke(main, ["upgrade", "--url", url]).exit_code == 0
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    kind, answer = invoke(["export", "--url", url, "-o", str(blocked / "out.jsonl")], as_json=True)
    assert kind == "FileError" and "out.jsonl" in answer["message"]  # type: ignore[index]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        kind, answer = invoke(["ui", "--url", url, "--port", port], as_json=True)
    assert kind == "ConfigurationError" and f"127.0.0.1:{port}" in answer["message"]  # type: ignore[index]


def test_the_installed_entry_point_behaves_as_the_runner(tmp_path: Path) -> None:
    for args in (["--json", "sessions", "--url", "notaurl"], ["ui", "--url", "mysql://x/y"], ["sessions", "--bad"]):
        done = subprocess.run([sys.executable, "-m", "agent_store", *args], capture_output=True, text=True,
                              cwd=tmp_path, timeout=120)  # fmt: skip
        assert done.returncode == 1 and ONE_LINE.fullmatch(done.stderr), (args, done.stderr)
        assert json.loads(done.stdout)["ok"] is False if "--json" in args else done.stdout == ""


async def test_out_of_range_numbers_are_refused_before_anything_is_done(sqlite_url: str) -> None:
    async with Store.from_url(sqlite_url) as store:
        await store.migrate()
        async with store.session("old", user_id="u") as session:
            session.state["n"] = 1
        await expire_now(store, "old")
    for args in (["purge", "--checkpoints-older-than", "1000000"], ["purge", "--batch-size", "0"],
                 ["update", "old", "--user", "u", "--ttl", "99999999999999999999"],
                 ["sessions", "--all-users", "--user", "u"]):  # fmt: skip
        assert await asyncio.to_thread(invoke, [*args, "--url", sqlite_url], as_json=True) == ("UsageError", ANY)
    async with Store.from_url(sqlite_url) as store:
        assert await store.count_expired() == 1  # the refused purge purged nothing


def test_a_group_takes_the_global_options_too(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/x.db"
    assert CliRunner().invoke(main, ["upgrade", "--url", url]).exit_code == 0
    for args in (
        ["checkpoints", "--url", url, "--json", "list", "w"],
        ["--json", "checkpoints", "list", "w", "--url", url],
    ):
        done = CliRunner().invoke(main, args, env={"AGENT_STORE_URL": None})
        assert done.exit_code == 0 and json.loads(done.stdout) == [], (args, done.stderr)
    helped = " ".join(CliRunner().invoke(main, ["demo", "--help"]).stdout.split())
    assert "never writes into $AGENT_STORE_URL's database" in helped and "default: $AGENT_STORE_URL" not in helped


async def test_a_row_corrupted_outside_the_store_is_a_typed_error(sqlite_url: str) -> None:
    async with Store.from_url(sqlite_url) as store:
        await store.migrate()
        async with store.session("s", user_id="u") as session:
            session.state["in_memory"]["messages"].append(Message(role="user", contents=["hello"]))
        async with store.engine.begin() as conn:  # SQLite keeps JSON as text: anyone's UPDATE can break it
            await conn.exec_driver_sql("UPDATE agent_messages SET body = '{broken' WHERE session_id = 's'")
    dump = Path(make_url(sqlite_url).database or "").with_name("dump.jsonl")
    for command in (["show", "s", "--user", "u"], ["export", "--user", "u", "-o", str(dump)]):
        kind, answer = await asyncio.to_thread(invoke, [*command, "--url", sqlite_url], as_json=True)
        assert kind == "DatabaseError" and "changed outside agent_store" in answer["message"], command  # type: ignore[index]
    assert list(dump.parent.glob("dump.jsonl*")) == []  # a failed export leaves no file, not even a partial one
