"""`agent-store search` (a user's messages, as ``store.search``) and `agent-store ui` (the transcript browser)."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket

import click

from agent_store.cli.support import json_option, open_store, print_json, print_table, runs_async, url_option
from agent_store.errors import ConfigurationError, needs_extra


def marked(snippet: str, marks: list[tuple[int, int]]) -> str:
    """The snippet with each match between [ and ] (a terminal shows no highlighting when piped)."""
    out, last = [], 0
    for start, end in marks:
        out += [snippet[last:start], "[", snippet[start:end], "]"]
        last = end
    return "".join([*out, snippet[last:]]).replace("\n", " ")


EMBEDDERS = ["wordllama", "e5"]  # the offline ones (agent_store/search/embedders.py)
MODELS = {"wordllama-l2_supercat": "wordllama", "multilingual-e5-small-q4": "e5"}  # their profiles' models


async def embedder_in_use(url: str | None) -> str | None:
    """The offline embedder the store's vectors were made with (the first, by profile name), or None: no vectors."""
    async with open_store(url) as store:
        return next((MODELS[m] for m in await store.embeddings.models_in_use() if m in MODELS), None)


@click.command()
@click.argument("query")
@click.option("--user", "user_id", default=None, help="Whose messages to search.")
@click.option("--all-users", is_flag=True, help="Search every user's messages (an operator's search).")
@click.option("--session", "session_id", default=None, help="Only this session.")
@click.option("--agent", "agent_id", default=None, help="Only sessions of this agent.")
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option("--cursor", default=None, help="The next_cursor of the previous page (--json prints it).")
@click.option("--ranking", type=click.Choice(["auto", "keyword", "vector", "hybrid"]), default="auto",
              show_default=True, help="By words, by meaning (needs `agent-store embed` first), or both fused; auto: "
              "both where the store has vectors, else by words.")  # fmt: skip
@click.option("--embedder", type=click.Choice(EMBEDDERS), default=None,
              help="The offline embedder the vectors were made with (default: the one the store's vectors are in).")
@click.option("--min-score", type=click.FloatRange(-1, 1), default=None,
              help="By meaning: drop hits found by meaning alone below this cosine similarity (SCORE).")
@url_option
@json_option
@runs_async
async def search(query: str, user_id: str | None, all_users: bool, session_id: str | None, agent_id: str | None,
                 limit: int, cursor: str | None, ranking: str, embedder: str, min_score: float | None,
                 url: str | None, as_json: bool) -> None:  # fmt: skip
    """Messages matching QUERY: words, "phrases", OR, -exclusions; Chinese matches inside words."""
    if (user_id is None) == (not all_users):
        raise click.UsageError("give --user ID, or --all-users to search every user's messages")
    chosen = None if ranking == "keyword" else embedder or await embedder_in_use(url)
    if ranking == "auto" and chosen is None:  # no vectors yet: by words (and, if they find nothing, how to mean)
        ranking = "keyword"
    async with open_store(url, embedder=chosen or (None if ranking == "keyword" else "wordllama")) as store:
        page = await store.search(query, user_id=user_id, all_users=all_users, session_id=session_id,
                                  agent_id=agent_id, limit=limit, cursor=cursor, ranking=ranking,
                                  min_score=min_score)  # fmt: skip
    if ranking != "keyword" and page.ranking == "keyword":  # no vector yet: say so, on stderr (JSON stays clean)
        click.echo("ranked by words only: no message has a vector yet (run `agent-store embed`)", err=True)
    if as_json:
        print_json(page.model_dump(mode="json"))
        return
    scored = page.ranking != "keyword"  # the similarity by meaning ("-": found by its words only)
    rows = [[h.session_id, *([h.user_id] if all_users else []), h.seq, h.role, f"{h.created_at:%Y-%m-%d %H:%M}",
             *([f"{h.similarity:.2f}" if h.similarity is not None else "-"] if scored else []),
             marked(h.snippet, h.marks)] for h in page.items]  # fmt: skip
    print_table(["SESSION", *(["USER"] if all_users else []), "SEQ", "ROLE", "WHEN (UTC)",
                 *(["SCORE"] if scored else []), "MATCH"], rows)  # fmt: skip
    if not page.items and page.ranking == "keyword":  # words found nothing: say how to search by meaning
        click.echo("no message has all these words. To search by meaning: `agent-store embed`, then search again "
                   "(auto ranks by meaning where there are vectors; or --ranking hybrid)", err=True)  # fmt: skip
    if page.next_cursor:
        click.echo(f"more: --cursor {page.next_cursor}")


