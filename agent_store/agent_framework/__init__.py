"""Agent Framework seams backed by the store: what an agent's pipeline plugs in.

    history_provider.py   StoreHistoryProvider: the history is agent_messages (joins a store run, or commits alone)
    memory.py             MemoryProvider: facts about a user every new session starts with
    session_store.py      StoreSessionStore: the framework's SessionStore (get / set / delete)
    checkpoints.py        StoreCheckpointStorage: workflow checkpoints; checkpoint_payloads.py decodes them safely
    run_middleware.py     the size guard for tool results; continuing locally when the service forgot
    usage_recorder.py     UsageRecorder: each model call into the usage ledger (the providers add it themselves)
    search_tool.py        SearchHistoryProvider: a tool that searches the user's past conversations
    vector_history.py     StoreVectorStore: the framework's VectorStoreHistoryProvider on the store's messages
                          (imported on its own: the framework's vector stores are experimental, and say so)
    ag_ui.py              StoreThreadSnapshotStore for AG-UI front ends (the ag-ui extra; imported on its own)
    ag_ui_resume.py       resumable AG-UI runs: detached, journaled, replayed from any worker (ditto)

Inside ``store.session(...)`` the seams join the run: what they write is committed with the run's messages and
state in its one transaction. They use the Store and the run protocol below them.
"""

from agent_store.agent_framework.checkpoints import StoreCheckpointStorage
from agent_store.agent_framework.history_provider import StoreHistoryProvider
from agent_store.agent_framework.memory import MemoryProvider
from agent_store.agent_framework.run_middleware import ToolResultTooLargeError
from agent_store.agent_framework.search_tool import SearchHistoryProvider
from agent_store.agent_framework.session_store import StoreSessionStore
from agent_store.agent_framework.usage_recorder import UsageRecorder, record_usage

__all__ = [
    "MemoryProvider",
    "SearchHistoryProvider",
    "StoreCheckpointStorage",
    "StoreHistoryProvider",
    "StoreSessionStore",
    "ToolResultTooLargeError",
    "UsageRecorder",
    "record_usage",
]
