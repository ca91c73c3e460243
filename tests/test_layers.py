"""The package's layers (issue 23): no import circles, and every import points down.

Read from the source (``ast``), so a new circle or an upward import fails here, whatever runs first. Imports for
the type checker (``if TYPE_CHECKING:``) count too: a circle there is a circle in the design.

    agent_store (the public names)
      agent_framework/  cli/  browser/        the framework seams, the command line, the transcript browser
      store.py  retry.py                      the Store: what an application calls
      run/  operations/  search/              the run protocol; lifecycle, retention, transfer; search
      db/                                     engine, connections, tables, statements, rows
      errors.py  models.py  telemetry.py  offline.py   shared leaves (the errors, the API's models, ...)
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from agent_framework import Message

from agent_store import Store

PACKAGE = Path(__file__).resolve().parent.parent / "agent_store"
# A module may import its own layer's modules and any lower layer's, never a higher one's.
LAYER = {
    "errors": 0, "models": 0, "telemetry": 0, "offline": 0, "keys": 0,
    "db": 1,
    "run": 2, "operations": 2, "search": 2, "journal": 2,
    "store": 3, "retry": 3,
    "agent_framework": 4, "cli": 4, "browser": 4,
    "__init__": 5, "__main__": 5, "agentserver": 5,
}  # fmt: skip
SIBLINGS_APART = {"run": {"operations", "search"}, "operations": {"run", "search"}, "search": {"run", "operations"}}
MAX_LINES = 330  # "about 300": the Store facade and the tables are the largest


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The agent_store modules ``path`` imports, those for the type checker too. ``from X import a`` names X
    (its ``__init__`` runs first) and, when ``a`` is a module, X.a as well."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: relative import")
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("agent_store"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if resolve(f"{node.module}.{a.name}"))
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("agent_store"))
    return {name for name in found if resolve(name)}


def resolve(name: str) -> Path | None:
    base = PACKAGE.parent.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) - {module_name(p)} for p in PACKAGE.rglob("*.py")}


def layer_of(module: str) -> tuple[str, int]:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    return top, LAYER[top]


def test_every_module_belongs_to_a_layer() -> None:
    unknown = sorted(m for m in graph() if layer_of(m)[0] not in LAYER)
    assert not unknown


def test_imports_point_down() -> None:
    upward = []
    for module, imports in graph().items():
        (top, rank) = layer_of(module)
        for target in imports:
            (their_top, their_rank) = layer_of(target)
            if their_rank > rank or their_top in SIBLINGS_APART.get(top, set()):
                upward.append(f"{module} -> {target}")
    assert not upward, "imports that climb a layer:\n" + "\n".join(sorted(upward))


def test_there_is_no_import_circle() -> None:
    edges = graph()
    # A package's __init__ re-exports what is in it: a module importing a sibling through its package (``from
    # agent_store.run import x``) runs that __init__ first, an edge like any other (import the module itself).
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target] if target in path else [node, target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_each_package_says_what_it_is_and_files_stay_small() -> None:
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.splitlines()) >= 3, f"{init}: a docstring that draws the package's part"
    long = [f"{p}: {n}" for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, long


async def test_a_run_enters_the_database_object_once_to_load_and_once_to_commit(store: Store) -> None:
    """One run's path reads top-down: Store.session -> run/load.py -> Database (once) -> the agent ->
    run/commit.py -> Database (once), for a new session and an existing one, on both backends."""
    entered: list[str] = []
    for name in ("one_statement", "transaction", "in_sqlite_thread", "hold", "release"):
        real = getattr(store.db, name)

        def counted(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            entered.append(_name)
            return _real(*args, **kwargs)

        setattr(store.db, name, counted)
    for turn in range(2):  # the first creates the session, the second loads it
        entered.clear()
        async with store.session("s", user_id="u") as session:
            session.state["in_memory"]["messages"].append(Message(role="user", contents=[f"turn {turn}"]))
            session.state["n"] = turn
            assert entered == ["one_statement"], turn  # the load: one statement
        commit = "one_statement" if store.engine.dialect.name == "postgresql" else "in_sqlite_thread"
        assert entered == ["one_statement", commit], turn  # the commit: one call
