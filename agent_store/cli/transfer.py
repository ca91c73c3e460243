"""`agent-store export`, `import`, `purge` and `erase-user`: data in bulk, out of and into a store."""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

import click

from agent_store.cli.support import (
    confirm,
    json_option,
    open_store,
    print_json,
    progress,
    runs_async,
    url_option,
    user_option,
    yes_option,
)


@click.command()
@url_option
@user_option
@click.option("--all-users", is_flag=True, help="Every user's sessions and rows: the whole store.")
@click.option("--session", "session_id", default=None, help="Only this session (default: all of the user's).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="File (default: stdout). Written whole or not at all.")  # fmt: skip
@json_option
@runs_async
async def export(url: str | None, user_id: str | None, all_users: bool, session_id: str | None, output: Path | None,
                 as_json: bool) -> None:  # fmt: skip
    """Write sessions as JSON Lines (lossless; `agent-store import` reads them back).

    --user ID exports that user's sessions and rows, --all-users every user's, neither the sessions that have no
    user. With -o FILE a summary is printed ({"sessions", "lines", "file"} with --json); the file appears only when
    the export is complete. On stdout the export itself is the output (a failure midway has printed part of
    it, with no trailer line, and exits 1). An export that finds nothing to export (the whole store, or the
    sessions without a user) says so and exits 1; a user with nothing stored is an empty export.
    """
    if all_users and (user_id is not None or session_id is not None):
        raise click.UsageError("--all-users exports every user's sessions: give no --user or --session with it")
    partial = None if output is None else output.with_name(output.name + ".partial")
    try:
        async with open_store(url) as store:
            lines = store.export(user_id=user_id, session_id=session_id, all_users=all_users)
            header = await anext(lines)  # a failure (no such session, ...) comes before any file is made
            with _opened(partial) as sink, progress("exporting", json.loads(header)["sessions"]) as advance:
                sink.write(header + "\n")
                written = 1
                async for line in lines:
                    sink.write(line + "\n")
                    written += 1
                    advance(line.startswith('{"kind": "session"'))
    except BaseException:
        if partial is not None and partial.exists():
            partial.unlink()
        raise
    count = json.loads(line)["sessions"]
    if written <= 2 and user_id is None and session_id is None:  # the header and the trailer: nothing found
        if partial is not None:
            partial.unlink(missing_ok=True)  # no file for an export that found nothing
        hint = "the store holds nothing" if all_users else "no session without a user; give --user ID or --all-users"
        raise click.ClickException(f"nothing exported: {hint}")
    if partial is not None and output is not None:
        partial.replace(output)  # the whole export, at once
        summary = {"sessions": count, "lines": written, "file": str(output)}
        print_json(summary) if as_json else click.echo(f"exported {_sessions(count)} ({written} lines) to {output}")


def _sessions(n: int) -> str:
    return f"{n} session" + ("" if n == 1 else "s")


@contextmanager
def _opened(path: Path | None) -> Iterator[TextIO]:
    """The file to write (stdout when None); a path that cannot be written is click's one-line FileError."""
    if path is None:
        yield sys.stdout
        return
    try:
        sink = path.open("w", encoding="utf-8")
    except OSError as exc:
        raise click.FileError(str(path), hint=exc.strerror or str(exc)) from exc
    with sink:
        yield sink


@click.command(name="import")
@url_option
@click.argument("source", type=click.File("r", encoding="utf-8"))
@json_option
@runs_async
async def import_(url: str | None, source: Any, as_json: bool) -> None:
    """Recreate sessions from an export, all or nothing; sessions that exist already are skipped."""
    try:  # read as it goes (a whole store's export need not fit in memory); the header says how many sessions
        first = source.readline()
        try:
            total = int(json.loads(first).get("sessions", 0))
        except (ValueError, TypeError, AttributeError):
            total = 0  # not a header: the import says so
        async with open_store(url) as store:
            with progress("importing", total) as advance:
                report = await store.import_lines(itertools.chain([first], source), progress=advance)
    except UnicodeDecodeError as exc:
        raise click.BadParameter(f"{source.name} is not UTF-8 text (an agent-store export is): {exc.reason}") from exc
    print_json(report.model_dump()) if as_json else click.echo(f"imported {report.imported}, skipped {report.skipped}")


@click.command()
@url_option
@click.option("--batch-size", type=click.IntRange(1, 100_000), default=500, show_default=True)
@click.option(
    "--checkpoints-older-than", "checkpoint_days", type=click.IntRange(0, 36_500), default=None, metavar="DAYS",
    help="Also delete workflow checkpoints saved more than DAYS ago (each workflow's latest is kept).",
)  # fmt: skip
@yes_option
@json_option
@runs_async
async def purge(url: str | None, batch_size: int, checkpoint_days: int | None, yes: bool, as_json: bool) -> None:
    """Delete expired sessions (and, if asked, old workflow checkpoints) in small batches."""
    what = "expired sessions" + (f" and workflow checkpoints older than {checkpoint_days} days" if checkpoint_days
                                 is not None else "")  # fmt: skip
    confirm(yes, f"Delete the {what}?", unattended=True)  # a schedule runs it with no terminal
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
@yes_option
@json_option
@runs_async
async def erase_user(url: str | None, user_id: str, yes: bool, as_json: bool) -> None:
    """Erase USER_ID (a GDPR erasure): every session with its messages, state, runs and tool calls; the user's
    `user:` keys, workflow checkpoints, AG-UI snapshots, run journals, hosted responses, budget and usage rows.

    In short transactions (run it again if interrupted). Runs that loaded before it can no longer write for the
    user (the erasure fence), and the erasure is logged (a SHA-256 of the id) for `restore --erasures-from`.
    With per-user keys ($AGENT_STORE_KEYS), the user's keys are destroyed too: every backup's copy goes dark."""
    confirm(yes, f"Erase everything stored for user {user_id!r}?")
    async with open_store(url) as store:
        report = await store.erase_user(user_id)
    if as_json:
        print_json(report.model_dump())
        return
    state_rows = report.state_rows + report.user_state_rows
    shredded = f", {report.keys_destroyed} keys destroyed" if report.keys_destroyed else ""  # $AGENT_STORE_KEYS
    click.echo(f"erased user {user_id}: {report.sessions} sessions, {report.messages} messages, {state_rows} state "
               f"rows, {report.usage_calls} model calls{shredded}")  # fmt: skip
