"""The `agent-store` command line: operate a store from a shell.

Human output is a table; ``--json`` prints machine-readable JSON. Long work shows a progress bar on a
terminal and stays quiet when piped. ``--url`` and ``--json`` go before or after the subcommand. Any failure
prints one line and exits with status 1 (support.Commands).
"""

from __future__ import annotations

import click

from agent_store.cli.backup import backup, erasures, restore
from agent_store.cli.checkpoints import checkpoints
from agent_store.cli.keys import keys
from agent_store.cli.rls import rls
from agent_store.cli.search import embed, search, transcribe, ui
from agent_store.cli.sessions import clear, close, delete, fork, sessions, show, tree, truncate, update
from agent_store.cli.support import (
    Commands,
    confirm,
    given_url,
    global_json,
    global_url,
    json_option,
    open_store,
    or_global,
    print_json,
    print_table,
    runs_async,
    url_option,
    yes_option,
)
from agent_store.cli.transfer import erase_user, export, import_, purge
from agent_store.cli.usage import budget, price, usage
from agent_store.db.urls import DEFAULT_URL
from agent_store.errors import redact


@click.group(cls=Commands)
@click.version_option(package_name="agent-store")
@global_url
@global_json
def main(url: str | None, as_json: bool) -> None:
    """Durable Agent Framework sessions in SQLite or PostgreSQL."""


@main.command()
@click.option("--url", default=None, callback=or_global, help="Database URL (default: ./agent_store.db; "
              "the demo never writes into $AGENT_STORE_URL's database).")  # fmt: skip
@click.option("--step", type=click.Choice(["all", "turn-two"]), default="all", hidden=True)
@click.option("--chat-id", default=None, hidden=True)
@json_option
@runs_async
async def demo(url: str | None, step: str, chat_id: str | None, as_json: bool) -> None:
    """Run the sessions scenario offline: remember a name across processes, state, shared agents, SQL.

    It writes into ./agent_store.db, or into the database --url names; never into $AGENT_STORE_URL's.
    """
    from agent_store.cli.demo import run_demo, turn_two

    lines: list[str] = []
    say = lines.append if as_json else click.echo
    target = given_url(url) or DEFAULT_URL
    if step == "turn-two" and chat_id:
        await turn_two(target, chat_id, say)
    else:
        await run_demo(target, say)
    if as_json:
        print_json({"ok": True, "output": lines})


@main.command()
@url_option
@click.argument("revision", default="head")
@json_option
@runs_async
async def upgrade(url: str | None, revision: str, as_json: bool) -> None:
    """Migrate the database schema to REVISION (default: head); creates a SQLite file that is not there yet."""
    async with open_store(url, creates=True, check_schema=False) as store:
        await store.migrate(revision)
        reached = await store.db.revision()
        where = redact(store.url)
    print_json({"url": where, "revision": reached}) if as_json else click.echo(f"{where}: schema at {reached}")


@main.command()
@url_option
@click.argument("revision")
@yes_option
@json_option
@runs_async
async def downgrade(url: str | None, revision: str, yes: bool, as_json: bool) -> None:
    """Migrate the schema back to REVISION ("base": none). Columns and tables added after it are dropped."""
    confirm(yes, f"Downgrade the schema to {revision}, dropping what later revisions added?")
    async with open_store(url, check_schema=False) as store:
        await store.downgrade(revision)
        reached = await store.db.revision()
        where = redact(store.url)
    print_json({"url": where, "revision": reached}) if as_json else click.echo(f"{where}: schema at {reached}")


@main.command()
@url_option
@click.option("--figures", is_flag=True, help="Also purge lag, conflicts of the last hour and stuck runs.")
@json_option
@runs_async
async def check(url: str | None, figures: bool, as_json: bool) -> None:
    """Readiness: connect, and verify the schema runs this agent_store (exit 1 if not); a probe can call it."""
    async with open_store(url) as store:
        found = await store.ready(figures=figures)
        where = redact(store.url)
    if as_json:
        print_json({**found, "url": where})
        return
    click.echo(f"ok: {where} is at schema {found['revision']} ({found['latency_ms']} ms)")
    if figures:
        runs, conflicts = found["runs_last_hour"], found["conflicts_last_hour"]
        rate = f"{100 * conflicts / runs:.1f}%" if runs else "-"
        click.echo(f"purge lag: {found['purge_lag_s']} s ({found['expired_waiting']} expired sessions waiting)")
        click.echo(f"last hour: {runs} runs, {conflicts} conflicts ({rate}); stuck journaled runs: "
                   f"{found['stuck_runs']}")  # fmt: skip


@main.command()
@url_option
@json_option
@runs_async
async def stats(url: str | None, as_json: bool) -> None:
    """Row counts and sizes on disk of every table, and the busiest sessions."""
    async with open_store(url) as store:
        figures = await store.stats()
    if as_json:
        print_json(figures)
        return
    sizes = figures["bytes"]
    other = [[name, None, size] for name, size in sizes.items() if name not in figures["rows"] and name != "database"]
    print_table(["TABLE", "ROWS", "BYTES"], [*([t, n, sizes.get(t)] for t, n in figures["rows"].items()), *other])
    click.echo(f"database: {sizes['database']} bytes")
    click.echo("\nbusiest sessions:")
    print_table(["ID", "USER", "MESSAGES"], [[b["id"], b["user_id"], b["messages"]] for b in figures["busiest"]])


for command in (sessions, show, fork, tree, truncate, clear, close, delete, update, export, import_, purge, erase_user,
                checkpoints, search, embed, ui, usage, budget, price, backup, restore, erasures, rls,
                keys, transcribe):  # fmt: skip
    main.add_command(command)
