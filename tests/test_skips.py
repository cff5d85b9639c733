"""A skipped test didn't run: the suite may skip (or expect to fail) only for what can't exist on a
machine, and the README and docs/getting-started.md list each such reason. Every tool a test needs
is pinned in requirements-dev.txt and installed by `make setup`, so a missing one fails instead of
skipping.

Each skip and xfail in tests/ (the skip, importorskip and xfail calls, the three markers of those
names, unittest's skipTest) is found in the module's syntax tree and
its reason itself is read (a string, or an f-string's literal text): the reason, not the condition
or a comment beside it, must name what the machine lacks.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# the calls (or bare marks) that skip or expect a failure
SKIPPING = {"skip", "skipif", "importorskip", "xfail", "skipTest"}
# Why a test may skip (a phrase in the README's "Skipped tests" paragraph) -> what the skip's
# reason must say.
ALLOWED = {
    "Docker engine": re.compile(r"docker", re.I),
    "the real TF Serving binary": re.compile(r"TFS_BIN|TF Serving binary"),
    # a user who is not root (tmpfs mounts, chattr), or root in a container without mount rights
    "root": re.compile(r"needs root"),
    # a kernel or container without IPv6 (dual-stack listeners)
    "IPv6": re.compile(r"needs IPv6"),
    # a package of requirements-debian.txt that `make sysdeps` installs only as root
    "Debian package": re.compile(r"requirements-debian|make sysdeps"),
}
PAGES = ("README.md", "docs/getting-started.md")
# sources for the reader's own tests (a JSON file: as .py lines they would read as skips)
CASES = json.loads((Path(__file__).with_name("test_skips_cases.json")).read_text(encoding="utf-8"))


def _text(node: ast.expr | None, source: str) -> str:
    """Return a reason's text: a string's value, an f-string's literal parts, else its source."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            _text(part, source) for part in node.values if isinstance(part, ast.Constant)
        )
    return "" if node is None else ast.get_source_segment(source, node) or ""


def _reason(node: ast.Call | ast.Attribute, source: str) -> str:
    """Return the reason a skip or xfail gives ("" for none)."""
    if isinstance(node, ast.Attribute):  # a bare marker, not called: it gives no reason
        return ""
    for keyword in node.keywords:
        if keyword.arg in ("reason", "msg"):
            return _text(keyword.value, source)
    name = node.func.attr if isinstance(node.func, ast.Attribute) else ""
    if name in ("skip", "xfail", "skipTest") and node.args:  # the reason as first argument
        first = node.args[0]
        if isinstance(first, ast.Constant | ast.JoinedStr) and _text(first, source):
            return _text(first, source)
    return ""


def found_skips(source: str) -> list[tuple[int, str]]:
    """Return (line, reason) for every skip and xfail in a module's source."""
    tree = ast.parse(source)
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if name in SKIPPING:
                found.append((node.lineno, _reason(node, source)))
        elif (isinstance(node, ast.Attribute) and node.attr in SKIPPING and id(node) not in called
              and isinstance(node.value, ast.Attribute) and node.value.attr == "mark"):  # fmt: skip
            found.append((node.lineno, ""))
    return sorted(found)


def unexplained(source: str) -> list[tuple[int, str]]:
    """Return the skips and xfails of ``source`` whose reason names nothing allowed."""
    return [(line, reason) for line, reason in found_skips(source)
            if not any(allowed.search(reason) for allowed in ALLOWED.values())]  # fmt: skip


def test_every_skip_is_for_something_that_cannot_exist_here() -> None:
    bad = [
        f"{path.relative_to(REPO)}:{line} (reason: {reason!r})"
        for path in sorted((REPO / "tests").rglob("*.py"))
        if path.name != Path(__file__).name
        for line, reason in unexplained(path.read_text(encoding="utf-8"))
    ]
    assert not bad, f"skips or xfails without an allowed reason (install the tool or fail): {bad}"


@pytest.mark.parametrize("source", CASES["found"])
def test_a_skip_or_xfail_whose_reason_names_nothing_allowed_is_found(source: str) -> None:
    assert len(unexplained(source)) == 1


@pytest.mark.parametrize("source", CASES["passes"])
def test_a_skip_whose_reason_names_what_the_machine_lacks_passes(source: str) -> None:
    assert found_skips(source) and not unexplained(source)


@pytest.mark.parametrize("page", PAGES)
def test_the_documents_list_every_reason_a_test_may_skip(page: str) -> None:
    text = " ".join((REPO / page).read_text().split())
    assert "Skipped tests" in text
    missing = [phrase for phrase in ALLOWED if phrase not in text]
    assert not missing, f"{page}'s skipped-tests part does not name: {missing}"
