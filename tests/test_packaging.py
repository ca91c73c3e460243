"""What ships: typed (py.typed, so a user's mypy reads our annotations), licensed, described, with its migrations.

In CI the package under test is the wheel the README's first command installs (`pip install .`), not the
source tree: these tests look at the installed distribution.
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

from helpers import doc_block

import agent_store


def test_the_installed_package_is_typed_and_mypy_reads_the_quick_start(tmp_path: Path) -> None:
    package = Path(agent_store.__file__).parent
    assert (package / "py.typed").is_file()
    (tmp_path / "quick_start.py").write_text(doc_block("README.md", "quick-start", "python"), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "quick_start.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "missing library stubs" not in done.stdout


def test_the_distribution_carries_its_license_and_metadata() -> None:
    meta = metadata.metadata("agent-store")
    assert meta["License-Expression"] == "MIT"
    classifiers = meta.get_all("Classifier") or []
    assert "Typing :: Typed" in classifiers and "Programming Language :: Python :: 3.11" in classifiers
    assert meta["Requires-Python"] == ">=3.11" and meta.get_all("Project-URL")
    files = [str(f) for f in metadata.files("agent-store") or []]
    assert any(f.endswith("licenses/LICENSE") for f in files), files
    license_file = next(f for f in metadata.files("agent-store") or [] if str(f).endswith("LICENSE"))
    assert license_file.read_text().startswith("MIT License")
