"""What centering does to search by meaning in a history that mixes languages (issue 59 item 1): recall@10 of the
e5 embedder on the project's paraphrase set (tests/paraphrases.py), for a user whose history is one language's
targets and messages plus N messages of another language, ranked by cosine after subtracting nothing, the mean of
the user's vectors (what vectors.py does today), or the mean of the per-script means (kana, han, latin). Offline:
``.venv/bin/python bench/studies/centering.py``; prints a table."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from paraphrases import LANGUAGES, history, queries

from agent_store.search.embedders import E5Embedder, unit

KANA, HAN = re.compile(r"[\u3040-\u30ff]"), re.compile(r"[\u3400-\u9fff]")


def script(text: str) -> str:
    return "kana" if KANA.search(text) else "han" if HAN.search(text) else "latin"


def by_script(vectors: np.ndarray, texts: list[str]) -> np.ndarray:
    groups: dict[str, list[np.ndarray]] = {}
    for vector, text in zip(vectors, texts, strict=True):
        groups.setdefault(script(text), []).append(vector)
    return np.mean([np.mean(g, axis=0) for g in groups.values()], axis=0)


CENTERS = {"none": lambda v, t: np.zeros(v.shape[1]), "user's mean": lambda v, t: v.mean(axis=0),
           "mean of scripts": by_script}  # fmt: skip


async def main() -> None:
    e5 = E5Embedder()
    texts = {key: text for lang in LANGUAGES for key, text in history(lang)}
    keys = list(texts)
    vectors = dict(zip(keys, unit(await e5.embed([texts[k] for k in keys])), strict=True))
    asked = queries()
    query_vectors = unit(await e5.embed_query([q for _, q, _ in asked]))

    def recall(scope: list[str], lang: str, center: str) -> float:
        matrix = np.array([vectors[k] for k in scope])
        c = CENTERS[center](matrix, [texts[k] for k in scope])
        hits = [any(scope[i] == target for i in np.argsort(-(unit(matrix - c) @ unit((q - c)[None])[0]))[:10])
                for (ql, _, target), q in zip(asked, query_vectors, strict=True) if ql == lang]  # fmt: skip
        return float(np.mean(hits))

    print("| user's history | " + " | ".join(CENTERS) + " |\n|---|" + "---|" * len(CENTERS))
    for lang, other in (("ja", "en"), ("zh", "en"), ("en", "ja"), ("en", "zh")):
        own = [k for k, _ in history(lang) if k.startswith((f"{lang}-", f"d-{lang}-", f"f-{lang}-"))]
        theirs = [k for k, _ in history(lang) if k.startswith((f"d-{other}-", f"f-{other}-"))]
        for n in (0, 10, 20, 50, 200):
            cells = [f"{recall(own + theirs[:n], lang, c):.3f}" for c in CENTERS]
            print(f"| {lang} ({len(own)}) + {n} {other} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    asyncio.run(main())
