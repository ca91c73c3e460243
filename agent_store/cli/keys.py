"""`agent-store keys seal`: seal content in clear with per-user keys (docs/user-keys.md)."""

from __future__ import annotations

import click

from agent_store.cli.support import json_option, open_store, print_json, runs_async, url_option


@click.command()
@click.argument("action", type=click.Choice(["seal"]))
@click.option("--batch-size", type=click.IntRange(1, 100_000), default=500, show_default=True,
              help="Rows sealed per transaction.")  # fmt: skip
@url_option
@json_option
@runs_async
async def keys(action: str, batch_size: int, url: str | None, as_json: bool) -> None:
    """Per-user keys ($AGENT_STORE_KEYS names the key file). SEAL seals every row still in clear (stored before
    the keys were turned on), a batch per transaction; run it again if interrupted. Run as the operator."""
    async with open_store(url, operator=True) as store:
        sealed = await store.seal_clear(batch_size=batch_size)
    if as_json:
        print_json(sealed)
        return
    click.echo(f"sealed {sum(sealed.values())} rows in clear: " + ", ".join(f"{n} {t}" for t, n in sealed.items() if n)
               if any(sealed.values()) else "nothing in clear: every row is sealed")  # fmt: skip
