"""Lines the tests add to the run's summary (image sizes, how the golden answers were held),
printed once at the end by tests/conftest.py, whichever xdist worker added them."""

from __future__ import annotations

from collections.abc import Mapping

SECTIONS: dict[str, dict[str, None]] = {}  # section -> its lines, in order, each once


def add(section: str, line: str) -> None:
    """Add ``line`` to ``section`` of the summary (once)."""
    SECTIONS.setdefault(section, {})[line] = None


def merge(sections: Mapping[str, Mapping[str, None]]) -> None:
    """Add a worker's sections."""
    for section, lines in sections.items():
        for line in lines:
            add(section, line)
