"""Search by meaning as a user meets it (issue 59 item 3), on both backends with the offline embedder: a question
of any length, a similarity cut-off and the score shown, snippets that mark whole words only, the CLI ranking by
meaning by default where the store has vectors, and a search by words that finds nothing saying how to mean."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import cli
from test_hybrid_search import keys, semantic  # noqa: F401 (the fixture)
from test_search import say

from agent_store import InvalidValueError, Store

LONG = ("could you please remind me which exact day the airplane leaves for Denver and also tell me where my "
        "assigned seat is because I honestly forgot all of it again")  # 30 words, none the target's spelling
TRIP = "Flight UA 455 to Denver departs Thursday 7:10, seat 14C"


async def _filled(store: Store) -> None:
    await say(store, "trip", TRIP, "My dog is sick again", "Buy milk and eggs", "The offsite is on Thursday")
    assert await store.embeddings.backfill() == 4


async def test_a_question_of_any_length_is_searched_by_meaning(semantic: Store) -> None:  # noqa: F811
    await _filled(semantic)
    with pytest.raises(InvalidValueError, match="by meaning"):  # words alone: the limit, and what has none
        await semantic.search(LONG, user_id="u", ranking="keyword")
    for ranking in ("hybrid", "vector", "auto"):
        page = await semantic.search(LONG, user_id="u", ranking=ranking, limit=3)
        assert (page.items[0].session_id, page.items[0].seq) == ("trip", 0), ranking
    # the words' leg takes the longest terms: "Denver" is among them, so the hit is found by its words too
    page = await semantic.search(LONG + " Denver", user_id="u", ranking="hybrid", limit=3)
    assert page.items[0].seq == 0 and page.items[0].marks


async def test_a_cut_off_drops_what_is_found_by_meaning_alone_below_it(semantic: Store) -> None:  # noqa: F811
    await _filled(semantic)
    every = await semantic.search("airplane ticket", user_id="u", ranking="vector", limit=10)
    scores = [h.similarity for h in every.items]
    assert len(scores) == 4 and all(s is not None for s in scores) and scores == sorted(scores, reverse=True)
    floor = (scores[0] + scores[1]) / 2  # type: ignore[operator]
    cut = await semantic.search("airplane ticket", user_id="u", ranking="vector", min_score=floor)
    assert [(h.session_id, h.seq) for h in cut.items] == [(every.items[0].session_id, every.items[0].seq)]
    assert (await semantic.search("airplane ticket", user_id="u", ranking="hybrid", min_score=1.0)).items == []
    kept = await semantic.search("Denver", user_id="u", ranking="hybrid", min_score=1.0)  # found by its words
    assert [(h.session_id, h.seq) for h in kept.items] == [("trip", 0)]
    for bad in (1.5, -2, True, "0.5", float("nan")):
        with pytest.raises(InvalidValueError, match="min_score"):
            await semantic.search("airplane", user_id="u", ranking="hybrid", min_score=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="min_score"):
        await semantic.search("airplane", user_id="u", ranking="keyword", min_score=0.5)


async def test_a_hit_found_by_meaning_alone_marks_whole_words_only(semantic: Store) -> None:  # noqa: F811
    await _filled(semantic)
    page = await semantic.search("sit day meeting", user_id="u", ranking="vector", limit=10)
    offsite = [h for h in page.items if "offsite" in h.snippet]
    assert offsite and offsite[0].marks == []  # neither "off[sit]e" nor "Thurs[day]"
    words = await semantic.search("sit", user_id="u", ranking="keyword")  # words find inside words, and say so
    assert any(h.snippet[a:b].lower() == "sit" for h in words.items for a, b in h.marks)
    assert (await keys(semantic, "dog", "keyword")) == [("trip", 1)]


async def test_the_cli_shows_the_score_and_says_how_to_search_by_meaning(
    url: str, semantic: Store, tmp_path: Path  # noqa: F811
) -> None:  # fmt: skip
    await say(semantic, "trip", TRIP)
    nothing = cli("search", "airplane ticket", "--user", "u", url=url, cwd=tmp_path)
    assert nothing.returncode == 0 and "agent-store embed" in nothing.stderr and "--ranking hybrid" in nothing.stderr
    assert (await semantic.embeddings.backfill()) == 1
    found = cli("search", "airplane ticket", "--user", "u", url=url, cwd=tmp_path)  # auto: the vectors' embedder
    assert found.returncode == 0, found.stderr
    header, row = found.stdout.splitlines()[:2]
    assert "SCORE" in header and "Denver" in row
    score = float(row.split()[header.split().index("SCORE")])  # (WHEN (UTC): two words in each)
    assert 0 < score <= 1
    cut = cli("search", "airplane ticket", "--user", "u", "--ranking", "hybrid", "--min-score", "1", url=url,
              cwd=tmp_path)  # fmt: skip
    assert cut.returncode == 0 and "Denver" not in cut.stdout


async def test_the_browser_says_how_to_search_by_meaning_when_words_find_nothing(store: Store) -> None:
    import httpx

    from agent_store.browser.app import create_app

    await say(store, "trip", TRIP)
    transport = httpx.ASGITransport(app=create_app(store))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        nothing = (await client.get("/search", params={"q": "airplane ticket", "user": "u"})).text
        found = (await client.get("/search", params={"q": "Denver", "user": "u"})).text
    assert "agent-store embed" in nothing and "No message has all these words" in nothing
    assert "Denver" in found and "No message has all these words" not in found
