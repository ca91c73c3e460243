"""`agent-store search`: find a user's messages from a shell (the same search as ``store.search``)."""

from __future__ import annotations

import click

from .cli_support import json_option, print_json, print_table, runs_async, url_option
from .store import Store


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
