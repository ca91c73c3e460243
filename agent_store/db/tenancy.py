"""Row-level security's side in the library (issue 41; migration 0024): who a transaction acts for.

When an operator has switched row-level security on (``agent-store rls on``), PostgreSQL admits only the rows of
the user (and app) a transaction names, and a transaction that names no one sees nothing. The library names them
at the start of every transaction it opens, the one-round-trip commit and a run's one-statement load included,
with ``set_config(..., true)``: transaction-local, so it never outlives the transaction on a pooled connection
(PgBouncer in transaction mode hands the server connection to another client after it).

Who: the user of the call in progress, kept in a context variable that the user-scoped entry points set
(:func:`for_user` on functions that take ``user_id``; a run's load and commit). Unset, the setting is empty: no
rows, never every row.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import bindparam, func, literal_column, select, text

from agent_store.errors import ConfigurationError

P = ParamSpec("P")
R = TypeVar("R")
acting: ContextVar[str | None] = ContextVar("agent_store_acting_user", default=None)
NAME = text("SELECT set_config('agent_store.user_id', :user, true), set_config('agent_store.app_id', :app, true)")
# Whether the switch is on (read on agent_sessions, the switch's first table), and whether this role is held to it.
STATUS = text(
    "SELECT c.relrowsecurity AS enabled, c.relforcerowsecurity AS forced, r.rolsuper OR r.rolbypassrls AS bypasses, "
    "current_user AS role FROM pg_class c JOIN pg_roles r ON r.rolname = current_user "
    "WHERE c.oid = to_regclass('agent_sessions')"
)


# Learned on each new connection (conn.info holds the epoch it learned in), and again on every connection after a
# policy refused a write: the switch or a role's BYPASSRLS changed while the store ran.
LEARNED = "agent_store_tenancy_epoch"
REFUSED = "42501"  # insufficient_privilege: "new row violates row-level security policy" among others


def refused_by_policy(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is the server's refusal of a row by a policy."""
    seen: BaseException | None = exc
    while seen is not None:
        if getattr(seen, "sqlstate", None) == REFUSED and "row-level security" in str(seen):
            return True
        seen = seen.__cause__
    return False


LOCAL = "true"  # set_config's is_local: the name ends with its transaction (the mutation run tries "false")
_READS: dict[Any, Any] = {}  # a statement -> the same, naming its user first (built once: statements are reused)


def named_read(statement: Any) -> Any:
    """One read statement that names its user first, in the same round trip and the same (implicit) transaction:

        SELECT rows.* FROM (SELECT set_config(...), set_config(...) OFFSET 0) AS named,
            LATERAL (SELECT * FROM (<statement>) r WHERE named.u IS NOT NULL OFFSET 0) AS rows ORDER BY <its order>

    The lateral reference, and OFFSET 0 on both sides (no pull-up), make the names' row come first: the read is
    the inner side of a nested loop over it, so the policies' settings, evaluated when first needed, are set.
    None for a statement whose ORDER BY is not plain selected columns (it then runs in BEGIN ... COMMIT)."""
    if statement in _READS:
        return _READS[statement]
    found = None
    clauses = getattr(statement, "_order_by_clauses", ())  # a union's are references to its columns' labels
    keys = [getattr(c, "name", None) or getattr(getattr(c, "element", None), "name", None) for c in clauses]
    order = [name for name in keys if isinstance(name, str)]
    if len(order) == len(keys) and all(name in statement.selected_columns for name in order):
        names = select(func.set_config("agent_store.user_id", bindparam("agent_store_user"), literal_column(LOCAL))
                       .label("u"), func.set_config("agent_store.app_id", bindparam("agent_store_app"),
                       literal_column(LOCAL)).label("a")).offset(0).subquery("agent_store_named")  # fmt: skip
        inner = statement.subquery("agent_store_read")
        rows = select(*inner.c).where(names.c.u.is_not(None)).offset(0).lateral("agent_store_rows")
        found = select(*rows.c).select_from(names.join(rows, literal_column("true")))
        found = found.order_by(*(rows.c[name] for name in order))
    if len(_READS) > 64:
        _READS.clear()
    _READS[statement] = found
    return found


@contextmanager
def acting_as(user_id: str | None) -> Iterator[None]:
    """The transactions opened inside act for ``user_id`` (None: for no one)."""
    token = acting.set(user_id)
    try:
        yield
    finally:
        acting.reset(token)


def named() -> dict[str, str]:
    """The parameters of :data:`NAME` for the call in progress (the app is added by the caller)."""
    return {"user": acting.get() or ""}


def read_names(app_id: str) -> dict[str, str]:
    """The parameters :func:`named_read`'s statements take."""
    return {"agent_store_user": named()["user"], "agent_store_app": app_id}


def for_user(function: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
    """Run an async function that takes ``user_id`` as acting for that user."""
    return for_argument("user_id")(function)


def for_argument(name: str) -> Callable[[Callable[P, Coroutine[Any, Any, R]]], Callable[P, Coroutine[Any, Any, R]]]:
    """Run an async function as acting for the user its argument ``name`` holds (AG-UI's ``scope``)."""

    def decorate(function: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        position = list(inspect.signature(function).parameters).index(name)

        @functools.wraps(function)
        async def acting_for(*args: P.args, **kwargs: P.kwargs) -> R:
            user = kwargs[name] if name in kwargs else args[position] if len(args) > position else None
            with acting_as(user if isinstance(user, str) else None):
                return await function(*args, **kwargs)

        return acting_for

    return decorate


def for_its(attribute: str) -> Callable[[Callable[P, Coroutine[Any, Any, R]]], Callable[P, Coroutine[Any, Any, R]]]:
    """Run an async method as acting for the user its object holds in ``attribute`` (a run's ``user_id``, a
    checkpoint storage's, a journal writer's)."""

    def decorate(method: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        @functools.wraps(method)
        async def acting_for(*args: P.args, **kwargs: P.kwargs) -> R:
            user = getattr(args[0], attribute, None)
            with acting_as(user if isinstance(user, str) else None):
                return await method(*args, **kwargs)

        return acting_for

    return decorate


def refusal(role: str, *, operator: bool) -> str:
    if operator:
        return (f"row-level security is on and role {role!r} is held to it: an operator's store (cross-user work) "
                "needs a role with BYPASSRLS (docs/row-security.md)")
    return (f"row-level security is on, but role {role!r} is a superuser or has BYPASSRLS, so the database would "
            "not enforce it: connect as the application's role (docs/row-security.md), or open the store with "
            "operator=True for cross-user work")


async def learn(db: Any, conn: Any) -> None:
    """Whether row-level security is on, so each transaction of ``db`` (a Database) must name its user: read on
    each new connection (a replica's role too), by the driver's path (through PgBouncer, SQLAlchemy's prepare and
    execute may meet two servers). Refuses a role that would bypass it (superuser, BYPASSRLS) unless the store is
    an operator's, and an operator's store whose role would not (its cross-user work would see nothing). Once a
    connection, and again after a policy's refusal moved ``db.tenancy_epoch`` on."""
    if conn.info.get(LEARNED) == db.tenancy_epoch:
        return
    if db.dialect == "postgresql":
        rows = await db.driver.fetch(conn, STATUS, {}, lost=db.lost("learning row-level security"))
        row = rows[0] if rows else None
        if row is not None and row.enabled and row.bypasses != db.settings.operator:
            raise ConfigurationError(refusal(row.role, operator=db.settings.operator))
        db.row_security = row is not None and row.enabled and not row.bypasses
    conn.info[LEARNED] = db.tenancy_epoch
