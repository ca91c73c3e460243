"""agent_store: durable, SQL-queryable sessions for Microsoft Agent Framework agents."""

from .errors import (
    AgentStoreError,
    ConfigurationError,
    ConflictError,
    InvalidValueError,
    SchemaError,
    SchemaOutOfDateError,
    SchemaTooNewError,
    SessionNotFoundError,
    StorageUnavailableError,
)
from .models import CommitResult
from .run import Run
from .store import Store

__all__ = [
    "AgentStoreError",
    "CommitResult",
    "ConfigurationError",
    "ConflictError",
    "InvalidValueError",
    "Run",
    "SchemaError",
    "SchemaOutOfDateError",
    "SchemaTooNewError",
    "SessionNotFoundError",
    "StorageUnavailableError",
    "Store",
]
