"""agent_store: durable, SQL-queryable sessions for Microsoft Agent Framework agents.

The layers, top to bottom; each imports only from those below it (tests/test_layers.py checks it):

    agent_framework/  cli/  browser/     the framework seams, the command line, the transcript browser
    store.py  retry.py                   Store: what an application calls; retry_on_conflict
    run/  operations/  search/           the run protocol (load, diff, commit); lifecycle, retention,
                                         branching, transfer; search
    db/                                  engine and pool, tables, statements, rows
    errors.py  models.py  telemetry.py  offline.py   shared leaves: errors, the API's models, spans, a model

One run: Store.session -> run/load.py (one statement, db/load_statement.py) -> the agent -> run/commit.py (one
call: run/commit_postgresql.py or run/commit_sqlite.py; else the checked transaction, db/statements.py).
"""

from agent_store.errors import (
    AgentStoreError,
    BudgetExceededError,
    CheckpointRefusedError,
    ConfigurationError,
    ConflictError,
    ContentSealedError,
    DatabaseError,
    EmbeddingProfileError,
    InvalidValueError,
    NotEmbeddedError,
    SchemaError,
    SchemaOutOfDateError,
    SchemaTooNewError,
    SessionClosedError,
    SessionExpiredError,
    SessionNotFoundError,
    StorageUnavailableError,
    StreamBusyError,
    StreamLostError,
    StreamNotFoundError,
)
from agent_store.keys import KeyFile, KeyProvider
from agent_store.models import (
    BudgetInfo,
    CommitResult,
    ErasureReport,
    MessageRecord,
    SearchHit,
    SearchPage,
    SessionInfo,
    SessionPage,
    TransferReport,
    UsageLine,
)
from agent_store.retry import retry_on_conflict
from agent_store.run.commit import Run, run_of
from agent_store.store import Store

__all__ = [
    "AgentStoreError",
    "BudgetExceededError",
    "BudgetInfo",
    "CheckpointRefusedError",
    "CommitResult",
    "ConfigurationError",
    "ConflictError",
    "ContentSealedError",
    "DatabaseError",
    "EmbeddingProfileError",
    "ErasureReport",
    "InvalidValueError",
    "KeyFile",
    "KeyProvider",
    "MessageRecord",
    "NotEmbeddedError",
    "Run",
    "SchemaError",
    "SchemaOutOfDateError",
    "SchemaTooNewError",
    "SearchHit",
    "SearchPage",
    "SessionClosedError",
    "SessionExpiredError",
    "SessionInfo",
    "SessionNotFoundError",
    "SessionPage",
    "StorageUnavailableError",
    "Store",
    "StreamBusyError",
    "StreamLostError",
    "StreamNotFoundError",
    "TransferReport",
    "UsageLine",
    "retry_on_conflict",
    "run_of",
]
