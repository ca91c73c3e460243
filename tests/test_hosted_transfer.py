"""A whole-user export carries the user's Responses-server rows (StoreResponseProvider, issue 38) and an import
brings them back as they were, on both backends; a hostile file (a history pointer that dangles or loops, a link
to an item the user lacks) imports nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from azure.ai.agentserver.responses import PlatformContext
from helpers import rows
from test_hosted_responses import ALICE, BOB, turn

from agent_store import InvalidValueError, Store
from agent_store.agentserver.history import MAX_HOPS
from agent_store.agentserver.responses import StoreResponseProvider


async def _views(provider: StoreResponseProvider, context: PlatformContext, ids: list[str]) -> dict[str, Any]:
    out = {}
    for rid in ids:
        out[rid] = (await provider.get_response(rid, context=context),
                    [i["id"] for i in await provider.get_input_items(rid, limit=100, context=context)],
                    await provider.get_history_item_ids(rid, None, 100, context=context))  # fmt: skip
    return out


def _retrailed(lines: list[str]) -> list[str]:
    """The lines with their trailer's count made right again (an edited file that only the rows give away)."""
    body = [line for line in lines if json.loads(line)["kind"] != "trailer"]
    trailer = json.loads(lines[-1])
    return [*body, json.dumps({**trailer, "lines": len(body) + 1})]


async def test_a_users_responses_go_out_and_come_back_as_they_were(store: Store) -> None:
    provider = StoreResponseProvider(store)
    ids = [f"r{n}" for n in range(MAX_HOPS + 4)]  # past MAX_HOPS: pointers and rows of their own both
    previous = None
    for rid in ids:
        await turn(provider, rid, previous, context=ALICE)
        previous = rid
    await turn(provider, "c1", None, conversation="conv", context=ALICE)
    await turn(provider, "c2", None, conversation="conv", context=ALICE)
    await provider.delete_response("r3", context=ALICE)  # a deleted one is kept as such (later ones read through it)
    await turn(provider, "r0", None, context=BOB)
    live = [rid for rid in ids if rid != "r3"] + ["c1", "c2"]
    before = await _views(provider, ALICE, live)
    bob = await _views(provider, BOB, ["r0"])
    lines = [line async for line in store.export(user_id="alice")]
    assert {json.loads(line)["kind"] for line in lines} >= {"hosted_response", "hosted_item", "hosted_link"}
    assert all(json.loads(line)["row"]["user_id"] == "alice" for line in lines if '"hosted_' in line[:30])
    again = await store.import_lines(lines)  # everything is there already: skipped, nothing doubled
    assert again.hosted_responses == 0
    await store.erase_user("alice")
    assert await rows(store, "SELECT count(*) FROM agent_hosted_responses WHERE user_id = 'alice'") == [(0,)]
    report = await store.import_lines(lines)
    assert report.hosted_responses == len(ids) + 2
    assert await _views(provider, ALICE, live) == before
    with pytest.raises(KeyError):
        await provider.get_response("r3", context=ALICE)
    assert await _views(provider, BOB, ["r0"]) == bob


@pytest.mark.parametrize("hostile", ["dangling", "cycle", "missing item"])
async def test_a_hostile_file_imports_nothing(store: Store, hostile: str) -> None:
    provider = StoreResponseProvider(store)
    await turn(provider, "a", None, context=ALICE)
    await turn(provider, "b", "a", context=ALICE)
    await turn(provider, "c", "b", context=ALICE)
    lines = [line async for line in store.export(user_id="alice")]
    await store.erase_user("alice")
    records = [json.loads(line) for line in lines]
    for record in records:
        row = record.get("row") or {}
        if record["kind"] == "hosted_response" and hostile == "dangling" and row["response_id"] == "c":
            row["history_from"] = "nowhere"
        if record["kind"] == "hosted_response" and hostile == "cycle" and row["response_id"] in ("b", "c"):
            row["history_from"] = "c" if row["response_id"] == "b" else "b"
    if hostile == "missing item":
        records = [r for r in records if not (r["kind"] == "hosted_item" and r["row"]["item_id"] == "a-in")]
    edited = _retrailed([json.dumps(r) for r in records])
    with pytest.raises(InvalidValueError, match="nothing was imported"):
        await store.import_lines(edited)
    assert await rows(store, "SELECT count(*) FROM agent_hosted_responses") == [(0,)]
    assert await rows(store, "SELECT count(*) FROM agent_hosted_items") == [(0,)]
