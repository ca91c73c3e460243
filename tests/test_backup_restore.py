"""Backups that restore (issue 42 point 1), on both backends, through the real CLI: a backup taken while another
task writes restores into a new database whole; a user erased after the backup is erased again by the restore
(from the old store's erasure log, or from the log written to a file), while a user who came back after an
earlier erasure keeps what they stored since; a restore never writes over a store; bad input is one line."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from agent_framework import Agent, WorkflowCheckpoint
from cli_support import cli, ok
from conftest import fresh_database
from helpers import rows, until

from agent_store import Store
from agent_store.agent_framework import StoreCheckpointStorage
from agent_store.offline import OfflineChatClient

OWNERS = "SELECT user_id, count(*) FROM agent_sessions GROUP BY user_id ORDER BY user_id"


async def turn(store: Store, agent: Agent, sid: str, user: str, text: str) -> None:
    async with store.session(sid, user_id=user) as session:
        session.state["user:seen"] = text
        await agent.run(text, session=session)


async def test_a_restore_brings_back_the_store_without_the_users_erased_since(
    store: Store, url: str, tmp_path: Path
) -> None:
    agent = Agent(client=OfflineChatClient(), name="Bot")
    backend = store.db.dialect
    await turn(store, agent, "cara-old", "cara", "我叫小卡")
    await store.erase_user("cara")  # erased before the backup ...
    await asyncio.sleep(1.1)  # (a run must load more than the clock margin, 1 s, after an erasure to write)
    for sid, user, text in (("ann-1", "ann", "我叫安"), ("ann-2", "ann", "hi"), ("bob-1", "bob", "hello"),
                            ("cara-new", "cara", "我回来了")):  # ... and came back: that stays  # fmt: skip
        await turn(store, agent, sid, user, text)

    await StoreCheckpointStorage(store, user_id="carl").save(
        WorkflowCheckpoint(workflow_name="review", graph_signature_hash="g", checkpoint_id="cp-carl")
    )
    await store.usage.set_budget(1000, user_id="fay")

    async def keep_writing() -> None:
        for n in range(30):
            await turn(store, agent, "bob-busy", "bob", f"turn {n}")

    writing = asyncio.create_task(keep_writing())

    async def a_turn_written() -> bool:  # the backup is taken while the writer goes on, from its first turn
        return (await rows(store, "SELECT count(*) FROM agent_messages WHERE session_id = 'bob-busy'"))[0][0] > 0

    await until(a_turn_written, "the writer's first turn")
    backup = tmp_path / "store.backup"
    said = json.loads(ok(cli("backup", "-o", str(backup), "--json", url=url, cwd=tmp_path)))
    await writing
    assert said == {"file": str(backup), "bytes": backup.stat().st_size} and said["bytes"] > 0
    await store.erase_user("ann")  # after the backup
    await store.erase_user("carl")  # only checkpoints ...
    await store.erase_user("fay")  # ... only a budget: found all the same
    await turn(store, agent, "bob-2", "bob", "after the backup")
    log = tmp_path / "erasures.jsonl"
    assert ok(cli("erasures", "-o", str(log), url=url, cwd=tmp_path)).strip() == f"wrote 4 erasures to {log}"

    for n, source in enumerate([url, str(log), None]):
        async with fresh_database(backend, tmp_path / f"t{n}") as target:
            (tmp_path / f"t{n}").mkdir(exist_ok=True)
            args = ["restore", str(backup), *([] if source is None else ["--erasures-from", source])]
            out = ok(cli(*args, url=target, cwd=tmp_path))
            async with Store.from_url(target) as restored:
                await restored.db.check_schema()
                owners = dict(await rows(restored, OWNERS))
                busy = await rows(restored, "SELECT count(*) FROM agent_messages WHERE session_id = 'bob-busy'")
                cara = [m.text for m in (await restored.load("cara-new", user_id="cara")).history]
                ann_keys = await rows(restored, "SELECT count(*) FROM agent_user_state WHERE user_id = 'ann'")
                left = await rows(restored, "SELECT (SELECT count(*) FROM agent_checkpoints WHERE user_id = 'carl'),"
                                            " (SELECT count(*) FROM agent_usage_budgets WHERE subject = 'fay')")
                if source is not None:
                    assert out.strip().endswith("; 3 users erased since the backup were erased again")
                    assert "ann" not in owners and ann_keys == [(0,)] and left == [(0, 0)]  # nothing of them
                    # the fence holds there too: their erasures are on record in the restored store
                    assert len(await rows(restored, "SELECT user_key FROM agent_erasures")) == 4
                else:
                    assert owners["ann"] == 2 and left == [(1, 1)]  # without the log they are back: why it is needed
                    fixed = ok(cli("erasures", "--apply-from", str(log), url=target, cwd=tmp_path))
                    assert fixed.strip() == "3 users erased since were erased again"  # after the fact, too
                assert owners["bob"] == 2 and owners["cara"] == 1 and "bob-2" not in owners
                assert cara[0] == "我回来了"  # came back after an earlier erasure: kept
                assert busy[0][0] % 2 == 0 and busy[0][0] >= 2  # whole turns only: a consistent copy
            again = cli("restore", str(backup), url=target, cwd=tmp_path)  # never over a store
            assert again.returncode == 1 and again.stderr.startswith("Error: ") and "Traceback" not in again.stderr


async def test_bad_backups_and_restores_are_one_line_errors(store: Store, url: str, tmp_path: Path) -> None:
    taken = tmp_path / "taken.backup"
    taken.write_text("not a backup")
    exists = cli("backup", "-o", str(taken), url=url, cwd=tmp_path)
    assert exists.returncode == 1 and "exists" in exists.stderr and taken.read_text() == "not a backup"
    async with fresh_database(store.db.dialect, tmp_path) as target:
        garbage = cli("restore", str(taken), url=target, cwd=tmp_path)
        assert garbage.returncode == 1 and len(garbage.stderr.strip().splitlines()) == 1
        missing = cli("restore", str(tmp_path / "none.backup"), url=target, cwd=tmp_path)
        assert missing.returncode == 1 and "no backup file" in missing.stderr
    bad_log, future_log = tmp_path / "bad.jsonl", tmp_path / "future.jsonl"
    bad_log.write_text('{"user_key": "x", "erased_at": "2026-01-01T00:00:00+00:00"}\n')
    future_log.write_text(json.dumps({"user_key": "a" * 64, "erased_at": "2099-01-01T00:00:00+00:00"}) + "\n")
    backup = tmp_path / "ok.backup"
    ok(cli("backup", "-o", str(backup), url=url, cwd=tmp_path))
    async with fresh_database(store.db.dialect, tmp_path / "t") as target:
        (tmp_path / "t").mkdir(exist_ok=True)
        for log, said in ((bad_log, "not an erasure log entry"), (future_log, "dated in the future"),
                          (tmp_path / "mistyped.jsonl", "not an erasure log")):  # fmt: skip
            refused = cli("restore", str(backup), "--erasures-from", str(log), url=target, cwd=tmp_path)
            assert refused.returncode == 1 and said in refused.stderr
            assert cli("check", url=target, cwd=tmp_path).returncode == 1  # checked first: nothing was restored
        ok(cli("restore", str(backup), url=target, cwd=tmp_path))  # so the right restore can still be made
    if store.db.dialect == "sqlite":  # a damaged page: refused at the restore, not at the first read after it
        damaged = bytearray(backup.read_bytes())
        damaged[4096 * 3 : 4096 * 3 + 200] = b"\xff" * 200
        broken = tmp_path / "damaged.backup"
        broken.write_bytes(bytes(damaged))
        target = f"sqlite+aiosqlite:///{tmp_path}/from-damaged.db"
        refused = cli("restore", str(broken), url=target, cwd=tmp_path)
        assert refused.returncode == 1 and "damaged" in refused.stderr and not (tmp_path / "from-damaged.db").exists()


def test_pg_dump_and_pg_restore_refuse_a_pgbouncer_url(tmp_path: Path) -> None:
    """Behind PgBouncer in transaction mode their session settings and snapshot do not hold: said, nothing run."""
    url = "postgresql+asyncpg://app@127.0.0.1:6439/agents?pgbouncer=true"  # never reached: refused before
    for args in (["backup", "-o", str(tmp_path / "b.backup")], ["restore", str(tmp_path / "b.backup")]):
        if args[0] == "restore":
            (tmp_path / "b.backup").write_bytes(b"PGDMP")
        done = cli(*args, url=url, cwd=tmp_path)
        assert done.returncode == 1 and "needs a direct connection to the server" in done.stderr, done.stderr

