"""The load cells: every setting measured under the same closed-loop clients, interleaved, with
the CPU of each role (gateway, model server, peer, generator) and the model calls over each
cell's window; medians over repeats."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import requests

from benchmarks import BenchContext, median
from benchmarks.e2e.plan import (
    CLIENTS,
    say,
)
from benchmarks.gateway_load_bench import CpuSnapshot, cpu_delta, cpu_snapshot
from ops.load.cells import Cell, CellResult, Sender, run_cell


@dataclass
class Watched:
    """The processes whose CPU each cell reads, by role."""

    roots: dict[str, list[int]] = field(default_factory=dict)

    def snapshot(self) -> dict[str, CpuSnapshot]:
        return {role: cpu_snapshot(pids) for role, pids in self.roots.items()}


def batch_histogram(rest_port: int) -> tuple[float, float]:
    """Return (rows, model calls) so far from the model server's processed_batch_size."""
    from modelserver.metrics import BATCH_SIZE

    text = requests.get(f"http://127.0.0.1:{rest_port}/monitoring/prometheus/metrics",
                        timeout=10).text  # fmt: skip
    values = {}
    for line in text.splitlines():
        if line.startswith(f"{BATCH_SIZE}_sum") or line.startswith(f"{BATCH_SIZE}_count"):
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0].rsplit("_", 1)[1]] = float(value)
    return values.get("sum", 0.0), values.get("count", 0.0)


@dataclass
class Sample:
    """One measured cell: the generator's figures, CPU seconds by role, model calls."""

    result: CellResult
    cpu_s: dict[str, float]
    rows: float
    calls: float


def run_cells(
    ctx: BenchContext,
    makers: dict[str, Callable[[], Sender]],
    watched: Watched,
    rest_port: int,
    rest_ports: dict[str, int] | None = None,
) -> dict[str, list[Sample]]:
    """Run every setting's cell per repeat, the order rotated each repeat; return the samples.

    ``rest_ports``: the model server whose batch histogram a setting reads, where not ``rest_port``.
    """
    # --quick is a smoke run (nothing kept): each cell long enough for a few hundred requests
    duration_s, warmup_s = (0.75, 0.25) if ctx.quick else (12.0, 2.0)
    repeats = 1 if ctx.quick else max(2, min(ctx.repeats, 3))
    names = list(makers)
    runs: dict[str, list[Sample]] = {name: [] for name in names}
    for repeat in range(repeats):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]
        for name in order:
            marks: dict[str, tuple[dict[str, CpuSnapshot], tuple[float, float]]] = {}

            port = (rest_ports or {}).get(name, rest_port)

            def on_window(mark: str, marks: dict[str, Any] = marks, port: int = port) -> None:
                marks[mark] = (watched.snapshot(), batch_histogram(port))

            cell = Cell(name, "grpc", CLIENTS, 1, 0)
            result = run_cell(cell, makers[name], duration_s, warmup_s, on_window)
            if result.errors:
                raise RuntimeError(f"{name}: {result.errors} failed: {result.first_error}")
            (cpu0, (rows0, calls0)), (cpu1, (rows1, calls1)) = marks["start"], marks["end"]
            cpu = {role: cpu_delta(cpu0[role], cpu1[role]) for role in cpu0}
            cpu["load generator"] = result.client_cpu_ms * result.requests / 1000
            runs[name].append(Sample(result, cpu, rows1 - rows0, calls1 - calls0))
            say(f"  {name}: {result.texts_per_s:.0f} texts/s, p50 {result.p50_ms:.1f} ms")
    return runs


def summarize(samples: list[Sample]) -> dict[str, Any]:
    """Return medians of one setting's cells: texts/s, p50, p99, CPU ms/request, rows/call."""
    requests_ = [s.result.requests for s in samples]
    roles = samples[0].cpu_s
    return {
        "texts_s": median([s.result.texts_per_s for s in samples]),
        "p50": median([s.result.p50_ms for s in samples]),
        "p99": median([s.result.p99_ms for s in samples]),
        "cpu_ms": {
            role: median(
                [s.cpu_s[role] * 1000 / n for s, n in zip(samples, requests_, strict=True)]
            )
            for role in roles
        },
        "cores": {
            role: median([s.cpu_s[role] / s.result.duration_s for s in samples]) for role in roles
        },
        "rows_per_call": median([s.rows / s.calls if s.calls else float("nan") for s in samples]),
        "calls_s": median([s.calls / s.result.duration_s for s in samples]),
        "cells": len(samples),
        "duration_s": samples[0].result.duration_s,
    }
