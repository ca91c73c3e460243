"""The docs place every measurement by date and commit, never by an ordinal of the work ("Fourteenth session",
"this session", "round three"), and credit flaws to "an outside review", not to a helper or a reviewer no reader
knows. Every bench script the docs, tests and code name exists, and bench/studies/README.md lists every study."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md",
         ROOT / "bench" / "studies" / "README.md"]  # fmt: skip
ORDINAL = (r"third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth|fifteenth"
           r"|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|twenty-[a-z]+|thirtieth")  # fmt: skip
HISTORY = re.compile(
    rf"\b({ORDINAL})\s+(session|round)s?\b"  # "Fourteenth session", "twenty-ninth session's"
    r"|\bthis\s+session's\b|\bthis\s+session\b(?!\s+(id|row|key))"  # the work's session, not a stored one
    r"|\bround\s+(one|two|three|four|five|six|seven|eight|nine|ten|\d+)\b"  # "Edges, round three"
    r"|\b(a|an|the)\s+(adversarial\s+)?(helper|reviewer)\b",  # who found a flaw: "an outside review"
    re.IGNORECASE,
)


def test_the_docs_date_their_measurements_instead_of_counting_the_work() -> None:
    found = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)  # code may say "reviewer"
        for match in HISTORY.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{page.relative_to(ROOT)}:{line}: {match.group(0)!r}")
    assert found == [], "say when (date, commit) or who (an outside review) instead:\n" + "\n".join(found)


def test_every_result_in_bench_readme_names_its_day_and_commit() -> None:
    text = (ROOT / "bench" / "README.md").read_text(encoding="utf-8")
    assert "python bench/bench.py" in text.split("## Results", 1)[0]  # the one entry point, at the top
    results = text.split("## Results, newest first", 1)[1]
    headings = re.findall(r"^## (.*)$", results, flags=re.M)
    assert headings
    undated = [h for h in headings if not re.match(r"\d{4}-\d\d-\d\d, commits? [0-9a-f]{7}\b", h)]
    assert undated == []


def test_every_bench_script_named_exists_and_every_study_is_indexed() -> None:
    sources = [*PAGES, *(ROOT / "tests").glob("*.py"), *(ROOT / "agent_store").rglob("*.py"),
               *(ROOT / "bench").rglob("*.py"), ROOT / ".ci" / "run", ROOT / "pyproject.toml"]  # fmt: skip
    missing = sorted(
        f"{source.relative_to(ROOT)}: {name}"
        for source in sources
        for name in set(re.findall(r"\bbench/[a-z0-9_/]+\.py\b", source.read_text(encoding="utf-8")))
        if not (ROOT / name).is_file()
    )
    assert missing == []
    index = (ROOT / "bench" / "studies" / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^- `(\w+\.py)`: ", index, flags=re.M))
    assert listed == {p.name for p in (ROOT / "bench" / "studies").glob("*.py")}


def test_the_readme_is_a_front_door_not_the_whole_house() -> None:
    """At most 400 lines: the depth lives in docs/ (issue 57 item 10)."""
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 400
