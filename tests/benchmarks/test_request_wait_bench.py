"""benchmarks/request_wait_bench.py: one short run gives its seven rows, each a measured figure."""

from __future__ import annotations

import re

from benchmarks.request_wait_bench import measure


def test_a_short_run_measures_every_row() -> None:
    rows = measure(n=20, rounds=1)
    assert [r.figure.split(",")[0].split(" (")[0] for r in rows] == [
        "Flask route",
        "same route after a 15 ms sleep",
        "same route with one sync gRPC call",
        "that gRPC call",
        "the same call in a bare process",
        "Flask route",
        "same route after a 15 ms sleep",
    ]
    for row in rows:
        value = re.fullmatch(r"(\d+\.\d+) ms", row.value)
        assert value is not None, row
        assert float(value.group(1)) >= 0.0
    # the gRPC call was made and timed in the worker's thread (a call that failed answers 500)
    assert float(rows[3].value.split()[0]) > 0.0
