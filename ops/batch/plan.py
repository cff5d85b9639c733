"""The job's plan, held without its texts: one pass over the input keeps each good line's place,
size, inputs and model spec (a few numbers a line), the parts are cut from those, and a shard reads
back only the lines of its own parts not yet written, a window of parts at a time.

Before, every shard read the whole input into items (~810 B a row, texts and validated bodies),
so the memory of a pod grew with the corpus whatever the shard count. Now a shard holds the plan's
numbers (~40 B a row) and one window of its own parts' items (``HOLD_ROWS`` inputs at most, or one
part when a part is larger); each window is one more pass over the input, read in order.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ops.batch.inputs import Bad, Item

HOLD_ROWS = 65_536  # inputs of a shard's parts held at once (their texts, checks and answers)


@dataclass
class Plan:
    """The parts of the input (each the line indices it runs, in order) and its bad lines."""

    parts: list[np.ndarray] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)  # each part's inputs
    bad: list[Bad] = field(default_factory=list)  # kept only when asked (the first shard's)


def scan(
    lines: Iterable[Item | Bad],
    good: Callable[[Item], Bad | None],
    part_rows: int,
    by_spec: bool,
    keep_bad: bool,
) -> Plan:
    """Return the plan of ``lines``: an item ``good`` turns into a Bad line (its spec did not
    resolve) is bad; the rest is cut by ``cut``."""
    index, size, count, spec = array("q"), array("q"), array("q"), array("q")
    specs: dict[str, int] = {}
    plan = Plan()
    for line in lines:
        if isinstance(line, Item):
            refused = good(line)
            if refused is None:
                index.append(line.index)
                size.append(line.size)
                count.append(line.count)
                spec.append(specs.setdefault(line.spec, len(specs)))
                continue
            line = refused
        if keep_bad:
            plan.bad.append(line)
    rank = np.zeros(len(specs), np.int64)  # a spec's place among the specs' names, sorted
    for place, name in enumerate(sorted(specs)):
        rank[specs[name]] = place
    by = rank[np.frombuffer(spec, np.int64)] if by_spec and len(spec) else None
    plan.parts, plan.rows = cut(np.frombuffer(index, np.int64), np.frombuffer(size, np.int64),
                                np.frombuffer(count, np.int64), by, part_rows)  # fmt: skip
    return plan


def cut(
    index: np.ndarray, size: np.ndarray, count: np.ndarray, spec: np.ndarray | None, part_rows: int
) -> tuple[list[np.ndarray], list[int]]:
    """Return the lines sorted by size (then place; by ``spec`` first when given, a part never
    holding two), cut into parts of about ``part_rows`` inputs (a line never cut), and each
    part's inputs."""
    keys = (index, size) if spec is None else (index, size, spec)
    order = np.lexsort(keys) if len(index) else np.zeros(0, np.int64)
    parts: list[np.ndarray] = []
    rows: list[int] = []
    start, total = 0, 0
    ordered_counts = count[order].tolist()
    ordered_specs = spec[order].tolist() if spec is not None else None
    for pos, n in enumerate(ordered_counts):
        changed = ordered_specs is not None and ordered_specs[pos] != ordered_specs[pos - 1]
        if pos > start and changed:
            parts.append(index[order[start:pos]])
            rows.append(total)
            start, total = pos, 0
        total += n
        if total >= part_rows:
            parts.append(index[order[start : pos + 1]])
            rows.append(total)
            start, total = pos + 1, 0
    if start < len(ordered_counts):
        parts.append(index[order[start:]])
        rows.append(total)
    return parts, rows


def windows(
    todo: Sequence[int], rows: Sequence[int], hold: int | None = None
) -> Iterator[list[int]]:
    """Yield ``todo`` (part numbers, in order) in windows of at most ``hold`` inputs (default
    ``HOLD_ROWS``; a part larger than that alone)."""
    hold = HOLD_ROWS if hold is None else hold
    window: list[int] = []
    held = 0
    for k in todo:
        if window and held + rows[k] > hold:
            yield window
            window, held = [], 0
        window.append(k)
        held += rows[k]
    if window:
        yield window


def load(
    lines: Iterable[Item | Bad], plan: Plan, window: Sequence[int], good: Callable[[Item], Any]
) -> dict[int, list[Item]]:
    """Return the items of the parts ``window`` (one more pass over ``lines``), each part's in
    its planned order."""
    wanted = {int(i): k for k in window for i in plan.parts[k]}
    found: dict[int, Item] = {}
    for line in lines:
        if isinstance(line, Item) and line.index in wanted and good(line) is None:
            found[line.index] = line
    missing = len(wanted) - len(found)
    if missing:  # the input changed under the job (its digest is taken at the start)
        raise SystemExit(f"the input changed while the job ran: {missing} planned lines are gone")
    return {k: [found[int(i)] for i in plan.parts[k]] for k in window}
