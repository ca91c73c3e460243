"""`agent-store backup`, `restore` and `erasures`: a copy of the store that restores with its erasures applied
(operations/backup.py says how each backend does it)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import click

from agent_store.cli.support import json_option, open_store, print_json, runs_async, url_option
from agent_store.db.urls import resolve_url
from agent_store.errors import redact
from agent_store.operations import backup as backups


@click.command()
@url_option
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The backup file (never overwritten; whole or absent).")  # fmt: skip
@json_option
@runs_async
async def backup(url: str | None, output: Path, as_json: bool) -> None:
    """Back up the store, safely while it is in use (SQLite: online backup; PostgreSQL: pg_dump)."""
    backups.direct_only(resolve_url(url), "pg_dump")
    async with open_store(url) as store:  # the database is there and reachable; the copy is made apart
        await store.db.check_schema()
        size = await backups.backup(store.url, output)
    print_json({"file": str(output), "bytes": size}) if as_json else click.echo(f"backed up to {output} ({size} bytes)")


@click.command()
@url_option
@click.argument("source", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--erasures-from", "erasures_from", default=None, metavar="URL|FILE",
              help="The store the backup was taken of (its URL), or its erasure log (`agent-store erasures -o`): "
                   "users erased since the backup are erased again.")  # fmt: skip
@json_option
@runs_async
async def restore(url: str | None, source: Path, erasures_from: str | None, as_json: bool) -> None:
    """Restore a backup into a database that holds nothing yet (--url), then re-apply the erasures made since.

    Restore before the app uses the database: the erasures are re-applied before this command returns."""
    target = resolve_url(url)
    backups.direct_only(target, "pg_restore")
    log = None if erasures_from is None else backups.checked_log(await _erasure_log(erasures_from))  # before anything
    await backups.restore(source, target)
    again: list[str] = []
    if log is not None:
        async with open_store(url) as store:
            again = await backups.reapply_erasures(store.db, log)
    if as_json:
        print_json({"restored": str(source), "url": redact(target), "erased_again": len(again)})
        return
    tail = "" if erasures_from is None else f"; {len(again)} users erased since the backup were erased again"
    click.echo(f"restored {source} into {redact(target)}{tail}")


async def _erasure_log(where: str) -> list[dict[str, object]]:
    """A URL (it has ``://``) names the store to read it from; anything else is a log file."""
    if "://" not in where:
        return await asyncio.to_thread(backups.read_log_file, Path(where))
    async with open_store(where) as source:
        return await backups.erasure_log(source.db)


@click.command()
@url_option
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="File (default: stdout).")  # fmt: skip
@click.option("--apply-from", "apply_from", default=None, metavar="URL|FILE",
              help="Instead: erase again, in this store, the users another store's log (or a log file) erased "
                   "after their rows here (after a point-in-time recovery or a restore made without it).")  # fmt: skip
@runs_async
async def erasures(url: str | None, output: Path | None, apply_from: str | None) -> None:
    """Write the erasure log (a SHA-256 of each erased user id, and when) as JSON Lines: keep it beside the
    backups, for `restore --erasures-from FILE`. With --apply-from, re-apply such a log to this store."""
    if apply_from is not None:
        entries = backups.checked_log(await _erasure_log(apply_from))
        async with open_store(url) as store:
            again = await backups.reapply_erasures(store.db, entries)
        click.echo(f"{len(again)} users erased since were erased again")
        return
    async with open_store(url) as store:
        log = await backups.erasure_log(store.db)
    text = "".join(json.dumps(entry) + "\n" for entry in log)
    if output is None:
        click.echo(text, nl=False)
        return
    await asyncio.to_thread(output.write_text, text, encoding="utf-8")
    click.echo(f"wrote {len(log)} erasures to {output}")
