"""The suite's areas and their time budgets: what each part of the suite may spend.

``make test`` prints, after pytest's slowest tests, each area's wall time (setup, call and teardown
of its tests, session fixtures counted where they start) beside its budget, so a new capability
sees what it spends and an area over its budget is named in the run's output. The budgets are
seconds on the AVX2 class (about 2x the AVX-512 + bf16 class's times for this suite); the table
in tests/README.md is this one (tests/test_layout.py checks they agree). An area is the first
pattern that matches a test's node id.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Area:
    """One part of the suite: a name, the node ids it owns, its budget (AVX2 seconds)."""

    name: str
    pattern: str
    budget_s: int


AREAS = (
    Area("hybrid retrieval", r"retrieval|splade|colbert|bge_m3|hybrid|sparse", 250),
    Area("any model (TF Serving passthrough)", r"passthrough|test_tfs_", 30),
    Area("deploy (images, compose, kube play)", r"^tests/deploy/|^tests/ops/test_docker.py", 460),
    Area("drills and rollouts", r"^tests/ops/", 1270),
    Area("benchmarks (quick runs)", r"^tests/benchmarks/", 320),
    Area("export", r"^tests/export/", 940),
    Area("finetune", r"^tests/finetune/", 300),
    Area("model server and contract", r"^tests/(contract|modelserver)/", 270),
    Area("gateway", r"^tests/backend/", 1330),
    Area("docs, README and layout", r"^tests/", 230),
)
_COMPILED = [(area, re.compile(area.pattern)) for area in AREAS]


def area_of(nodeid: str) -> Area:
    """Return the area a test's node id belongs to (the first whose pattern matches)."""
    for area, pattern in _COMPILED:
        if pattern.search(nodeid):
            return area
    return AREAS[-1]


class AreaClock:
    """Sums each area's test phases and prints them at the end of the run."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.spent[area_of(report.nodeid).name] += report.duration

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.spent:
            return
        terminalreporter.section("time per area (budget: AVX2 seconds, tests/README.md)")
        for area in AREAS:
            spent = self.spent.get(area.name)
            if spent is None:
                continue
            over = "  OVER (on any class)" if spent > area.budget_s else ""
            terminalreporter.write_line(
                f"{area.name:40s} {spent:7.1f} s of {area.budget_s:4d} s{over}"
            )
