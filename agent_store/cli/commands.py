"""The `agent-store` command line: operate a store from a shell.

Human output is a table; ``--json`` prints machine-readable JSON. Long work shows a progress bar on a
terminal and stays quiet when piped. Errors print one line and exit with status 1 (no traceback).
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from typing import Any

import click

from agent_store.cli.checkpoints import checkpoints
from agent_store.cli.search import search, ui
from agent_store.cli.support import json_option, print_json, print_table, progress, runs_async, url_option, user_option
from agent_store.errors import redact
from agent_store.store import Store


@click.group()
@click.version_option(package_name="agent-store")
def main() -> None:
    """Durable Agent Framework sessions in SQLite or PostgreSQL."""


@main.command()
@url_option
@click.option("--step", type=click.Choice(["all", "turn-two"]), default="all", hidden=True)
@click.option("--chat-id", default=None, hidden=True)
@json_option
@runs_async
async def demo(url: str | None, step: str, chat_id: str | None, as_json: bool) -> None:
    """Run the sessions scenario offline: remember a name across processes, state, shared agents, SQL."""
    from agent_store.cli.demo import run_demo, turn_two

    lines: list[str] = []
    say = lines.append if as_json else click.echo
    if step == "turn-two" and chat_id:
        await turn_two(url, chat_id, say)
    else:
        await run_demo(url, say)
    if as_json:
        print_json({"ok": True, "output": lines})


@main.command()
@url_option
@click.argument("revision", default="head")
@json_option
@runs_async
async def upgrade(url: str | None, revision: str, as_json: bool) -> None:
    """Migrate the database schema to REVISION (default: head)."""
    async with Store.from_url(url, check_schema=False) as store:
        await store.migrate(revision)
        reached = await store.db.revision()
        where = redact(store.url)
    print_json({"url": where, "revision": reached}) if as_json else click.echo(f"{where}: schema at {reached}")


@main.command()
@url_option
@json_option
@runs_async
async def check(url: str | None, as_json: bool) -> None:
    """Connect and verify the schema is at this agent_store's head revision."""
    from agent_store.db.tables import SCHEMA_REVISION

    async with Store.from_url(url) as store:
        await store.db.check_schema()
        where = redact(store.url)
    if as_json:
        print_json({"ok": True, "url": where, "revision": SCHEMA_REVISION})
    else:
        click.echo(f"ok: {where} is at schema {SCHEMA_REVISION}")


@main.command()
@url_option
@user_option
@click.option("--all-users", is_flag=True, help="List every user's sessions.")
@click.option("--agent", "agent_id", default=None, help="Only sessions bound to this agent id.")
@click.option("--meta", multiple=True, metavar="KEY=VALUE", help="Only sessions whose metadata has KEY=VALUE.")
@click.option("--limit", default=50, show_default=True)
@click.option("--cursor", default=None, help="The next_cursor of a previous page.")
@json_option
@runs_async
async def sessions(url: str | None, user_id: str | None, all_users: bool, agent_id: str | None, meta: tuple[str, ...],
                   limit: int, cursor: str | None, as_json: bool) -> None:  # fmt: skip
    """List sessions, most recently active first."""
    metadata = dict(item.split("=", 1) for item in meta if "=" in item)
    if len(metadata) != len(meta):
        raise click.BadParameter("use KEY=VALUE", param_hint="--meta")
    async with Store.from_url(url) as store:
        page = await store.list_sessions(
            user_id=user_id, all_users=all_users, agent_id=agent_id, metadata=metadata, limit=limit, cursor=cursor
        )
    if as_json:
        print_json(page.model_dump(mode="json"))
        return
    print_table(
        ["ID", "USER", "TITLE", "MESSAGES", "UPDATED", "STATUS"],
        [[s.id, s.user_id, s.title, s.message_count, s.updated_at.strftime("%Y-%m-%d %H:%M:%S"),
          "closed" if s.closed_at else "open"] for s in page.items],
    )  # fmt: skip
    if page.next_cursor:
        click.echo(f"\nmore: --cursor {page.next_cursor}")


def _describe(body: dict[str, Any]) -> list[str]:
    """Readable lines for a message's contents: text, tool calls and their results."""
    lines = []
    for content in body.get("contents", []):
        kind = content.get("type")
        if kind == "text":
            lines.append(content.get("text", ""))
        elif kind == "function_call":
            args = content.get("arguments")
            shown = args if isinstance(args, str) else json.dumps(args or {}, ensure_ascii=False)
            lines.append(f"-> call {content.get('name')}({shown})  [{content.get('call_id')}]")
        elif kind == "function_result":
            lines.append(f"<- result [{content.get('call_id')}]: {content.get('result')}")
        else:
            lines.append(f"[{kind}]")
    return lines


@main.command()
@url_option
@user_option
@click.argument("session_id")
@json_option
@runs_async
async def show(url: str | None, user_id: str | None, session_id: str, as_json: bool) -> None:
    """Print a session's transcript: roles, authors, text and tool calls."""
    async with Store.from_url(url) as store:
        info = await store.get(session_id, user_id=user_id)
        records, after = [], -1
        while page := await store.messages(session_id, user_id=user_id, after_seq=after, limit=500):
            records += page
            after = page[-1].seq
    if as_json:
        print_json({"session": info.model_dump(mode="json"), "messages": [m.model_dump(mode="json") for m in records]})
        return
    click.echo(f"session {info.id}  user {info.user_id or '-'}  {info.message_count} messages  version {info.version}")
    if info.title:
        click.echo(f"title: {info.title}")
    for m in records:
        who = f"{m.role} ({m.author_name})" if m.author_name else m.role
        for i, line in enumerate(_describe(m.body) or [""]):
            click.echo(f"{m.seq:>5}  {who:<22} {line}" if i == 0 else f"{'':>5}  {'':<22} {line}")


