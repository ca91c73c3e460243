"""A shared fork (``store.fork(..., share=True)``: a branch reading its history through its base) gives the model
what a copying fork of the same cut gives it, at every cut, under the framework's own compaction (issue 58,
finding 1); and its view does not change when the base goes on compacting, or is truncated back to the cut or
later. On both backends, with the real Agent, CompactionProvider and the offline client."""

from __future__ import annotations

from typing import Any

import pytest
from agent_framework import (
    Agent,
    CompactionProvider,
    InMemoryHistoryProvider,
    SlidingWindowStrategy,
    SummarizationStrategy,
)

from agent_store import InvalidValueError, Store
from agent_store.offline import OfflineChatClient

STRATEGIES = {
    "summarization": lambda: SummarizationStrategy(client=OfflineChatClient(), target_count=4, threshold=2),
    "sliding-window": lambda: SlidingWindowStrategy(keep_last_groups=2),
}
TURNS = ["我叫李明", "hello", "how are you", "call weather", "tell me more", "我叫什么名字？"]


def agent(strategy: str) -> Agent:
    history = InMemoryHistoryProvider(skip_excluded=True)  # the model gets what the compaction left included
    compaction = CompactionProvider(after_strategy=STRATEGIES[strategy](), history_source_id=history.source_id)
    return Agent(client=OfflineChatClient(), name="Bot", context_providers=[history, compaction])


async def view(store: Store, session_id: str) -> tuple[list[Any], list[str]]:
    """Every loaded message with its compaction marks, and the texts the model is sent (the included ones)."""
    whole = await store.load(session_id, user_id="u")
    marks = [(m.role, m.text, m.additional_properties.get("_excluded"), m.additional_properties.get("_group"))
             for m in whole.history]  # fmt: skip
    await whole.discard()
    return marks, [text for _, text, excluded, _ in marks if not excluded]  # (a branch is loaded whole)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_a_shared_fork_sees_what_a_copy_of_the_same_cut_sees_and_keeps_seeing_it(
    store: Store, strategy: str
) -> None:
    bot = agent(strategy)
    for turn in TURNS:
        async with store.session("base", user_id="u") as session:  # each turn a run, compacting as it goes
            await bot.run(turn, session=session)
    last = len(await store.messages("base", user_id="u")) - 1
    seen: dict[int, tuple[list[Any], list[str]]] = {}
    for cut in range(last + 1):
        copy = await store.fork("base", user_id="u", at_seq=cut, new_id=f"copy-{cut}")
        shared = await store.fork("base", user_id="u", at_seq=cut, new_id=f"shared-{cut}", share=True)
        seen[cut] = await view(store, copy)
        assert await view(store, shared) == seen[cut], f"cut {cut}"
    for turn in ["and now?", "hello again"]:  # the base compacts further: no branch sees it
        async with store.session("base", user_id="u") as session:
            await bot.run(turn, session=session)
    for cut in range(last + 1):
        assert await view(store, f"shared-{cut}") == seen[cut], f"cut {cut}, after the base compacted again"
    alive = set(range(last + 1))
    for back_to in (last, last - 3):  # a truncation refuses to cut under a branch: those are deleted first
        while True:
            try:
                await store.truncate("base", back_to, user_id="u")
                break
            except InvalidValueError as refused:
                under = int(str(refused).split("branch ('shared-", 1)[1].split("'", 1)[0])
                assert await store.delete(f"shared-{under}", user_id="u")
                alive.discard(under)
        assert alive and max(alive) <= back_to
        for cut in sorted(alive):
            assert await view(store, f"shared-{cut}") == seen[cut], f"cut {cut}, after a truncate to {back_to}"


async def test_a_shared_fork_of_a_copy_inside_its_copied_compaction_is_refused(store: Store) -> None:
    """A copy keeps its source's earlier marks without their versions: a branch of it where they would be read is
    refused with a typed error (found by an outside review: it read no marks at all), never a different view."""
    bot = agent("sliding-window")
    for turn in TURNS[:3]:
        async with store.session("base", user_id="u") as session:
            await bot.run(turn, session=session)
    await store.fork("base", user_id="u", at_seq=5, new_id="copy")
    with pytest.raises(InvalidValueError, match="branch the session it was copied from, or make a copy"):
        await store.fork("copy", user_id="u", at_seq=2, new_id="shared", share=True)
    copied = await store.fork("copy", user_id="u", at_seq=2, new_id="copied")  # a copy of it is exact
    assert await view(store, copied) == await view(store, await store.fork("base", user_id="u", at_seq=2,
                                                                            new_id="direct", share=True))  # fmt: skip