@click.command()
@click.option("--embedder", type=click.Choice(EMBEDDERS), default="wordllama", show_default=True,
              help="wordllama: fast, English; e5: multilingual (Chinese, Japanese), about 100 messages a second.")
@click.option("--batch-size", type=click.IntRange(1, 10_000), default=500, show_default=True,
              help="Messages embedded and written per transaction.")
@url_option
@runs_async
async def embed(embedder: str, batch_size: int, url: str | None) -> None:
    """Embed every message that has no vector yet (hybrid search's backfill). Safe to stop and run again: it
    resumes where it stopped; a run's commit is never held up by it."""
    async with open_store(url, embedder=embedder) as store:
        written = await store.embeddings.backfill(batch_size=batch_size)
        click.echo(f"embedded {written} messages ({await store.embeddings.pending()} without a vector left)")


def loopback(host: str) -> bool:
    host = host.removeprefix("[").removesuffix("]")  # "[::1]", as a URL writes an IPv6 address
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
@click.option(
    "--trace-url",
    default=None,
    metavar="URL",
    help="Link each model call's trace id there: an http(s) URL with {trace_id} in it (Jaeger, Tempo).",
)
@click.option("--embedder", type=click.Choice(EMBEDDERS), default=None,
              help="Rank search by words and meaning with the vectors `agent-store embed` made with it (default: the "
              "one the store's vectors are in; none: by words).")  # fmt: skip
@json_option
def ui(url: str | None, host: str, port: int, token: str | None, allow_hosts: tuple[str, ...], trace_url: str | None,
       embedder: str | None, as_json: bool) -> None:  # fmt: skip
    """A read-only web browser of sessions, transcripts, state and search (the "ui" extra: pip install ".[ui]")."""
    with needs_extra("ui", "the browser"):
        import uvicorn

        from agent_store.browser.app import LOOPBACK_HOSTS, create_app
    if not loopback(host) and not token:
        raise click.UsageError(f"refusing to serve {host} without --token (or AGENT_STORE_UI_TOKEN): "
                               "anyone who can reach it could read every conversation")  # fmt: skip
    # A wrong URL, a missing database or an old schema: one line, before serving. The check has a store of its
    # own: asyncpg's connections belong to the event loop that opened them, and uvicorn runs another.
    asyncio.run(_usable(url))
    listener = _listen(host, port)  # a port in use: one line, before announcing an address
    bound = f"[{host}]" if ":" in host and not host.startswith("[") else host  # an IPv6 address, as Host gives it
    allowed = [*LOOPBACK_HOSTS, bound, *allow_hosts]
    embedder = embedder or asyncio.run(embedder_in_use(url))  # search: auto, with the vectors the store has
    app = create_app(open_store(url, embedder=embedder), token=token, owns_store=True, allowed_hosts=allowed,
                     trace_url=trace_url)  # fmt: skip
    port = listener.getsockname()[1]
    address = f"http://{bound}:{port}/"
    if as_json:  # a script learns the address (and the port, with --port 0) from stdout
        click.echo(json.dumps({"ok": True, "url": address}), nl=True)
    click.echo(f"agent-store ui: {address}" + ("?token=<your token>" if token else ""), err=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[listener])


async def _usable(url: str | None) -> None:
    async with open_store(url) as store:
        await store.warm_up(1, for_runs=False)  # the browser only reads: no rolled-back commit either


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host.strip("[]"), port))
        listener.listen(2048)
    except OSError as exc:
        listener.close()
        raise ConfigurationError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    listener.setblocking(False)
    return listener


@click.command()
@click.option("--limit", type=click.IntRange(1, 100_000), default=500, show_default=True,
              help="Served responses written at most in this run.")
@url_option
@runs_async
async def transcribe(limit: int, url: str | None) -> None:
    """Write the ended responses of a self-hosted Responses server that are not in the transcript yet (a process
    stopped between a response and its turn, or they were served before migration 0028). Safe to run again."""
    from agent_store.agent_framework.served_transcripts import transcribe_pending

    async with open_store(url) as store:
        click.echo(f"transcribed {await transcribe_pending(store, limit=limit)} served responses")
