"""Recall@10 of keyword, vector and hybrid search on the generated paraphrase set (tests/paraphrases.py: 540
queries that share no word with the message they ask for, in English, Chinese and Japanese, among 522 stored
messages), on both backends, through the store's own search with the offline embedder. The table is printed
(pytest -s) and is the README's; the floors asserted are this embedder's measured figures less a margin, so a
change that loses recall fails here."""

from __future__ import annotations

from collections import defaultdict

from agent_framework import Message
from paraphrases import LANGUAGES, history, queries, shared_words
from test_hybrid_search import EMBEDDER

from agent_store import Store

FLOORS = {("hybrid", "en"): 0.85, ("vector", "en"): 0.85, ("hybrid", "zh"): 0.12, ("hybrid", "ja"): 0.12}


def test_the_set_is_what_it_claims() -> None:
    texts = dict(history())
    asked = queries()
    assert len(asked) >= 500 and {lang for lang, _, _ in asked} == set(LANGUAGES)
    assert all(not shared_words(texts[key], query, lang) for lang, query, key in asked), "a query shares a word"
    assert len(texts) == len(history()) > 500  # keys are unique


async def recall_table(store: Store) -> dict[tuple[str, str], float]:
    stored = history()
    for start in range(0, len(stored), 100):  # a run per 100 messages, one session
        async with store.session("history", user_id="u") as session:
            for _, text in stored[start : start + 100]:
                session.state["in_memory"]["messages"].append(Message(role="user", contents=[text]))
    keys = [key for key, _ in stored]  # seq i holds stored[i]
    assert await store.embeddings.backfill() == len(stored)
    found: dict[tuple[str, str], list[bool]] = defaultdict(list)
    for lang, query, key in queries():
        for ranking in ("keyword", "vector", "hybrid"):
            page = await store.search(query, user_id="u", ranking=ranking, limit=10)
            found[ranking, lang].append(any(keys[h.seq] == key for h in page.items))
    return {cell: sum(hits) / len(hits) for cell, hits in found.items()}


async def test_recall_at_10_keyword_vector_hybrid(url: str, store: Store) -> None:
    async with Store.from_url(url, embedder=EMBEDDER) as semantic:
        table = await recall_table(semantic)
    print(f"\nrecall@10 ({url.split(':')[0]}, {EMBEDDER.profile.name})")
    print("| ranking | " + " | ".join(LANGUAGES) + " | all |")
    for ranking in ("keyword", "vector", "hybrid"):
        cells = [table[ranking, lang] for lang in LANGUAGES]
        print(f"| {ranking} | " + " | ".join(f"{c:.3f}" for c in cells) + f" | {sum(cells) / 3:.3f} |")
    assert all(table["keyword", lang] < 0.1 for lang in LANGUAGES)  # no shared word: words find (almost) nothing
    for cell, floor in FLOORS.items():
        assert table[cell] >= floor, (cell, table[cell])
    assert all(table["hybrid", lang] >= table["vector", lang] - 0.02 for lang in LANGUAGES)
