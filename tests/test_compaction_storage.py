"""Compaction, stored (issue 24): one transaction, only what changed, seq apart from list order, a retry written
once, originals kept and queryable, races settled by the database, and every operation keeping summaries with
what they summarize."""

from __future__ import annotations

from typing import Any

import pytest
from agent_framework import (
    Agent,
    CompactionProvider,
    InMemoryHistoryProvider,
    Message,
    SlidingWindowStrategy,
    SummarizationStrategy,
)
from helpers import doc_block, lose_the_reply, rows

from agent_store import ConflictError, InvalidValueError, StorageUnavailableError, Store, retry_on_conflict
from agent_store.offline import OfflineChatClient

TURNS = ["my name is Ann", "hello", "tell me more", "once again", "and then", "what is my name?", "the end"]
PLACES = "SELECT message_id, coalesce(pos, seq * 4294967296) FROM agent_messages WHERE session_id = 'c'"


def _agent(strategy: Any = None) -> Agent:
    strategy = strategy or SummarizationStrategy(client=OfflineChatClient(), target_count=4, threshold=2)
    return Agent(
        client=OfflineChatClient(), name="Bot",
        context_providers=[InMemoryHistoryProvider(skip_excluded=True),
                           CompactionProvider(after_strategy=strategy, history_source_id="in_memory")],
    )  # fmt: skip


async def _talk(store: Store, turns: list[str], strategy: Any = None, sid: str = "c", user: str | None = None) -> None:
    for turn in turns:
        async with store.session(sid, user_id=user) as session:
            await _agent(strategy).run(turn, session=session)


async def _table(store: Store, sid: str = "c") -> list[tuple[Any, ...]]:
    return await rows(
        store, "SELECT seq, message_id, marks, pos, excluded, exclude_reason, summarized_by FROM agent_messages "
        "WHERE session_id = :s ORDER BY seq", s=sid,
    )  # fmt: skip


async def test_summaries_sit_where_their_originals_were_and_seq_stays_commit_order(store: Store) -> None:
    await _talk(store, TURNS)
    table = await _table(store)
    assert [r[0] for r in table] == list(range(len(table)))  # gap-free, commit order
    summaries = [r for r in table if r[3] is not None]
    assert summaries, "the summarizer inserted summaries in the middle of the list"
    excluded = [r for r in table if r[4]]
    assert excluded and all(r[5] == "summarized" and r[6] in {s[1] for s in summaries} for r in excluded)
    for summary in summaries:  # committed after its originals, placed before them
        originals = [r for r in table if r[6] == summary[1]]
        assert all(o[0] < summary[0] for o in originals)
        places = dict(await rows(store, PLACES))
        assert all(places[summary[1]] < places[o[1]] for o in originals)
    # The model's view in SQL is the list the next turn's model gets (after its own new user message).
    seen: list[Any] = []
    view = await rows(store, "SELECT role, text FROM agent_model_view WHERE session_id = 'c' ORDER BY position")
    async with store.session("c") as session:
        history = [m for m in session.state["in_memory"]["messages"] if not m.additional_properties.get("_excluded")]
        seen = [(str(m.role), m.text) for m in history]
    assert view == seen


async def test_a_turn_rewrites_only_the_rows_that_changed(store: Store) -> None:
    strategy = SlidingWindowStrategy(keep_last_groups=3)
    await _talk(store, TURNS[:4], strategy)
    before = {r[1]: r for r in await _table(store)}
    run = await store.load("c")
    await _agent(strategy).run("one more", session=run.session)
    result = await run.commit()
    after = {r[1]: r for r in await _table(store)}
    changed = {k for k in before if before[k] != after[k]}
    assert result.messages_rewritten == len(changed) > 0
    assert result.messages_written == len(after) - len(before)
    assert await rows(store, "SELECT messages_rewritten FROM agent_runs WHERE run_id = :r", r=result.run_id) == [
        (len(changed),)
    ]
    if store.engine.dialect.name == "postgresql":  # the rows this transaction wrote: exactly those
        xid = await rows(store, "SELECT xmin::text FROM agent_runs WHERE run_id = :r", r=result.run_id)
        written = await rows(store, "SELECT message_id FROM agent_messages WHERE xmin::text = :x", x=xid[0][0])
        assert {w[0] for w in written} == changed | (after.keys() - before.keys())


