"""The differential check (tests/differential.py) on a few hundred random scenarios per backend: the model's
requests with agent_store, turn by turn and after a fork or a truncation, are the framework's in-memory
session's. ``bench/studies/differential.py`` runs more seeds."""

from __future__ import annotations

import pytest
from differential import Scenario, in_memory, stored

from agent_store import Store

SEEDS_PER_CHUNK, CHUNKS = 25, 6  # 150 scenarios per backend, in chunks the two xdist workers share


@pytest.mark.parametrize("chunk", range(CHUNKS))
async def test_random_scenarios_match_the_frameworks_in_memory_session(url: str, chunk: int) -> None:
    failures = []
    for seed in range(chunk * SEEDS_PER_CHUNK, (chunk + 1) * SEEDS_PER_CHUNK):
        scenario = Scenario.draw(seed)
        async with Store.from_url(url) as store:
            await store.migrate()
            await store.delete("c", user_id="u")
            await store.delete("branch", user_id="u")
        got = await stored(scenario, url)
        reference = await in_memory(scenario, got.race_order)
        if got.requests != reference.requests:
            failures.append(f"seed {seed} {scenario}: the turns' requests differ")
        elif got.after_cut != reference.after_cut:
            failures.append(f"seed {seed} {scenario}: after the {scenario.cut}, the request differs")
    assert failures == []
