"""cache_bench --quick: its whole code path once on tiny models (real modelserver, a gateway with
the result cache on and the relay floor under gunicorn). Speed is never asserted: only that every
figure was measured and is well-formed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import BenchContext
from benchmarks.cache_bench import run
from scripts.bench import module_name


def test_only_takes_the_group_name() -> None:
    assert module_name("cache") == "cache_bench"


@pytest.mark.slow  # tiny exports, model servers, gateways, the floor and a redis-server
@pytest.mark.timeout(400)
def test_quick_run_gives_every_row_well_formed(tmp_path: Path) -> None:
    ctx = BenchContext(base_path=tmp_path / "no-demo-models", work_dir=tmp_path, quick=True)

    rows = run(ctx)

    # floor, hit, no-store (sequential and 16 clients); texts/s and p99 of off, local, shared
    assert len(rows) == 12
    for row in rows[:6]:
        assert re.fullmatch(r"\d+\.\d\d ms", row.value), row.value
        assert row.ratio == "the floor" or re.fullmatch(r"\d+\.\d\d× the floor", row.ratio)
    for row in rows[6:]:
        assert re.fullmatch(r"\d+( texts/s|\.\d ms)", row.value), row.value
        assert row.ratio == "" or re.fullmatch(r"\d+\.\d\d× off", row.ratio), row.ratio
    assert all("--quick" in row.how for row in rows)
