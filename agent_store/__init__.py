"""agent_store: durable, SQL-queryable sessions for Microsoft Agent Framework agents."""

from .errors import (
    AgentStoreError,
    CheckpointRefusedError,
    ConfigurationError,
    ConflictError,
    InvalidValueError,
    SchemaError,
    SchemaOutOfDateError,
    SchemaTooNewError,
    SessionClosedError,
    SessionExpiredError,
    SessionNotFoundError,
    StorageUnavailableError,
)
from .models import (
    CommitResult,
    ErasureReport,
    MessageRecord,
    SearchHit,
    SearchPage,
    SessionInfo,
    SessionPage,
    TransferReport,
)
from .retry import retry_on_conflict
from .run import Run, run_of
from .store import Store

__all__ = [
    "AgentStoreError",
    "CheckpointRefusedError",
    "CommitResult",
    "ConfigurationError",
    "ConflictError",
    "ErasureReport",
    "InvalidValueError",
    "MessageRecord",
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
    "TransferReport",
    "retry_on_conflict",
    "run_of",
]
