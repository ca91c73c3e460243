"""`agent-store export`, `import`, `purge` and `erase-user`: data in bulk, out of and into a store."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from typing import Any

import click

from agent_store.cli.support import json_option, open_store, print_json, progress, runs_async, url_option, user_option


@click.command()
@url_option
@user_option
@click.option("--session", "session_id", default=None, help="Only this session (default: all of the user's).")
@click.option("-o", "--output", type=click.File("w", encoding="utf-8", lazy=True), default="-",
              help="File (default: stdout).")  # fmt: skip
@json_option
@runs_async
async def export(url: str | None, user_id: str | None, session_id: str | None, output: Any, as_json: bool) -> None:
    """Write sessions as JSON Lines (lossless; `agent-store import` reads them back).

    With -o FILE a summary is printed ({"sessions", "lines", "file"} with --json); on stdout the export itself
    is the output.
    """
    async with open_store(url) as store:
        lines = store.export(user_id=user_id, session_id=session_id)
        header = await anext(lines)  # a failure (no such session, ...) comes before the file is created
        output.write(header + "\n")
        written = 1
        with progress("exporting", json.loads(header)["sessions"]) as advance:
            async for line in lines:
                output.write(line + "\n")
                written += 1
                advance(line.startswith('{"kind": "session"'))
    getattr(output, "close_intelligently", lambda: None)()  # the file, never stdout
    if output.name in ("-", "<stdout>"):
        return
    summary = {"sessions": json.loads(line)["sessions"], "lines": written, "file": output.name}
    if as_json:
        print_json(summary)
    else:
        click.echo(f"exported {summary['sessions']} sessions ({written} lines) to {output.name}")


@click.command(name="import")
@url_option
@click.argument("source", type=click.File("r", encoding="utf-8"))
@json_option
@runs_async
async def import_(url: str | None, source: Any, as_json: bool) -> None:
    """Recreate sessions from an export, all or nothing; sessions that exist already are skipped."""
    try:
        lines = source.readlines()
    except UnicodeDecodeError as exc:
        raise click.BadParameter(f"{source.name} is not UTF-8 text (an agent-store export is): {exc.reason}") from exc
    async with open_store(url) as store:
        total = sum(1 for line in lines if line.startswith('{"kind": "session"'))
        with progress("importing", total) as advance:
            report = await store.import_lines(lines, progress=advance)
    print_json(report.model_dump()) if as_json else click.echo(f"imported {report.imported}, skipped {report.skipped}")


@click.command()
@url_option
@click.option("--batch-size", type=click.IntRange(1, 100_000), default=500, show_default=True)
@click.option(
    "--checkpoints-older-than", "checkpoint_days", type=click.IntRange(0, 36_500), default=None, metavar="DAYS",
    help="Also delete workflow checkpoints saved more than DAYS ago (each workflow's latest is kept).",
)  # fmt: skip
@json_option
@runs_async
async def purge(url: str | None, batch_size: int, checkpoint_days: int | None, as_json: bool) -> None:
    """Delete expired sessions (and, if asked, old workflow checkpoints) in small batches."""
    async with open_store(url) as store:
        with progress("purging", await store.count_expired()) as advance:
            removed = await store.purge_expired(batch_size=batch_size, progress=advance)
        old = None
        if checkpoint_days is not None:
            old = await store.purge_checkpoints(timedelta(days=checkpoint_days), batch_size=batch_size)
    if as_json:
        print_json({"purged": removed, **({"checkpoints": old} if old is not None else {})})
        return
    click.echo(f"purged {removed} expired sessions" + (f" and {old} workflow checkpoints" if old is not None else ""))


@click.command(name="erase-user")
@url_option
@click.argument("user_id")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
@runs_async
async def erase_user(url: str | None, user_id: str, yes: bool, as_json: bool) -> None:
    """Delete every session, message and state row of USER_ID."""
    if not yes:
        if not sys.stdin.isatty():
            raise click.UsageError("refusing to erase without --yes when not on a terminal")
        click.confirm(f"Erase everything stored for user {user_id!r}?", abort=True, err=True)
    async with open_store(url) as store:
        report = await store.erase_user(user_id)
    if as_json:
        print_json(report.model_dump())
        return
    click.echo(f"erased user {user_id}: {report.sessions} sessions, {report.messages} messages, "
               f"{report.state_rows + report.user_state_rows} state rows")  # fmt: skip