@main.command()
@url_option
@user_option
@click.option("--session", "session_id", default=None, help="Only this session (default: all of the user's).")
@click.option("-o", "--output", type=click.File("w", encoding="utf-8"), default="-", help="File (default: stdout).")
@json_option
@runs_async
async def export(url: str | None, user_id: str | None, session_id: str | None, output: Any, as_json: bool) -> None:
    """Write sessions as JSON Lines (lossless; `agent-store import` reads them back).

    With --json and -o FILE, a summary ({"sessions", "lines", "file"}) is printed; on stdout the export itself
    is the JSON output.
    """
    async with Store.from_url(url) as store:
        lines = store.export(user_id=user_id, session_id=session_id)
        header = await anext(lines)
        output.write(header + "\n")
        written = 1
        with progress("exporting", json.loads(header)["sessions"]) as advance:
            async for line in lines:
                output.write(line + "\n")
                written += 1
                advance(line.startswith('{"kind": "session"'))
    if as_json and output is not sys.stdout and getattr(output, "name", "-") != "<stdout>":
        trailer = json.loads(line)
        print_json({"sessions": trailer["sessions"], "lines": written, "file": output.name})


@main.command(name="import")
@url_option
@click.argument("source", type=click.File("r", encoding="utf-8"))
@json_option
@runs_async
async def import_(url: str | None, source: Any, as_json: bool) -> None:
    """Recreate sessions from an export, all or nothing; sessions that exist already are skipped."""
    try:
        lines = source.readlines()
    except UnicodeDecodeError as exc:
        raise click.ClickException(f"{source.name} is not UTF-8 text (an agent-store export is): {exc.reason}") from exc
    async with Store.from_url(url) as store:
        total = sum(1 for line in lines if line.startswith('{"kind": "session"'))
        with progress("importing", total) as advance:
            report = await store.import_lines(lines, progress=advance)
    print_json(report.model_dump()) if as_json else click.echo(f"imported {report.imported}, skipped {report.skipped}")


@main.command()
@url_option
@click.option("--batch-size", default=500, show_default=True)
@click.option(
    "--checkpoints-older-than", "checkpoint_days", type=click.IntRange(min=0), default=None, metavar="DAYS",
    help="Also delete workflow checkpoints saved more than DAYS ago (each workflow's latest is kept).",
)  # fmt: skip
@json_option
@runs_async
async def purge(url: str | None, batch_size: int, checkpoint_days: int | None, as_json: bool) -> None:
    """Delete expired sessions (and, if asked, old workflow checkpoints) in small batches."""
    async with Store.from_url(url) as store:
        with progress("purging", await store.count_expired()) as advance:
            removed = await store.purge_expired(batch_size=batch_size, progress=advance)
        old = None
        if checkpoint_days is not None:
            old = await store.purge_checkpoints(timedelta(days=checkpoint_days), batch_size=batch_size)
    if as_json:
        print_json({"purged": removed, **({"checkpoints": old} if old is not None else {})})
        return
    click.echo(f"purged {removed} expired sessions" + (f" and {old} workflow checkpoints" if old is not None else ""))


@main.command(name="erase-user")
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
        click.confirm(f"Erase everything stored for user {user_id!r}?", abort=True)
    async with Store.from_url(url) as store:
        report = await store.erase_user(user_id)
    if as_json:
        print_json(report.model_dump())
        return
    click.echo(f"erased user {user_id}: {report.sessions} sessions, {report.messages} messages, "
               f"{report.state_rows + report.user_state_rows} state rows")  # fmt: skip


@main.command()
@url_option
@user_option
@click.argument("session_id")
@click.option("--at-seq", type=int, default=None, help="Copy messages up to this seq (default: all).")
@click.option("--new-id", default=None, help="Id of the new session (default: a random one).")
@json_option
@runs_async
async def fork(url: str | None, user_id: str | None, session_id: str, at_seq: int | None, new_id: str | None,
               as_json: bool) -> None:  # fmt: skip
    """Copy a session (up to a message) into a new session: a new branch of the conversation."""
    async with Store.from_url(url) as store:
        forked = await store.fork(session_id, user_id=user_id, at_seq=at_seq, new_id=new_id)
    print_json({"id": forked, "from": session_id}) if as_json else click.echo(forked)


@main.command()
@url_option
@json_option
@runs_async
async def stats(url: str | None, as_json: bool) -> None:
    """Row counts, sizes on disk and the busiest sessions."""
    async with Store.from_url(url) as store:
        figures = await store.stats()
    if as_json:
        print_json(figures)
        return
    print_table(["TABLE", "ROWS", "BYTES"], [[t, n, figures["bytes"].get(t)] for t, n in figures["rows"].items()])
    if "database" in figures["bytes"]:
        click.echo(f"database file: {figures['bytes']['database']} bytes")
    click.echo("\nbusiest sessions:")
    print_table(["ID", "USER", "MESSAGES"], [[b["id"], b["user_id"], b["messages"]] for b in figures["busiest"]])


main.add_command(checkpoints)
main.add_command(search)
main.add_command(ui)
