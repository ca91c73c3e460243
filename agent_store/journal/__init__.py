"""A run's journal (migration 0019): every event a streamed run sends, numbered, read back from any worker.

facade.py (``Journal``: start, read, follow, cancel, recover), writer.py (batches), detached.py (a run in the
background), statements.py, listen.py.
"""

from agent_store.journal.detached import as_json, journal_point, start_detached, uncancellable
from agent_store.journal.facade import Journal, JournalEvent
from agent_store.journal.writer import StreamWriter

__all__ = ["Journal", "JournalEvent", "StreamWriter", "as_json", "journal_point", "start_detached", "uncancellable"]