async def test_a_compaction_commits_whole_or_not_at_all(store: Store) -> None:
    await _talk(store, TURNS[:5])
    before = await _table(store)
    first_id = before[0][1]
    run = await store.load("c", history_limit=4)  # the first message is not loaded
    await _agent().run("a turn that compacts", session=run.session)
    # A message already stored, added again: the insert after the rewrites fails on the unique index
    twin = Message(role="user", contents=["again"], additional_properties={"agent_store_id": first_id})
    run.session.state["in_memory"]["messages"].append(twin)
    with pytest.raises(InvalidValueError, match="already stored"):
        await run.commit()
    assert await _table(store) == before  # the rewritten marks and the summary went with it


async def test_a_retried_compaction_writes_once(store: Store) -> None:
    await _talk(store, TURNS[:5])
    run = await store.load("c")
    await _agent().run("a turn that compacts", session=run.session)
    lose_the_reply(store)
    with pytest.raises(StorageUnavailableError):
        await run.commit()
    first = await _table(store)
    result = await run.commit()  # the retry finds its run committed: nothing is written twice
    assert await _table(store) == first
    assert result.messages_rewritten > 0


@pytest.mark.parametrize("first", ["appender", "compactor"])
async def test_a_compaction_racing_an_append_never_loses_a_message(store: Store, first: str) -> None:
    await _talk(store, TURNS[:5])
    compactor, appender = await store.load("c"), await store.load("c")
    await _agent().run("compact now", session=compactor.session)
    await Agent(client=OfflineChatClient(), name="Plain").run("just append", session=appender.session)
    if first == "appender":
        await appender.commit()
        before = await _table(store)
        with pytest.raises(ConflictError):  # its rewrites were computed on a history that moved on: nothing written
            await compactor.commit()
        assert await _table(store) == before
        await retry_on_conflict(store, "c", lambda s: _agent().run("compact now", session=s))
    else:
        await compactor.commit()
        await appender.commit()  # appended after the compacted history: nothing lost, no summary orphaned
    texts = [r[0] for r in await rows(store, "SELECT text FROM agent_messages WHERE session_id = 'c'")]
    assert texts.count("just append") == 1 and texts.count("compact now") >= 1
    orphans = await rows(
        store, "SELECT count(*) FROM agent_messages m WHERE m.session_id = 'c' AND m.summarized_by IS NOT NULL AND "
        "NOT EXISTS (SELECT 1 FROM agent_messages s WHERE s.session_id = 'c' AND s.message_id = m.summarized_by)",
    )  # fmt: skip
    assert orphans == [(0,)]


async def test_truncate_and_fork_never_keep_an_exclusion_whose_summary_is_cut(store: Store) -> None:
    await _talk(store, TURNS)
    table = await _table(store)
    summary = min((r for r in table if r[3] is not None), key=lambda r: r[0])
    cut = summary[0] - 1  # before the first summary was committed: its originals are kept, it is not
    branch = await store.fork("c", at_seq=cut, new_id="branch")
    await store.truncate("c", cut)
    for sid in ("c", branch):
        kept = await _table(store, sid)
        assert [r[0] for r in kept] == list(range(cut + 1))
        assert not any(r[6] == summary[1] for r in kept)  # no link to a summary that is not there
        assert all(r[4] == (r[6] is not None) for r in kept)  # excluded only under a summary that is there
        async with store.session(sid) as session:  # and the model sees them again
            await _agent().run("after the cut", session=session)


