"""The ``AgentSession`` a store hands out, and how the framework seams find the run that loaded it."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from agent_framework import AgentSession

if TYPE_CHECKING:
    from agent_store.run.commit import Run


class StoredSession(AgentSession):
    """The ``AgentSession`` a store hands out: an ordinary session that also knows the run that loaded it.

    The framework seams (history provider, session store, memory) find the run through it. The link is not
    serialized (``to_dict``) and not copied: a deep copy is a plain ``AgentSession``.
    """

    _run: Run | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> AgentSession:
        clone = AgentSession(
            session_id=self.session_id, service_session_id=copy.deepcopy(self.service_session_id, memo)
        )
        clone.state = copy.deepcopy(self.state, memo)
        return clone


def run_of(session: AgentSession) -> Run | None:
    """The store run that loaded ``session``, if it came from ``store.load`` / ``store.session``."""
    return session._run if isinstance(session, StoredSession) else None
