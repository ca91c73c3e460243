"""What every `agent-store` command shares: the global options, the store a command opens, output, and the
error boundary that turns any failure into one line (and a JSON object with ``--json``), exit status 1."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
import unicodedata
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from click.core import ParameterSource

from agent_store.db.urls import URL_ENV, resolve_url
from agent_store.errors import AgentStoreError, ConfigurationError
from agent_store.keys import KeyFile
from agent_store.store import Store

T = TypeVar("T")
DEBUG_ENV = "AGENT_STORE_DEBUG"  # set to 1: an unexpected failure shows its traceback


class CommandFailed(click.ClickException):
    """A command's own refusal, printed as ``Error: <kind>: <message>`` like the store's errors."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Commands(click.Group):
    """The root group: whatever fails, the output is one ``Error: <Type>: <reason>`` line on stderr (plus, with
    ``--json``, ``{"ok": false, ...}`` on stdout) and exit status 1; never a traceback."""

    def main(
        self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
        standalone_mode: bool = True, **extra: Any,
    ) -> NoReturn:  # fmt: skip
        argv = list(sys.argv[1:] if args is None else args)
        try:
            code = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:  # `agent-store` alone: the help, which is no failure
            click.echo(exc.ctx.get_help() if exc.ctx else "")
            sys.exit(0)
        except Exception as exc:
            if os.environ.get(DEBUG_ENV) == "1" and not isinstance(exc, AgentStoreError | click.ClickException):
                raise
            fail(exc, as_json="--json" in argv[: argv.index("--") if "--" in argv else len(argv)])
        except KeyboardInterrupt:
            click.echo("Error: Interrupted: stopped by the user", err=True)
            sys.exit(130)
        sys.exit(code if isinstance(code, int) else 0)


def describe(exc: BaseException) -> tuple[str, str, bool]:
    """The failure's type name, a one-line reason, and whether the same command may succeed if run again."""
    if isinstance(exc, AgentStoreError):
        return type(exc).__name__, str(exc), exc.retryable
    if isinstance(exc, CommandFailed):
        return exc.kind, exc.format_message(), False
    if isinstance(exc, click.UsageError):
        where = f"{exc.ctx.command_path}: " if exc.ctx else ""
        return "UsageError", where + exc.format_message(), False
    if isinstance(exc, click.ClickException):  # e.g. click.FileError: a path that cannot be opened
        return type(exc).__name__, exc.format_message(), False
    if isinstance(exc, click.Abort):
        return "Aborted", "nothing was done", False
    reason = str(exc) or "no details"
    if not isinstance(exc, OSError):
        reason += f" (set {DEBUG_ENV}=1 for the traceback)"
    return type(exc).__name__, reason, False


def fail(exc: BaseException, *, as_json: bool) -> NoReturn:
    kind, reason, retryable = describe(exc)
    reason = " ".join(reason.split())  # one line, whatever the message held
    if as_json:
        click.echo(json.dumps({"ok": False, "error": kind, "message": reason, "retryable": retryable},
                              ensure_ascii=False))  # fmt: skip
    click.echo(f"Error: {kind}: {reason}", err=True)
    sys.exit(1)


def or_global(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A subcommand's --url / --json when given there, else the one given before it (to a group or the root)."""
    outer = ctx.parent
    while (value is None or value is False) and outer is not None:
        value = outer.params.get(param.name or "", value)
        outer = outer.parent
    return value


URL_HELP = f"Database URL (default: ${URL_ENV}, else sqlite:///agent_store.db)."
url_option = click.option("--url", default=None, callback=or_global, expose_value=True, help=URL_HELP)
json_option = click.option("--json", "as_json", is_flag=True, callback=or_global, help="Print JSON.")
global_url = click.option("--url", envvar=URL_ENV, default=None, show_envvar=True, help=URL_HELP)
global_json = click.option("--json", "as_json", is_flag=True, help="Print JSON (failures too).")
user_option = click.option(
    "--user", "user_id", default=None, help="The sessions' owner (omit for sessions without one)."
)


def given_url(url: str | None) -> str | None:
    """``url`` if the command line gave it, before or after the subcommand; None if it came from
    ``$AGENT_STORE_URL`` (the demo writes only where it was told to)."""
    ctx = click.get_current_context()
    typed = (ctx.get_parameter_source("url"), ctx.find_root().get_parameter_source("url"))
    return url if ParameterSource.COMMANDLINE in typed else None


yes_option = click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")


def confirm(yes: bool, question: str, *, unattended: bool = False) -> None:
    """Every destructive command asks on a terminal, unless ``--yes``; none ever waits for an answer when no one
    is at a terminal. There, ``unattended`` commands (one session's or one checkpoint's delete, clear, truncate:
    what scripts have always run) go ahead; the others (a whole user's erasure, a schema downgrade) refuse
    without ``--yes``. The prompt goes to stderr: stdout stays the command's output (its JSON with ``--json``)."""
    if yes:
        return
    if not sys.stdin.isatty():
        if unattended:
            return
        raise click.UsageError("refusing without --yes when not on a terminal")
    click.confirm(question, abort=True, err=True)


def open_store(url: str | None, *, creates: bool = False, **options: Any) -> Store:
    """The store a command works on. Only a command that ``creates`` may bring a new SQLite file into being:
    a read on a mistyped path says so, instead of creating an empty file and asking for an upgrade."""
    resolved = resolve_url(url)
    path = resolved.database or ""
    if resolved.get_backend_name() == "sqlite" and path not in ("", ":memory:") and not path.startswith("file:"):
        if not creates and not Path(path).exists():
            raise ConfigurationError(
                f"no SQLite database at {path}: create it with `agent-store upgrade --url sqlite:///{path}`"
                " (or try `agent-store demo`)"
            )
        if not Path(path).absolute().parent.is_dir():
            raise ConfigurationError(f"cannot create a SQLite database at {path}: its folder does not exist")
    options.setdefault("operator", True)  # the CLI is an operator's tool: under row-level security, a bypassing role
    if keys := os.environ.get("AGENT_STORE_KEYS"):  # a store with per-user keys: its key file (agent_store/keys.py)
        options.setdefault("keys", KeyFile(keys))
    return Store.from_url(resolved, **options)


def runs_async(fn: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """Run an async command body (its errors go to the root group's boundary)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        return asyncio.run(fn(*args, **kwargs))

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
