"""splade_bench --quick: its whole code path once on a tiny model (in process, no server).

Speed is never asserted: only that every row was measured and is well-formed (``compare``
itself checks the top-k and one-pass answers against the pooled vector's top k).
"""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks import BenchContext
from benchmarks.splade_bench import run


def test_quick_run_gives_every_row_well_formed(tmp_path: Path) -> None:
    ctx = BenchContext(base_path=tmp_path, work_dir=tmp_path, quick=True, repeats=2)
    rows = {r.figure: r for r in run(ctx)}
    wire = rows["SPLADE answer per batch: top-k in the graph vs pooled [B,V]"]
    assert re.fullmatch(r"[\d.]+ kB vs [\d.]+ kB gRPC; [\d.]+ kB vs [\d.]+ kB JSON", wire.value)
    assert re.fullmatch(r"\d+× fewer bytes \(gRPC\)", wire.ratio), wire.ratio
    time_row = rows["SPLADE time per batch: top-k vs pooled [B,V] (graph + answer encode)"]
    assert re.fullmatch(r"[\d.]+ ms vs [\d.]+ ms gRPC; JSON encode [\d.]+ ms vs [\d.]+ ms",
                        time_row.value)  # fmt: skip
    chunks = rows["SPLADE vocabulary projection: 512-token chunks vs one pass"]
    assert re.fullmatch(r"[\d.]+ ms vs [\d.]+ ms", chunks.value) and "k 64" in wire.how
