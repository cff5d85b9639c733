"""Benchmarks collected by ``scripts/bench.py``: each module exposes ``run(ctx) -> list[Row]``."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from export.hardware import CpuInfo, cpu_info


@dataclass(frozen=True)
class Row:
    """One line of the benchmark table."""

    figure: str
    value: str
    ratio: str = ""
    aim: str = ""
    how: str = ""


@dataclass
class BenchContext:
    """What every benchmark gets: where the demo models are, scratch space, repeat count."""

    base_path: Path
    work_dir: Path
    repeats: int = 5
    quick: bool = False
    runs_dir: Path | None = None  # where a run's figures (PNG) go beside its run file
    notes: list[str] = field(default_factory=list)
    cpu: CpuInfo = field(default_factory=cpu_info)


def time_calls(fn: Callable[[], object], n: int) -> list[float]:
    """Call ``fn`` ``n`` times and return each call's wall time in seconds."""
    out = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def percentile(samples: list[float], q: float) -> float:
    """Return the ``q``-th percentile (0..100) of ``samples`` (nearest-rank)."""
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(samples: list[float]) -> float:
    """Return the median of ``samples``."""
    return statistics.median(samples)
