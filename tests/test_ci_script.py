"""Every program a test starts is installed before the first test runs, by `.ci/run` and by the README's command.

A fresh machine has none of the Debian packages in tests/programs.py; a package installed only before a later pass
fails the first one there (issue 37), and a machine that kept an earlier install would hide it.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from programs import FILES, PROGRAMS, missing

ROOT = Path(__file__).resolve().parent.parent
NEEDED = set(PROGRAMS.values()) | set(FILES.values())


def _installed_before_first_pytest(script: str) -> set[str]:
    """The Debian packages an `apt-get install` names before the script's first `pytest`."""
    before = script[: script.index("pytest")]
    packages: set[str] = set()
    for variable in re.findall(r'^(\w+)="([^"]*)"', before, re.M):
        before = before.replace(f"${variable[0]}", variable[1])
    for line in re.findall(r"apt-get install ([^\n&|>]*)", before.replace("\\\n", " ")):
        packages |= {word for word in line.split() if not word.startswith("-")}
    return packages


def test_ci_installs_every_program_before_the_first_pass() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    assert NEEDED - _installed_before_first_pytest(script) == set()
    # and the check that decides whether to install looks for every program
    guard = script[: script.index("apt-get install")]
    assert all(f"command -v {program}" in guard for program in PROGRAMS)


def test_the_readme_test_command_installs_every_program() -> None:
    command = next(line for line in (ROOT / "README.md").read_text().splitlines() if "apt-get install" in line)
    assert NEEDED - _installed_before_first_pytest(command) == set()


def test_a_missing_program_is_named_with_its_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    problem = missing("pgbouncer", "chromium")
    assert problem is not None
    assert "pgbouncer (Debian package pgbouncer)" in problem and "chromium (Debian package chromium)" in problem


def test_tests_and_benches_name_no_address_off_this_machine() -> None:
    """Only loopback is dialled (an "unreachable host" is tests/helpers.py's black_hole, never a routable one)."""
    address = re.compile(r"(?<![\d.])(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})(?![\d.])")
    found = []
    for path in sorted([*(ROOT / "tests").glob("*.py"), *(ROOT / "bench").rglob("*.py")]):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in address.finditer(line):
                octets = [int(part) for part in match.groups()]
                if octets[0] != 127 and octets != [0, 0, 0, 0] and max(octets) <= 255:
                    found.append(f"{path.name}:{number}: {match.group(0)}")
    assert found == []


def test_ci_checks_every_extra_alone_and_leaves_a_contributors_venv() -> None:
    import tomllib

    script = (ROOT / ".ci" / "run").read_text()
    extras = (ROOT / ".ci" / "extras").read_text()
    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    checked = set(re.findall(r"^\s+\[([\w-]+)\]=", extras, re.M))
    assert declared - {"test"} == checked  # (the test extra is the main pass's own install)
    default = re.search(r"EXTRAS=\((\w[^)]*)\)", extras)
    assert default is not None and set(default.group(1).split()) == checked
    assert script.index("bash .ci/extras") < script.index("pytest")
    assert "rm -rf .venv" not in script and not re.search(r"(^|\s)\.venv/bin/", script)