async def test_search_finds_originals_and_says_which_are_summarized(store: Store) -> None:
    await _talk(store, ["my name is Ann", *TURNS[1:]], sid="s", user="u")
    hits = (await store.search("Ann", user_id="u")).items
    originals = [h for h in hits if h.excluded]
    assert originals and all(h.summarized_by for h in originals)
    summary_ids = {r[0] for r in await rows(store, "SELECT message_id FROM agent_messages WHERE pos IS NOT NULL")}
    assert {h.summarized_by for h in originals} <= summary_ids


async def _model_view(store: Store, sid: str = "c") -> list[tuple[str, str, Any]]:
    run = await store.load(sid)
    view = [(str(m.role), m.text, m.additional_properties.get("_group")) for m in run.history
            if not m.additional_properties.get("_excluded")]  # fmt: skip
    await run.discard()
    return view


async def test_export_and_import_carry_marks_and_places(store: Store) -> None:
    await _talk(store, TURNS)
    lines = [line async for line in store.export(session_id="c")]
    before, view = await _table(store), await _model_view(store)
    assert any(group for _, _, group in view)
    await store.delete("c")
    await store.import_lines(lines)
    assert await _table(store) == before
    assert await _model_view(store) == view


async def test_an_import_whose_columns_contradict_its_marks_is_refused(store: Store) -> None:
    await _talk(store, TURNS)
    lines = [line async for line in store.export(session_id="c")]
    await store.delete("c")
    forged = [line.replace('"excluded": true', '"excluded": false') for line in lines]
    assert forged != lines
    with pytest.raises(InvalidValueError, match="excluded and exclude_reason must say what its marks say"):
        await store.import_lines(forged)
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(0,)]


async def test_the_readme_compaction_queries_answer_on_both_backends(store: Store) -> None:
    names = ("model-view", "excluded-why", "excluded-per-session")
    view, why, how_much = [doc_block("docs/schema-and-sql.md", name).replace("chat-42", "c") for name in names]
    await _talk(store, TURNS)
    seen = await _model_view(store)
    assert [(r[2], r[3]) for r in await rows(store, view)] == [(role, text) for role, text, _ in seen]
    excluded = await rows(store, "SELECT count(*) FROM agent_messages WHERE session_id = 'c' AND excluded")
    reasons = await rows(store, why)
    assert len(reasons) == excluded[0][0] > 0
    assert all(r[2] == "summarized" and r[3] is not None and r[4] for r in reasons)  # each under its summary
    assert (await rows(store, how_much))[0][1:] == (len(await _table(store)), excluded[0][0])


async def test_the_browser_folds_originals_under_their_summary(store: Store) -> None:
    import re

    import httpx

    from agent_store.browser.app import create_app

    await _talk(store, TURNS, sid="b", user="u")
    table = await _table(store, "b")
    summaries = {r[1]: r[0] for r in table if r[3] is not None}
    transport = httpx.ASGITransport(app=create_app(store, page_size=100))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        html = (await client.get("/session?id=b&user=u")).text
    folded = re.findall(r'<details class="originals"><summary class="muted">the (\d+) messages it replaced', html)
    assert sorted(int(n) for n in folded) == sorted(sum(r[6] == s for r in table) for s in summaries)
    links = re.findall(r'<details class="excluded" id="m(\d+)">.*?summarized by <a href="#m(\d+)">', html, re.S)
    assert {(int(m), int(s)) for m, s in links} == {(r[0], summaries[r[6]]) for r in table if r[4]}


