"""A Hypothesis state machine against a plain in-memory model, checked after every step, on SQLite and PostgreSQL.

Steps: runs (some failing), concurrent pairs, stale runs loaded now and committed many steps later (across
deletes, re-creations, expiry restarts, forks, truncations, closes and user erasure), and a commit whose reply
is lost after COMMIT reached the database, retried with more changes made in between. The model says what
must happen: which commit lands, which conflicts (same key, or another incarnation), which finds nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import pytest
from agent_framework import Message
from helpers import expire_now, lose_the_reply
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from sqlalchemy import text

from agent_store import (
    ConflictError,
    InvalidValueError,
    Run,
    SessionClosedError,
    SessionNotFoundError,
    StorageUnavailableError,
    Store,
)

T = TypeVar("T")
NAMES = st.sampled_from(["a", "b", "c"])
KEYS = st.sets(st.sampled_from(["k1", "k2", "k3", "k4", "later", "restarted"]), max_size=3)


class Boom(Exception):
    pass


INCARNATIONS = itertools.count(1)


@dataclass
class Model:
    messages: list[str] = field(default_factory=list)
    state: dict[str, int] = field(default_factory=dict)
    closed: bool = False
    incarnation: int = field(default_factory=lambda: next(INCARNATIONS), compare=False)
    stamps: dict[str, int] = field(default_factory=dict, compare=False)  # which write each key holds


@dataclass
class Stale:
    """A run loaded at some step, with its changes made, committed at a later step."""

    name: str
    run: Run
    incarnation: int | None  # None: the session did not exist at load
    stamps: dict[str, int]
    message: str
    values: dict[str, int]
    erased: bool = False  # its user was erased after it loaded: it may not create a session of that user


class StoreMachine(RuleBasedStateMachine):
    url: str = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.store = Store.from_url(self.url)
        self.prefix = uuid.uuid4().hex[:8] + "-"  # each example gets its own sessions: no cleanup between examples
        self.model: dict[str, Model] = {}
        self.counter = itertools.count()
        self.stale: list[Stale] = []

    def do(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.teardown_stale()
        self.do(self.store.close())
        self.loop.close()

    def sid(self, name: str) -> str:
        return self.prefix + name

    def message(self) -> Message:
        return Message(role="user", contents=[f"m{next(self.counter)}"])

    @rule(name=NAMES, n=st.integers(0, 3), sets=KEYS, deletes=KEYS, fail=st.booleans())
    def run(self, name: str, n: int, sets: set[str], deletes: set[str], fail: bool) -> None:
        expected = self.model.get(name)
        new = [self.message() for _ in range(n)]
        values = {k: next(self.counter) for k in sets}

        async def go() -> None:
            async with self.store.session(self.sid(name), user_id="u") as session:
                session.state["in_memory"]["messages"].extend(new)
                session.state.update(values)
                for key in deletes - sets:
                    session.state.pop(key, None)
                if fail:
                    raise Boom

        if expected is not None and expected.closed:
            with pytest.raises(SessionClosedError):
                self.do(go())
            return
        if fail:
            with pytest.raises(Boom):
                self.do(go())
            return
        self.do(go())
        model = self.model.setdefault(name, Model())
        model.messages += [m.text for m in new]
        self.write(model, values, deletes - sets)

    def write(self, model: Model, values: dict[str, int], deletes: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        model.state.update(values)
        model.stamps.update({k: next(self.counter) for k in values})
        for key in deletes:
            model.state.pop(key, None)
            model.stamps.pop(key, None)

    @rule(name=NAMES, first=KEYS, second=KEYS)
    def concurrent_pair(self, name: str, first: set[str], second: set[str]) -> None:
        """Two runs load the same version; the second to commit conflicts exactly when they share a key."""
        model = self.model.get(name)
        if model is not None and model.closed:
            return
        a, b = (
            self.do(self.store.load(self.sid(name), user_id="u")),
            self.do(self.store.load(self.sid(name), user_id="u")),
        )
        writes = []
        for run, keys in ((a, first), (b, second)):
            message, values = self.message(), {k: next(self.counter) for k in keys}
            run.session.state["in_memory"]["messages"].append(message)
            run.session.state.update(values)
            writes.append((message.text, values))
        self.do(a.commit())
        model = self.model.setdefault(name, Model())
        model.messages.append(writes[0][0])
        self.write(model, writes[0][1])
        if first & second:
            with pytest.raises(ConflictError):
                self.do(b.commit())
        else:
            self.do(b.commit())
            model.messages.append(writes[1][0])
            self.write(model, writes[1][1])

    def teardown_stale(self) -> None:
        for late in self.stale:
            self.do(late.run.discard())

    @rule(name=NAMES)
    def delete(self, name: str) -> None:
        assert self.do(self.store.delete(self.sid(name), user_id="u")) is (name in self.model)
        self.model.pop(name, None)

    @rule(name=NAMES)
    def close(self, name: str) -> None:
        if name not in self.model:
            with pytest.raises(SessionNotFoundError):
                self.do(self.store.close_session(self.sid(name), user_id="u"))
            return
        self.do(self.store.close_session(self.sid(name), user_id="u"))
        self.model[name].closed = True

    @rule(name=NAMES, at=st.none() | st.integers(0, 6))
    def fork(self, name: str, at: int | None) -> None:
        source = self.model.get(name)
        new_name = f"f{next(self.counter)}"
        if source is None:
            with pytest.raises(SessionNotFoundError):
                self.do(self.store.fork(self.sid(name), user_id="u", new_id=self.sid(new_name)))
            return
        if at is not None and at >= len(source.messages):
            with pytest.raises(InvalidValueError, match="past the session's last message"):
                self.do(self.store.fork(self.sid(name), user_id="u", at_seq=at, new_id=self.sid(new_name)))
            return
        self.do(self.store.fork(self.sid(name), user_id="u", at_seq=at, new_id=self.sid(new_name)))
        kept = source.messages if at is None else source.messages[: at + 1]
        fork = self.model[new_name] = Model(messages=list(kept))
        self.write(fork, dict(source.state))  # copied rows get fresh stamps

    @rule(name=NAMES, after=st.integers(-1, 6))
    def truncate(self, name: str, after: int) -> None:
        if name not in self.model:
            return
        model = self.model[name]
        if not 0 <= after < len(model.messages):
            with pytest.raises(InvalidValueError):
                self.do(self.store.truncate(self.sid(name), after, user_id="u"))
            return
        removed = self.do(self.store.truncate(self.sid(name), after, user_id="u"))
        assert removed == len(model.messages) - (after + 1)
        model.messages = model.messages[: after + 1]

    @rule()
    def erase_user(self) -> None:
        report = self.do(self.store.erase_user("u"))
        assert report.sessions >= len(self.model)  # other examples' sessions of "u" may remain from before
        self.model.clear()
        for late in self.stale:
            late.erased = True

    @rule(name=NAMES)
    def expire_and_restart(self, name: str) -> None:
        """The session outlives its TTL; the next load starts a new incarnation in its place."""
        if name not in self.model or self.model[name].closed:
            return

        async def go() -> None:
            await expire_now(self.store, self.sid(name))
            async with self.store.session(self.sid(name), user_id="u", if_expired="restart") as session:
                session.state["restarted"] = 1

        self.do(go())
        self.model[name] = Model()
        self.write(self.model[name], {"restarted": 1})

    @rule(name=NAMES, keys=KEYS)
    def load_stale(self, name: str, keys: set[str]) -> None:
        model = self.model.get(name)
        if (model is not None and model.closed) or len(self.stale) >= 3:
            return
        run = self.do(self.store.load(self.sid(name), user_id="u"))
        message, values = self.message(), {k: next(self.counter) for k in keys}
        run.history.append(message)
        run.session.state.update(values)
        incarnation = None if model is None else model.incarnation
        stamps = {} if model is None else dict(model.stamps)
        self.stale.append(Stale(name, run, incarnation, stamps, message.text or "", values))

    @rule(data=st.data())
    def commit_stale(self, data: st.DataObject) -> None:
        if not self.stale:
            return
        late = self.stale.pop(data.draw(st.integers(0, len(self.stale) - 1)))  # -1: the newest, from stale_across
        model = self.model.get(late.name)
        if late.erased and late.incarnation is None:
            expected: type[Exception] | None = SessionNotFoundError  # the erasure fence
        elif late.incarnation is not None and model is None:
            expected = SessionNotFoundError
        elif model is not None and late.incarnation is not None and model.incarnation != late.incarnation:
            expected = ConflictError  # the id names another conversation now
        elif model is not None and model.closed:
            expected = SessionClosedError
        elif model is not None and any(model.stamps.get(k) != late.stamps.get(k) for k in late.values):
            expected = ConflictError  # a key it writes was written (or created) since its load
        else:
            expected = None
        if expected is not None:
            with pytest.raises(expected):
                self.do(late.run.commit())
            return
        self.do(late.run.commit())
        model = self.model.setdefault(late.name, Model())
        model.messages.append(late.message)
        self.write(model, late.values)

    @rule(
        name=NAMES,
        keys=KEYS,
        between=st.sampled_from(["nothing", "delete", "recreate", "restart", "erase", "truncate", "other-write"]),
    )
    def stale_across(self, name: str, keys: set[str], between: str) -> None:
        """A run loads, one other operation happens, the run commits: the model says what that commit does."""
        pending = len(self.stale)
        self.load_stale(name, keys)
        if len(self.stale) == pending:  # closed, or enough stale runs pending already
            return
        if between in ("delete", "recreate"):
            self.delete(name)
            if between == "recreate":
                self.run(name, 1, set(), set(), False)
        elif between == "restart":
            self.expire_and_restart(name)
        elif between == "erase":
            self.erase_user()
        elif between == "truncate" and name in self.model and self.model[name].messages:
            self.truncate(name, 0)
        elif between == "other-write":
            self.run(name, 1, set(keys), set(), False)

        class Last:
            def draw(self, _strategy: object) -> int:
                return -1

        self.commit_stale(Last())  # type: ignore[arg-type]

    @rule(name=NAMES, keys=KEYS)
    def lost_reply_then_retry(self, name: str, keys: set[str]) -> None:
        """COMMIT reaches the database, the reply is lost; the retry writes the first delta once, not the news."""
        model = self.model.get(name)
        if model is not None and model.closed:
            return
        run = self.do(self.store.load(self.sid(name), user_id="u"))
        first, values = self.message(), {k: next(self.counter) for k in keys}
        run.history.append(first)
        run.session.state.update(values)
        lose_the_reply(self.store)
        with pytest.raises(StorageUnavailableError):
            self.do(run.commit())
        later = self.message()
        run.history.append(later)  # made after the first attempt: belongs to the next commit
        run.session.state["later"] = next(self.counter)
        retried = self.do(run.commit())
        assert (retried.messages_written, retried.state_keys_written) == (1, len(values))
        model = self.model.setdefault(name, Model())
        model.messages.append(first.text or "")
        self.write(model, values)
        self.do(run.commit())
        model.messages.append(later.text or "")
        self.write(model, {"later": run.session.state["later"]})

    @invariant()
    def database_equals_model(self) -> None:
        async def read() -> dict[str, Model]:
            found: dict[str, Model] = {}
            async with self.store.engine.connect() as conn:
                sessions = await conn.execute(
                    text("SELECT id, closed_at, next_seq FROM agent_sessions WHERE id LIKE :p"),
                    {"p": self.prefix + "%"},
                )
                for sid, closed_at, next_seq in sessions.all():
                    msgs = await conn.execute(
                        text("SELECT seq, text FROM agent_messages WHERE session_id = :s ORDER BY seq"), {"s": sid}
                    )
                    pairs = msgs.all()
                    assert [p[0] for p in pairs] == list(range(next_seq)), sid  # gap-free, count matches
                    state = await conn.execute(
                        text("SELECT key, value FROM agent_state WHERE session_id = :s"), {"s": sid}
                    )
                    values = {k: int(v) for k, v in state.all()}
                    found[sid[len(self.prefix) :]] = Model([p[1] for p in pairs], values, closed_at is not None)
            return found

        assert self.do(read()) == self.model


def test_the_store_behaves_like_the_model(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # One process, one clock: no skew to allow for, so a run loaded after an erasure is never fenced out.
    monkeypatch.setattr("agent_store.run.commit.ERASURE_MARGIN", timedelta(0))

    async def migrate() -> None:
        async with Store.from_url(url) as store:
            await store.migrate()

    loop = asyncio.new_event_loop()
    loop.run_until_complete(migrate())
    loop.close()
    StoreMachine.url = url
    run_state_machine_as_test(
        StoreMachine,
        settings=settings(
            max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck)
        ),
    )
