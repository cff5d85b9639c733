"""A skipped test didn't run: the suite may skip only for what can't exist on a machine, and the
README and docs/getting-started.md list each such reason. Every tool a test needs is pinned in
requirements-dev.txt and installed by `make setup`, so a missing one fails instead of skipping."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SKIP = re.compile(r"pytest\.skip\(|skipif\(|importorskip\(|mark\.skip\b")
# Why a test may skip (a phrase in the README's "Skipped tests" paragraph) -> what the skip's
# line or the lines under it must mention.
ALLOWED = {
    "Docker engine": re.compile(r"docker", re.I),
    "the real TF Serving binary": re.compile(r"TFS_BIN"),
    # a user who is not root (tmpfs mounts, chattr), or root in a container without mount rights
    "root": re.compile(r"needs root"),
    # a kernel or container without IPv6 (dual-stack listeners)
    "IPv6": re.compile(r"needs IPv6"),
    # a package of requirements-debian.txt that `make sysdeps` installs only as root
    "Debian package": re.compile(r"requirements-debian|make sysdeps"),
}
PAGES = ("README.md", "docs/getting-started.md")


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


@pytest.mark.parametrize("page", PAGES)
def test_the_documents_list_every_reason_a_test_may_skip(page: str) -> None:
    text = " ".join((REPO / page).read_text().split())
    assert "Skipped tests" in text
    missing = [phrase for phrase in ALLOWED if phrase not in text]
    assert not missing, f"{page}'s skipped-tests part does not name: {missing}"
