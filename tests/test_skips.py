"""A skipped test didn't run: the suite may skip only for what can't exist on a machine, and the
README lists each such reason. Every tool a test needs is pinned in requirements-dev.txt and
installed by `make setup`, so a missing one fails instead of skipping."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SKIP = re.compile(r"pytest\.skip\(|skipif\(|importorskip\(|mark\.skip\b")
# Why a test may skip (a phrase in the README's "Skipped tests" paragraph) -> what the skip's
# line or the lines under it must mention.
ALLOWED = {
    "Docker engine": re.compile(r"docker", re.I),
    "the real TF Serving binary": re.compile(r"TFS_BIN"),
    # only when not root: as root `make sysdeps` installs it and the test fails without it
    "a Debian package the tests start": re.compile(r"Debian package"),
}


def skips() -> list[tuple[str, int, str]]:
    """Return (file, line, the skip and the three lines after it) for every skip in tests/."""
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if path.name == Path(__file__).name:
            continue
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            if SKIP.search(line):
                context = "\n".join(lines[number - 1 : number + 3])
                found.append((str(path.relative_to(REPO)), number, context))
    return found


def test_every_skip_is_for_something_that_cannot_exist_here() -> None:
    unexplained = [
        f"{file}:{line}" for file, line, context in skips()
        if not any(reason.search(context) for reason in ALLOWED.values())
    ]  # fmt: skip
    assert not unexplained, (
        f"skips without an allowed reason (install the tool or fail): {unexplained}"
    )


def test_the_readme_lists_every_reason_a_test_may_skip() -> None:
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "Skipped tests" in readme
    missing = [phrase for phrase in ALLOWED if phrase not in readme]
    assert not missing, f"README's skipped-tests paragraph does not name: {missing}"
