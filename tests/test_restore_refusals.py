"""A restore over a store is refused in one sentence that says why, on both backends, and nothing is changed."""

from __future__ import annotations

from pathlib import Path

from cli_support import cli, ok
from helpers import rows

from agent_store import Store


async def test_a_restore_into_a_database_that_holds_a_store_is_one_line(filled: Store, url: str,
                                                                        tmp_path: Path) -> None:  # fmt: skip
    backup = tmp_path / "ok.backup"
    ok(cli("backup", "-o", str(backup), url=url, cwd=tmp_path))
    before = await rows(filled, "SELECT count(*) FROM agent_messages")
    refused = cli("restore", str(backup), url=url, cwd=tmp_path)
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    said = refused.stderr
    assert ("tables already: restore into an empty database" in said) if url.startswith("postgresql") \
        else ("exists" in said)  # fmt: skip
    assert await rows(filled, "SELECT count(*) FROM agent_messages") == before
