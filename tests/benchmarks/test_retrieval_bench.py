"""retrieval_bench --quick: its whole code path once on the tiny BGE-M3 export (a model server and
two gateways) and the tiny SPLADE comparison.

Speed is never asserted: only that every row was measured and is well-formed.
"""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks import BenchContext
from benchmarks.retrieval_bench import run


def test_quick_run_gives_every_row_well_formed(tmp_path: Path) -> None:
    ctx = BenchContext(base_path=tmp_path, work_dir=tmp_path, quick=True, repeats=2)
    rows = {r.figure: r for r in run(ctx)}
    for upstream in ("grpc", "rest"):
        for what, unit in (("time", "ms"), ("gateway CPU", "ms"), ("answer bytes", "B")):
            row = rows[
                f"BGE-M3 :embed {what} per text, dense / sparse / all three as float JSON "
                f"/ all three base64 / all three, multi-vectors int8, base64 ({upstream})"
            ]
            assert re.fullmatch(rf"[\d.]+( / [\d.]+){{4}} {unit}", row.value), row.value
            assert "tiny" in row.how
    assert "SPLADE answer per batch: top-k in the graph vs pooled [B,V]" in rows
