"""`agent-store checkpoints`: a workflow's checkpoint chain, one checkpoint, delete one.

Payloads are shown as stored (the framework's checkpoint encoding) and never decoded here: decoding may unpickle
application types, which only the application, with its allow-list, should do.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import click

from agent_store.cli.support import (
    CommandFailed,
    confirm,
    json_option,
    open_store,
    print_json,
    print_table,
    runs_async,
    url_option,
    yes_option,
)
from agent_store.store import Store

if TYPE_CHECKING:
    from agent_store.agent_framework.checkpoints import StoreCheckpointStorage

user_option = click.option("--user", "user_id", default=None, help="The checkpoints' owner (omit: none).")


@click.group()
@url_option
@json_option
def checkpoints(url: str | None, as_json: bool) -> None:
    """Workflow checkpoints (StoreCheckpointStorage)."""


@checkpoints.command(name="list")
@click.argument("workflow", required=False)
@url_option
@user_option
@json_option
@runs_async
async def list_chain(workflow: str | None, url: str | None, user_id: str | None, as_json: bool) -> None:
    """A workflow's checkpoints, oldest first (each names the one before it); without WORKFLOW, the owner's
    workflows: their names, how many checkpoints each has, and the latest."""
    async with open_store(url) as store:
        rows = await _storage(store, user_id).describe(workflow_name=workflow)
    if workflow is None:
        counts = Counter(r["workflow_name"] for r in rows)
        latest = {r["workflow_name"]: r for r in rows}  # oldest first: the last one seen is a workflow's latest
        rows = [{"workflow": name, "checkpoints": counts[name], "latest": latest[name]["checkpoint_id"],
                 "timestamp": latest[name]["timestamp"]} for name in sorted(latest)]  # fmt: skip
    if as_json:
        print_json(rows)
        return
    if workflow is None:
        print_table(["WORKFLOW", "CHECKPOINTS", "LATEST", "TIMESTAMP"],
                    [[w["workflow"], w["checkpoints"], w["latest"], w["timestamp"]] for w in rows])  # fmt: skip
    else:
        print_table(["SEQ", "CHECKPOINT_ID", "PREVIOUS", "ITERATION", "TIMESTAMP"],
                    [[r["seq"], r["checkpoint_id"], r["previous_checkpoint_id"], r["iteration_count"], r["timestamp"]]
                     for r in rows])  # fmt: skip
    if not rows:
        whose = f"user {user_id!r}" if user_id is not None else "no user (a user's need --user ID)"
        click.echo(f"no checkpoints{'' if workflow is None else f' of workflow {workflow!r}'} for {whose}", err=True)


@checkpoints.command()
@click.argument("checkpoint_id")
@url_option
@user_option
@json_option
@runs_async
async def show(checkpoint_id: str, url: str | None, user_id: str | None, as_json: bool) -> None:
    """One checkpoint as JSON (with or without --json), its payload as stored."""
    async with open_store(url) as store:
        rows = await _storage(store, user_id).describe(checkpoint_id=checkpoint_id)
    if not rows:
        raise _not_found(checkpoint_id, user_id)
    print_json(rows[0])


@checkpoints.command()
@click.argument("checkpoint_id")
@url_option
@user_option
@yes_option
@json_option
@runs_async
async def delete(checkpoint_id: str, url: str | None, user_id: str | None, yes: bool, as_json: bool) -> None:
    """Delete one checkpoint."""
    confirm(yes, f"Delete checkpoint {checkpoint_id!r}?", unattended=True)
    async with open_store(url) as store:
        if not await _storage(store, user_id).delete(checkpoint_id):
            raise _not_found(checkpoint_id, user_id)
    print_json({"ok": True, "deleted": checkpoint_id}) if as_json else click.echo(f"deleted checkpoint {checkpoint_id}")


def _storage(store: Store, user_id: str | None) -> StoreCheckpointStorage:
    from agent_store.agent_framework.checkpoints import (
        StoreCheckpointStorage,  # the workflow half of the framework, only when used
    )

    return StoreCheckpointStorage(store, user_id=user_id)


def _not_found(checkpoint_id: str, user_id: str | None) -> CommandFailed:
    hint = "" if user_id is not None else " (a user's checkpoint needs --user)"
    shown = checkpoint_id if len(checkpoint_id) <= 80 else checkpoint_id[:80] + "..."
    return CommandFailed("CheckpointNotFoundError", f"no checkpoint {shown!r} for user {user_id!r}{hint}")
