"""StoreHistoryProvider: a ``HistoryProvider`` whose history is the store's ``agent_messages`` table.

Inside ``store.session(...)`` it joins the run: its saves are committed with the run's messages and state in its
one transaction. On any other ``AgentSession`` each save commits on its own (a run of its own, run/commit.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from agent_framework import AgentSession, HistoryProvider, Message, SessionContext

import agent_store.run.load as loading
from agent_store.agent_framework.run_middleware import ContinueLocally, ResultSizeGuard, service_keeps_history
from agent_store.agent_framework.usage_recorder import begin_turn, pending_calls, record_usage
from agent_store.db import message_rows
from agent_store.run.commit import Run, run_of
from agent_store.run.delta import close_tool_pairs, pair_safe_tail
from agent_store.run.read_times import ReadTimes

if TYPE_CHECKING:
    from agent_store.store import Store

__all__ = ["StoreHistoryProvider"]
logger = logging.getLogger("agent_store")
# The session whose provider hooks are running: the framework passes the session to before_run/after_run but
# only its id to get_messages/save_messages, and two sessions may share an id in one process (two tabs).
_HOOKED_SESSION: ContextVar[AgentSession | None] = ContextVar("agent_store_hooked_session", default=None)
# Function-call ids whose results are in the request being prepared (a tool loop in progress).
_ANSWERED: ContextVar[frozenset[str]] = ContextVar("agent_store_answered_calls", default=frozenset())
# When the run being saved read its history from the store (its before_run): the erasure fence's basis.
_READ_AT: ContextVar[datetime | None] = ContextVar("agent_store_read_at", default=None)


@contextmanager
def _hooked(session: AgentSession, context: SessionContext) -> Iterator[None]:
    answered = frozenset(
        c.call_id for m in context.input_messages for c in m.contents if c.type == "function_result" and c.call_id
    )
    token, token2 = _HOOKED_SESSION.set(session), _ANSWERED.set(answered)
    try:
        yield
    finally:
        _HOOKED_SESSION.reset(token)
        _ANSWERED.reset(token2)


class StoreHistoryProvider(HistoryProvider):
    """A ``HistoryProvider`` whose history is the store's ``agent_messages`` table.

    - In a ``store.session(...)`` block it reads the run's loaded history and its saves join the run's commit.
    - On any other ``AgentSession`` each ``save_messages`` is its own transaction; messages are identified by
      the store's own id (``additional_properties["agent_store_id"]``, given on first sight; a provider's
      ``message_id`` is only data), so a retried save stores nothing twice; a save that replays the stored tail
      stores nothing again (replays.py). Both read only the ids being saved and a tail as long as the save.

    Args:
        store: the store to read and write.
        source_id: the provider's id in the agent's pipeline (default ``"agent_store"``).
        continue_locally: when the service no longer knows a service-managed conversation (stored responses
            expire), send the local transcript instead and start a new service conversation (default True).
        user_id: the owner of sessions this provider creates and the only user whose sessions it opens
            outside a run (inside one, the run's user applies).
        history_limit: outside a run, load only the last N messages (tool calls kept with their results).
        skip_excluded: hand the model only the messages a ``CompactionProvider`` left included (as the
            framework's ``InMemoryHistoryProvider(skip_excluded=True)``). The history is still read whole: the
            compaction decides on the whole list, as in memory.
            A ``CompactionProvider(history_source_id=<this source_id>)`` listed after this provider compacts
            the stored history: its marks and summaries commit with the turn's messages.
        Other keyword arguments are ``HistoryProvider``'s: ``load_messages``, ``store_inputs``, ...
    """

    DEFAULT_SOURCE_ID = "agent_store"

    def __init__(
        self,
        store: Store,
        *,
        source_id: str = DEFAULT_SOURCE_ID,
        user_id: str | None = None,
        history_limit: int | None = None,
        continue_locally: bool = True,
        skip_excluded: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(source_id, **options)
        self.store, self.user_id, self.history_limit = store, user_id, history_limit
        self.continue_locally, self.skip_excluded = continue_locally, skip_excluded
        # A plain session's loaded run, by session object, while its turn runs: its list is what a compaction
        # edits (state[source_id]["messages"]), and the turn's save commits the edits with the new messages.
        self._loaded: WeakKeyDictionary[AgentSession, Run] = WeakKeyDictionary()
        # A plain session's run: when its before_run began reading (an erasure after that refuses its save), by
        # session object (one run at a time on one, as the framework's providers assume), and by id for saves
        # made per service call, where only the id is known (the earliest read of it: read_times.py).
        self._read_at: WeakKeyDictionary[AgentSession, datetime] = WeakKeyDictionary()
        self._reads = ReadTimes()

    async def before_run(
        self, *, agent: Any, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        if run_of(session) is None:
            self._read_at[session] = now = datetime.now(UTC)  # a run that failed before saving is forgotten
            self._reads.read(session.session_id, now)
        begin_turn(agent, session, context, self.source_id)  # its model calls, into the usage ledger
        context.extend_middleware(self.source_id, [ResultSizeGuard(self.store.db.settings.max_value_bytes)])
        if session.service_session_id is not None and service_keeps_history(agent):
            # The service keeps this conversation: the local transcript is stored, not sent again, unless the
            # service has forgotten it (then ContinueLocally sends it and a new service conversation starts).
            if self.continue_locally:
                context.extend_middleware(self.source_id, [ContinueLocally(self.local_history, session)])
            return
        if (run := run_of(session)) is not None:
            state["messages"] = run.history  # what a CompactionProvider with this history_source_id compacts
        with _hooked(session, context):
            await super().before_run(agent=agent, session=session, context=context, state=state)
            await self._keep_finished_tools(agent, session, context)  # after the load: not handed twice

    async def _keep_finished_tools(self, agent: Any, session: AgentSession, context: SessionContext) -> None:
        """Per service call, a tool's result is stored before the model call it goes to, not with its answer (the
        framework's rule): a worker that dies during that call has lost no finished tool's work. The framework's
        save after the call hands the same message objects: they carry the store's id and are not stored twice."""
        if not (getattr(agent, "require_per_service_call_history_persistence", False) and self.store_outputs):
            return
        finished = [m for m in context.input_messages if m.role == "tool" and m.contents
                    and all(c.type == "function_result" for c in m.contents)]  # fmt: skip
        if finished:
            await self.save_messages(session.session_id, finished)

    async def after_run(
        self, *, agent: Any, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        record_usage(session, context)  # before the save, which commits a plain session's calls
        read = _READ_AT.set(self._read_at.pop(session, None))
        try:
            with _hooked(session, context):
                await super().after_run(agent=agent, session=session, context=context, state=state)
        finally:
            _READ_AT.reset(read)
            loaded = self._loaded.pop(session, None)
            if loaded is not None and state.get("messages") is loaded.history:
                del state["messages"]  # the store holds them; a plain session's state stays small

    async def local_history(self, session: AgentSession) -> list[Message]:
        """What the model would get from this store without a service-side conversation (windowed, pair-safe)."""
        if (run := run_of(session)) is not None:
            return close_tool_pairs(pair_safe_tail(list(run.history), self.history_limit))[0]
        loaded = await loading.load(
            self.store.db, session.session_id, user_id=self.user_id, agent_id=None, history_limit=self.history_limit
        )
        return list(loaded.history)

    def _joined_run(self, session_id: str | None) -> Run | None:
        session = _HOOKED_SESSION.get()
        if session is None or session.session_id != session_id:
            return None
        return run_of(session)

    async def get_messages(
        self, session_id: str | None, *, state: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Message]:
        if (run := self._joined_run(session_id)) is not None:
            return self._handed(run.history)
        if session_id is None:
            return []
        loaded = await loading.load(
            self.store.db, session_id, user_id=self.user_id, agent_id=None, history_limit=self.history_limit,
            answered=_ANSWERED.get(),  # whole, even with skip_excluded: a compaction must see the whole list
        )  # fmt: skip
        if (session := _HOOKED_SESSION.get()) is not None and session.session_id == session_id and state is not None:
            self._loaded[session], state["messages"] = loaded, loaded.history  # for a compaction after the run
        return self._handed(loaded.history)

    def _handed(self, history: list[Message]) -> list[Message]:
        if not self.skip_excluded:
            return list(history)
        return [m for m in history if not m.additional_properties.get("_excluded", False)]

    async def save_messages(
        self, session_id: str | None, messages: Sequence[Message], *, state: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if not messages or session_id is None:
            return
        if (run := self._joined_run(session_id)) is not None:
            run.add_messages(messages)
            return
        session = _HOOKED_SESSION.get()
        loaded = self._loaded.get(session) if session is not None and session.session_id == session_id else None
        if loaded is not None and any(message_rows.has_marks(m) for m in loaded.history):
            # A compaction edited the loaded history: its edits commit with these messages, in one transaction,
            # on the history this turn loaded (another commit since: ConflictError, nothing written).
            loaded.add_messages(messages)
            loaded.calls.extend(pending_calls(session))
            await loaded.commit()
            return
        # Dated from this run's before_run (a save per service call comes before after_run: the earliest read of
        # the id on record); a provider that loads nothing (load_messages=False) read nothing: now.
        read_at = _READ_AT.get() or self._reads.earliest(session_id)
        read_at = read_at or (None if self.load_messages else datetime.now(UTC))
        plain = AgentSession(session_id=session_id)
        standalone = Run.unloaded(self.store.db, plain, user_id=self.user_id, read_at=read_at)
        standalone.skip_replays = True  # a replay of the stored tail stores nothing (replays.py)
        standalone.add_messages(messages)
        standalone.calls.extend(pending_calls(session))
        await standalone.commit()
