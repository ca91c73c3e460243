"""`agent-store sessions`, `show` and a session's lifecycle: fork, truncate, clear, close, delete, update."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import click

from agent_store.cli.support import (
    confirm,
    json_option,
    open_store,
    print_json,
    print_table,
    runs_async,
    url_option,
    user_option,
    yes_option,
)
from agent_store.db.statements import not_found

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def session_command(*options: Decorator) -> Callable[[Callable[..., Any]], click.Command]:
    """A command on one session: --url, --user, SESSION_ID, then ``options``, then --json; run async."""

    def build(fn: Callable[..., Any]) -> click.Command:
        command = runs_async(fn)
        stack: list[Decorator] = [url_option, user_option, click.argument("session_id"), *options, json_option]
        for decorate in reversed(stack):
            command = decorate(command)
        return click.command()(command)

    return build


def _meta(items: tuple[str, ...]) -> dict[str, str]:
    pairs = dict(item.split("=", 1) for item in items if "=" in item)
    if len(pairs) != len(items):
        raise click.BadParameter("use KEY=VALUE", param_hint="--meta")
    return pairs


@click.command()
@url_option
@user_option
@click.option("--all-users", is_flag=True, help="List every user's sessions.")
@click.option("--agent", "agent_id", default=None, help="Only sessions bound to this agent id.")
@click.option("--status", type=click.Choice(["active", "closed", "expired"]), default=None, help="Only these.")
@click.option("--meta", multiple=True, metavar="KEY=VALUE", help="Only sessions whose metadata has KEY=VALUE.")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option("--cursor", default=None, help="The next_cursor of a previous page.")
@json_option
@runs_async
async def sessions(url: str | None, user_id: str | None, all_users: bool, agent_id: str | None, status: str | None,
                   meta: tuple[str, ...], limit: int, cursor: str | None, as_json: bool) -> None:  # fmt: skip
    """List sessions, most recently active first."""
    if all_users and user_id is not None:
        raise click.UsageError("give --user ID or --all-users, not both")
    async with open_store(url) as store:
        page = await store.list_sessions(user_id=user_id, all_users=all_users, agent_id=agent_id, metadata=_meta(meta),
                                         status=status, limit=limit, cursor=cursor)  # fmt: skip
    if as_json:
        print_json(page.model_dump(mode="json"))
        return
    print_table(
        ["ID", "USER", "AGENT", "TITLE", "MESSAGES", "UPDATED (UTC)", "STATUS"],
        [[s.id, s.user_id, s.agent_id, s.title, s.message_count, f"{s.updated_at:%Y-%m-%d %H:%M:%S}", s.status]
         for s in page.items],
    )  # fmt: skip
    if page.next_cursor:
        click.echo(f"\nmore: --cursor {page.next_cursor}")
    elif not page.items and user_id is None and not all_users:
        click.echo("(no sessions without a user: pass --user ID, or --all-users)")


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
            result = content.get("result")
            shown = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
            lines.append(f"<- result [{content.get('call_id')}]: {shown}")
        else:
            lines.append(f"[{kind}]")
    return lines


@session_command()
async def show(url: str | None, user_id: str | None, session_id: str, as_json: bool) -> None:
    """Print a session's transcript: roles, authors, text and tool calls."""
    async with open_store(url) as store:
        info = await store.get(session_id, user_id=user_id)
        records, after = [], -1
        while page := await store.messages(session_id, user_id=user_id, after_seq=after, limit=500):
            records += page
            after = page[-1].seq
    if as_json:
        print_json({"session": info.model_dump(mode="json"), "messages": [m.model_dump(mode="json") for m in records]})
        return
    click.echo(f"session {info.id}  user {info.user_id or '-'}  {info.message_count} messages  {info.status}")
    if info.title:
        click.echo(f"title: {info.title}")
    for n, m in enumerate(records):
        if m.session_id != (records[n - 1].session_id if n else session_id):  # a branch: whose messages these are
            click.echo(f"{'':>5}  -- {'its base ' + m.session_id if m.session_id != session_id else 'its own'} --")
        who = f"{m.role} ({m.author_name})" if m.author_name and m.role != "tool" else m.role
        for i, line in enumerate(_describe(m.body) or [""]):
            click.echo(f"{m.seq:>5}  {who:<22} {line}" if i == 0 else f"{'':>5}  {'':<22} {line}")


@session_command(
    click.option("--at-seq", type=int, default=None, help="Copy messages up to this seq (default: all)."),
    click.option("--new-id", default=None, help="Id of the new session (default: a random one)."),
    click.option("--share", is_flag=True, help="A branch that reads that history through this session, no copy."),
)
async def fork(url: str | None, user_id: str | None, session_id: str, at_seq: int | None, new_id: str | None,
               share: bool, as_json: bool) -> None:  # fmt: skip
    """Copy a session (up to a message) into a new session: a new branch of the conversation."""
    async with open_store(url) as store:
        forked = await store.fork(session_id, user_id=user_id, at_seq=at_seq, new_id=new_id, share=share)
    if as_json:
        print_json({"id": forked, "from": session_id})
        return
    how = "a branch reading its history" if share else "a copy of its messages"
    upto = "" if at_seq is None else f" up to seq {at_seq}"
    click.echo(f"forked {session_id} into {forked} ({how}{upto})")


