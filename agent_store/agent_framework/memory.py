"""MemoryProvider: long-term memory, facts about a user as ``user:fact.*`` state keys (see the class)."""

from __future__ import annotations

from typing import Any

from agent_framework import AgentSession, ContextProvider, SessionContext, tool

from agent_store.agent_framework.usage_recorder import begin_turn, record_usage

__all__ = ["FACT_PREFIX", "MemoryProvider"]

FACT_PREFIX = "user:fact."


class MemoryProvider(ContextProvider):
    """Long-term memory: facts about a user that every new session of that user starts with.

    Facts are user-scoped state keys ``user:fact.<name>`` (one row each in ``agent_user_state``), loaded with
    the session and committed with the run. Before each run the provider lists them in the instructions and
    offers the model a ``remember(key, value)`` tool; the app can record facts itself with :meth:`remember`.
    Use it on sessions opened with ``store.session(..., user_id=...)``.
    """

    DEFAULT_SOURCE_ID = "agent_store_memory"

    def __init__(self, source_id: str = DEFAULT_SOURCE_ID) -> None:
        super().__init__(source_id)

    @staticmethod
    def facts(session: AgentSession) -> dict[str, Any]:
        return {k[len(FACT_PREFIX) :]: v for k, v in session.state.items() if k.startswith(FACT_PREFIX)}

    @staticmethod
    def remember(session: AgentSession, key: str, value: Any) -> None:
        """Record a fact about the session's user; stored when the run commits."""
        session.state[FACT_PREFIX + key] = value

    async def before_run(
        self, *, agent: Any, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        begin_turn(agent, session, context, self.source_id)  # its model calls, into the usage ledger
        if facts := self.facts(session):
            lines = "\n".join(f"- {key}: {value}" for key, value in sorted(facts.items()))
            context.extend_instructions(self.source_id, f"What you remember about this user:\n{lines}")

        def remember(key: str, value: str) -> str:
            """Remember a lasting fact about the user (e.g. key="name", value="李明") for future conversations."""
            MemoryProvider.remember(session, key, value)
            return f"remembered {key}"

        context.extend_tools(self.source_id, [tool(remember, name="remember")])

    async def after_run(
        self, *, agent: Any, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        record_usage(session, context)
