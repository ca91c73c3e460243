"""`agent-store rls on|off|status`: row-level security on PostgreSQL (docs/row-security.md)."""

from __future__ import annotations

import click

from agent_store.cli.support import json_option, open_store, print_json, runs_async, url_option
from agent_store.operations import row_security


@click.command()
@click.argument("action", type=click.Choice(["on", "off", "status"]))
@url_option
@json_option
@runs_async
async def rls(action: str, url: str | None, as_json: bool) -> None:
    """Row-level security: ON enables and forces the policies (each user sees only their rows), OFF removes
    them, STATUS shows where it stands. Run as the tables' owner (the operator's role)."""
    async with open_store(url, operator=True) as store:
        if action == "status":
            found = await row_security.status(store.db)
        else:
            found = await row_security.switch(store.db, enabled=action == "on")
    if as_json:
        print_json(found)
        return
    state = "on (forced)" if found["enabled"] and found["forced"] else "on" if found["enabled"] else "off"
    click.echo(f"row-level security: {state}; {found['tables_with_policy']} tables with the policy; role "
               f"{found['role']} {'bypasses it' if found['role_bypasses'] else 'is held to it'}")  # fmt: skip