@session_command()
async def tree(url: str | None, user_id: str | None, session_id: str, as_json: bool) -> None:
    """A conversation's tree from SESSION_ID down: its branches (indented) and each one's response ids."""
    async with open_store(url) as store:
        nodes = await store.tree(session_id, user_id=user_id)
    if as_json:
        print_json([n.model_dump() for n in nodes])
        return
    rows: list[list[Any]] = []
    shown: set[str] = set()
    for n in nodes:  # a session's row, then its response ids, indented under it
        pad = "  " * n.depth
        if n.session_id not in shown:
            shown.add(n.session_id)
            rows.append([pad + n.session_id, n.base_seq, None, None])
        if n.response_id is not None:
            rows.append([f"{pad}  {n.response_id}", None, n.seq_end, n.parent_id])
    print_table(["SESSION / RESPONSE", "BASE_SEQ", "SEQ_END", "PARENT"], rows)


@session_command(
    click.option("--after-seq", type=int, required=True, help="Keep messages up to this seq; drop the rest."),
    yes_option,
)
async def truncate(
    url: str | None, user_id: str | None, session_id: str, after_seq: int, yes: bool, as_json: bool
) -> None:
    """Rewind a session: drop its messages after --after-seq (a tool call keeps its result)."""
    confirm(yes, f"Drop the messages of {session_id!r} after seq {after_seq}?", unattended=True)
    async with open_store(url) as store:
        dropped = await store.truncate(session_id, after_seq, user_id=user_id)
    _done(as_json, session_id, "truncated", dropped=dropped, text=f"dropped {dropped} messages of {session_id}")


@session_command(yes_option)
async def clear(url: str | None, user_id: str | None, session_id: str, yes: bool, as_json: bool) -> None:
    """Delete a session's messages, keeping the session and its state."""
    confirm(yes, f"Delete every message of {session_id!r}?", unattended=True)
    async with open_store(url) as store:
        dropped = await store.clear(session_id, user_id=user_id)
    _done(as_json, session_id, "cleared", dropped=dropped, text=f"cleared {dropped} messages of {session_id}")


@session_command()
async def close(url: str | None, user_id: str | None, session_id: str, as_json: bool) -> None:
    """Make a session read-only: later runs are refused; its transcript stays readable."""
    async with open_store(url) as store:
        await store.close_session(session_id, user_id=user_id)
    _done(as_json, session_id, "closed", text=f"closed {session_id}")


@session_command(yes_option)
async def delete(url: str | None, user_id: str | None, session_id: str, yes: bool, as_json: bool) -> None:
    """Delete a session with its messages, state and run log."""
    confirm(yes, f"Delete session {session_id!r} with its messages, state and run log?", unattended=True)
    async with open_store(url) as store:
        if not await store.delete(session_id, user_id=user_id):
            raise not_found(session_id, user_id)  # the library's own refusal, with its hint
    _done(as_json, session_id, "deleted", text=f"deleted {session_id}")


@session_command(
    click.option("--title", default=None, help="The new title."),
    click.option("--no-title", is_flag=True, help="Remove the title."),
    click.option("--meta", multiple=True, metavar="KEY=VALUE", help="Replace the metadata with these pairs."),
    click.option("--ttl", type=click.IntRange(1, 2**31 - 1), default=None, metavar="SECONDS", help="Its own idle TTL."),
    click.option("--no-ttl", is_flag=True, help="Drop its own TTL: the store's idle_ttl applies again."),
)
async def update(url: str | None, user_id: str | None, session_id: str, title: str | None, no_title: bool,
                 meta: tuple[str, ...], ttl: int | None, no_ttl: bool, as_json: bool) -> None:  # fmt: skip
    """Change a session's title, metadata or idle time-to-live."""
    changes: dict[str, Any] = {}
    if title is not None or no_title:
        changes["title"] = None if no_title else title
    if meta:
        changes["metadata"] = _meta(meta)
    if ttl is not None or no_ttl:
        changes["ttl"] = None if no_ttl else timedelta(seconds=ttl or 0)
    if not changes or (title is not None and no_title) or (ttl is not None and no_ttl):
        raise click.UsageError("give one of --title/--no-title, --meta, --ttl/--no-ttl (each at most one way)")
    async with open_store(url) as store:
        await store.update(session_id, user_id=user_id, **changes)
        info = await store.get(session_id, user_id=user_id)
    if as_json:
        print_json(info.model_dump(mode="json"))
    else:
        expires = f"{info.expires_at:%Y-%m-%d %H:%M:%S} UTC" if info.expires_at else "never"
        click.echo(f"updated {session_id}: title {info.title or '-'}, expires {expires}")


def _done(as_json: bool, session_id: str, action: str, *, text: str, **figures: int) -> None:
    print_json({"ok": True, "id": session_id, "action": action, **figures}) if as_json else click.echo(text)