@pytest.mark.parametrize("limit", [1, 3, 6, 9])
async def test_a_window_over_a_compacted_history_cuts_no_group(store: Store, limit: int) -> None:
    from agent_framework import ToolResultCompactionStrategy, tool

    @tool
    def weather() -> str:
        """Today's weather."""
        return "sunny"

    def agent() -> Agent:
        history = InMemoryHistoryProvider(skip_excluded=True)
        compaction = CompactionProvider(
            after_strategy=ToolResultCompactionStrategy(keep_last_tool_call_groups=1), history_source_id="in_memory"
        )
        return Agent(client=OfflineChatClient(), name="Bot", context_providers=[history, compaction], tools=[weather])

    for turn in ["call weather", "hello", "call weather", "call weather", "more", "call weather"]:
        async with store.session("w") as session:
            await agent().run(turn, session=session)
    run = await store.load("w", history_limit=limit)
    loaded = run.history
    await run.discard()
    calls = {c.call_id for m in loaded for c in m.contents if c.type == "function_call"}
    assert all(c.call_id in calls for m in loaded for c in m.contents if c.type == "function_result")
    first = next(m for m in loaded if not (m.additional_properties.get("_group") or {}).get("_summary_of_group_ids"))
    assert first.role == "user"  # a window starts at a turn's start: no group is cut


@pytest.mark.parametrize(
    ("forge", "why"),
    [
        (lambda row, rows: row.update(pos=10**18), "pos is not a place"),
        (lambda row, rows: row.update(pos=rows[1]["seq"] * 4294967296), "pos is not a place"),
        (lambda row, rows: row.update(summarized_by="nobody"), "marks name no summary"),
        (lambda row, rows: row.update(excluded_at=1) if not row["excluded"] else None, "excluded_at"),
        # issue 37: columns that contradict the marks, and an excluded_at past the next seq (not a position)
        (lambda row, rows: row.update(excluded=True, marks=None), "must say what its marks say"),
        (lambda row, rows: row.update(exclude_reason="forged", marks=None), "must say what its marks say"),
        (lambda row, rows: _excluded(rows).update(excluded_at=rows[-1]["seq"] * 4), "excluded_at"),
        (lambda row, rows: row.update(body=_with_extra(row["body"], {"_excluded": True})), "carries compaction"),
        (lambda row, rows: row.update(summary_of={"_summary_of_message_ids": []}, marks=None), "not a summary's"),
    ],
)
async def test_an_import_no_run_could_have_written_is_refused(store: Store, forge: Any, why: str) -> None:
    import json

    await _talk(store, TURNS)
    lines = [json.loads(line) for line in [line async for line in store.export(session_id="c")]]
    messages = [line["row"] for line in lines if line.get("kind") == "message"]
    target = next(r for r in messages if not r["excluded"] and r["seq"] != messages[1]["seq"])
    forge(target, messages)
    await store.delete("c")
    with pytest.raises(InvalidValueError, match=why):
        await store.import_lines(json.dumps(line, ensure_ascii=False) for line in lines)
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(0,)]


def _with_extra(body: Any, extra: dict[str, Any]) -> Any:
    body = dict(body) if isinstance(body, dict) else {"type": "message", "contents": []}
    body["additional_properties"] = {**body.get("additional_properties", {}), **extra}
    return body


def _excluded(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r for r in rows if r["excluded"])


def test_places_keep_every_list_order_whatever_the_insertions() -> None:
    import itertools
    import random

    from agent_store.run.positions import assign, order_of

    step = 4294967296
    for seed in range(200):
        rng = random.Random(seed)
        stored = {f"m{i}": i * step for i in range(rng.randint(1, 8))}
        ids = list(stored)
        for turn in range(rng.randint(1, 60)):
            for _ in range(rng.randint(1, 3)):  # inserted anywhere, most often where the last one went
                at = rng.choice([0, 1, len(ids) // 2, len(ids)]) if rng.random() < 0.5 else rng.randrange(len(ids) + 1)
                ids.insert(min(at, len(ids)), f"n{seed}-{turn}-{_}-{rng.random()}")
            end = (len(stored) + len(ids) + 1) * step * 2
            order, appended = order_of(ids, stored)
            placed = assign(order, {}, first_low=min(stored.values()) - step, end=end)
            stored.update(placed)
            for identity in ids[len(ids) - appended :]:
                stored[identity] = end + ids.index(identity)
            assert all(stored[a] < stored[b] for a, b in itertools.pairwise(ids)), seed
