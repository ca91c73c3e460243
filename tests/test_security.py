"""Security review, enforced: no SQL assembled from strings in the library or its migrations, no pickle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted([*ROOT.joinpath("agent_store").rglob("*.py"), *ROOT.joinpath("migrations").rglob("*.py")])
SQL_SINKS = {"text", "execute", "exec_driver_sql", "executemany", "fetch", "fetchrow", "fetchval"}


def built_sql(tree: ast.AST) -> list[int]:
    """Lines where a SQL-taking call gets an f-string, a concatenation, %-formatting or str.format()."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        first = node.args[0]
        assembled = isinstance(first, ast.JoinedStr | ast.BinOp) or (
            isinstance(first, ast.Call) and isinstance(first.func, ast.Attribute) and first.func.attr == "format"
        )
        if name in SQL_SINKS and assembled:
            found.append(node.lineno)
    return found


def test_the_review_covers_the_code() -> None:
    assert len(SOURCES) > 15
    sample = ast.parse('conn.execute(text(f"SELECT {x}"))\ndb.exec_driver_sql("DROP " + name)')
    assert sorted(built_sql(sample)) == [1, 2]  # the check itself can fail


def test_no_sql_is_built_from_strings() -> None:
    offenders = {
        str(path.relative_to(ROOT)): lines for path in SOURCES if (lines := built_sql(ast.parse(path.read_text())))
    }
    assert offenders == {}


def test_no_pickle_or_marshal() -> None:
    for path in SOURCES:
        tree = ast.parse(path.read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not imported & {"pickle", "cPickle", "marshal", "shelve", "dill"}, path


def test_importing_the_framework_seams_passes_warnings_as_errors() -> None:
    import subprocess
    import sys

    code = "import agent_store, agent_store.agent_framework, agent_store.offline"
    done = subprocess.run([sys.executable, "-W", "error::Warning", "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
