"""The `agent-store` command line. User errors print one line and exit non-zero; no tracebacks."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import click

from .engine import URL_ENV
from .errors import AgentStoreError
from .store import Store

T = TypeVar("T")

url_option = click.option(
    "--url",
    envvar=URL_ENV,
    default=None,
    show_envvar=True,
    help="Database URL (default: sqlite+aiosqlite:///agent_store.db).",
)


def runs_async(fn: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """Run an async command body; turn agent_store errors into a one-line message and exit status 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return asyncio.run(fn(*args, **kwargs))
        except AgentStoreError as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc

    return wrapper


@click.group()
@click.version_option(package_name="agent-store")
def main() -> None:
    """Durable Agent Framework sessions in SQLite or PostgreSQL."""


@main.command()
@url_option
@click.option("--step", type=click.Choice(["all", "turn-two"]), default="all", hidden=True)
@click.option("--chat-id", default=None, hidden=True)
@runs_async
async def demo(url: str | None, step: str, chat_id: str | None) -> None:
    """Run the sessions scenario offline: remember a name across processes, state, shared agents, SQL."""
    from .demo import run_demo, turn_two

    if step == "turn-two" and chat_id:
        await turn_two(url, chat_id, click.echo)
        return
    await run_demo(url, click.echo)


@main.command()
@url_option
@click.argument("revision", default="head")
@runs_async
async def upgrade(url: str | None, revision: str) -> None:
    """Migrate the database schema to REVISION (default: head)."""
    async with Store.from_url(url, check_schema=False) as store:
        await store.migrate(revision)
        click.echo(f"{store.url.render_as_string(hide_password=True)}: schema at {revision}")


@main.command()
@url_option
@runs_async
async def check(url: str | None) -> None:
    """Connect and verify the schema is at this agent_store's head revision."""
    from .engine import check_schema
    from .errors import translated
    from .tables import SCHEMA_REVISION

    async with Store.from_url(url, check_schema=False) as store:
        with translated(store.url, "connecting"):
            async with store.engine.connect() as conn:
                await check_schema(conn, store.url)
        click.echo(f"ok: {store.url.render_as_string(hide_password=True)} is at schema {SCHEMA_REVISION}")
