"""The ledger at its edges (issue 27, from the fourteenth session's adversarial review): a failed turn's calls never
land in a session that is no longer the one it loaded, nor after an erasure of its user; a budget of 0 refuses the
first run of a period; a provider's oddly named count never fails a commit."""

from __future__ import annotations

import asyncio

import pytest
from agent_framework import Agent, Message
from helpers import rows

from agent_store import BudgetExceededError, Store
from agent_store.agent_framework import UsageRecorder
from agent_store.offline import OfflineChatClient


@pytest.fixture
def bot() -> Agent:
    return Agent(client=OfflineChatClient(), name="Bot", middleware=[UsageRecorder()])


async def ledger(store: Store) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = await rows(store, "SELECT session_id, user_id FROM agent_usage ORDER BY called_at")
    return found


async def test_a_failed_turn_logs_nothing_into_a_session_another_user_now_owns(store: Store, bot: Agent) -> None:
    await store.usage.set_budget(1_000_000, period="total")  # the app's: spent tokens are charged all the same
    async with store.session("s", user_id="bob") as session:
        await bot.run("hello", session=session)
    with pytest.raises(RuntimeError, match="bob's turn fails"):
        async with store.session("s", user_id="bob") as session:
            await bot.run("my name is Bob", session=session)  # a model call: spent
            await store.delete("s", user_id="bob")  # meanwhile the session goes, and carol takes its id
            async with store.session("s", user_id="carol") as other:
                await bot.run("hi", session=other)
            raise RuntimeError("bob's turn fails")
    assert await ledger(store) == [("s", "carol")]  # bob's first call went with his deleted session
    assert await rows(store, "SELECT DISTINCT user_id FROM agent_usage WHERE session_id = 's'") == [("carol",)]
    info = await store.usage.budget()
    charged: list[tuple[int]] = await rows(store, "SELECT sum(total_tokens) FROM agent_usage")
    assert info is not None and info.used > charged[0][0]  # bob's failed call counted against the app
    exported = [line async for line in store.export(user_id="carol")]
    await store.delete("s", user_id="carol")
    await store.import_lines(exported)  # carol's export is hers alone: it imports back
    assert await ledger(store) == [("s", "carol")]


async def test_a_turn_loaded_before_its_users_erasure_logs_nothing_after_it(store: Store, bot: Agent) -> None:
    async with store.session("s", user_id="bob") as session:
        await bot.run("hello", session=session)
    with pytest.raises(RuntimeError, match="old turn fails"):
        async with store.session("s", user_id="bob") as session:  # loaded before the erasure
            await bot.run("my name is Bob", session=session)
            assert (await store.erase_user("bob")).usage_calls == 1
            await asyncio.sleep(1.2)  # past the erasure fence's margin: bob may come back
            async with store.session("s", user_id="bob") as again:
                await bot.run("a fresh start", session=again)
            raise RuntimeError("old turn fails")
    assert await rows(store, "SELECT outcome FROM agent_runs") == [("committed",)]  # the new one only
    assert await ledger(store) == [("s", "bob")]


@pytest.mark.parametrize("user_id", ["zero", None])  # a user's budget, the app's
async def test_a_budget_of_zero_refuses_the_first_run_of_a_period(store: Store, user_id: str | None) -> None:
    await store.usage.set_budget(0, period="day", user_id=user_id)
    with pytest.raises(BudgetExceededError) as refused:
        await store.load("s", user_id="zero")
    assert (refused.value.used, refused.value.limit) == (0, 0)
    assert await rows(store, "SELECT count(*) FROM agent_sessions") == [(0,)]


async def test_a_count_named_oddly_never_fails_the_commit(store: Store) -> None:
    run = await store.load("s", user_id="u")
    run.history.append(Message(role="user", contents=["hello"]))
    run.add_usage({"input_token_count": 1, "cache\x00odd": 5, "odd\ud800": 7, "x" * 300: 9})
    await run.commit()
    assert await rows(store, "SELECT count(*) FROM agent_messages") == [(1,)]
    extra: list[tuple[str]] = await rows(store, "SELECT CAST(extra AS TEXT) FROM agent_usage")
    assert "cache\ufffdodd" in extra[0][0] and "odd?" in extra[0][0] and "x" * 300 not in extra[0][0]
