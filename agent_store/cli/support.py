"""What every `agent-store` command shares: the URL and output options, tables, JSON, the error boundary."""

from __future__ import annotations

import asyncio
import functools
import json
import sys
import unicodedata
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from agent_store.db.urls import URL_ENV
from agent_store.errors import AgentStoreError

T = TypeVar("T")

url_option = click.option(
    "--url",
    envvar=URL_ENV,
    default=None,
    show_envvar=True,
    help="Database URL (default: sqlite+aiosqlite:///agent_store.db).",
)
user_option = click.option(
    "--user", "user_id", default=None, help="The sessions' owner (omit for sessions without one)."
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def runs_async(fn: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """Run an async command body; turn agent_store errors into a one-line message and exit status 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return asyncio.run(fn(*args, **kwargs))
        except AgentStoreError as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc

    return wrapper


def _width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([_width(h), *(_width(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    for row in [list(headers), *cells]:
        click.echo("  ".join(v + " " * (w - _width(v)) for v, w in zip(row, widths, strict=True)).rstrip())


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, ensure_ascii=False, indent=2, default=str))


@contextmanager
def progress(label: str, total: int) -> Iterator[Callable[[int], None]]:
    """A progress bar on a terminal; nothing at all when stderr is piped."""
    if not sys.stderr.isatty() or total <= 0:
        yield lambda _n: None
        return
    with click.progressbar(length=total, label=label, file=sys.stderr) as bar:
        yield bar.update
