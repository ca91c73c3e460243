"""`agent-store search` (a user's messages, as ``store.search``) and `agent-store ui` (the transcript browser)."""

from __future__ import annotations

import ipaddress

import click

from agent_store.cli.support import json_option, print_json, print_table, runs_async, url_option
from agent_store.store import Store


def marked(snippet: str, marks: list[tuple[int, int]]) -> str:
    """The snippet with each match between [ and ] (a terminal shows no highlighting when piped)."""
    out, last = [], 0
    for start, end in marks:
        out += [snippet[last:start], "[", snippet[start:end], "]"]
        last = end
    return "".join([*out, snippet[last:]]).replace("\n", " ")


@click.command()
@click.argument("query")
@click.option("--user", "user_id", required=True, help="Whose messages to search (required: search is per user).")
@click.option("--session", "session_id", default=None, help="Only this session.")
@click.option("--agent", "agent_id", default=None, help="Only sessions of this agent.")
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option("--cursor", default=None, help="The next_cursor of the previous page (--json prints it).")
@url_option
@json_option
@runs_async
async def search(query: str, user_id: str, session_id: str | None, agent_id: str | None, limit: int,
                 cursor: str | None, url: str | None, as_json: bool) -> None:  # fmt: skip
    """Messages of a user matching QUERY: words, "phrases", OR, -exclusions; Chinese matches inside words."""
    async with Store.from_url(url) as store:
        page = await store.search(query, user_id=user_id, session_id=session_id, agent_id=agent_id, limit=limit,
                                  cursor=cursor)  # fmt: skip
    if as_json:
        print_json(page.model_dump(mode="json"))
        return
    rows = [[h.session_id, h.seq, h.role, f"{h.created_at:%Y-%m-%d %H:%M}", marked(h.snippet, h.marks)]
            for h in page.items]  # fmt: skip
    print_table(["SESSION", "SEQ", "ROLE", "WHEN", "MATCH"], rows)
    if page.next_cursor:
        click.echo(f"more: --cursor {page.next_cursor}")


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


@click.command()
@url_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True)
@click.option("--token", envvar="AGENT_STORE_UI_TOKEN", show_envvar=True, default=None,
              help="Required on every request (needed to listen beyond loopback).")  # fmt: skip
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="NAME[:PORT]",
              help="Another name requests may use in their Host header (repeatable; '*': any). Loopback names "
                   "and the --host address are always allowed; others are answered 400 (DNS rebinding).")  # fmt: skip
def ui(url: str | None, host: str, port: int, token: str | None, allow_hosts: tuple[str, ...]) -> None:
    """A read-only web browser of sessions, transcripts, state and search (pip install "agent-store[ui]")."""
    try:
        import uvicorn

        from agent_store.browser.app import LOOPBACK_HOSTS, create_app
    except ImportError as exc:
        raise click.ClickException(f'the browser needs its extra: pip install "agent-store[ui]" ({exc.name})') from None
    if not loopback(host) and not token:
        raise click.UsageError(f"refusing to serve {host} without --token (or AGENT_STORE_UI_TOKEN): "
                               "anyone who can reach it could read every conversation")  # fmt: skip
    bound = f"[{host}]" if ":" in host and not host.startswith("[") else host  # an IPv6 address, as Host gives it
    allowed = [*LOOPBACK_HOSTS, bound, *allow_hosts]
    app = create_app(Store.from_url(url), token=token, owns_store=True, allowed_hosts=allowed)
    click.echo(f"agent-store ui: http://{host}:{port}/" + ("?token=<your token>" if token else ""), err=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
