"""benchmarks/e2e --quick: the whole headline run on tiny models (real modelserver + gunicorn).

No demo embedder under the base path, so the infinity row must say it was skipped and why.
Speed is never asserted: only that every setting was measured and the figures are coherent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import BenchContext
from benchmarks.e2e.headline import run
from benchmarks.e2e.plan import NOTE, SPEEDS


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_quick_run_measures_every_setting_and_skips_infinity_with_a_reason(
    tmp_path: Path,
) -> None:
    before = NOTE.stat().st_mtime if NOTE.exists() else None
    ctx = BenchContext(base_path=tmp_path / "no-demo-models", work_dir=tmp_path, quick=True)
    rows = {r.figure: r for r in run(ctx)}
    direct = rows["e2e direct gRPC, full model v1 (client tokenizes, bucket signature)"]
    assert "texts/s" in direct.value and direct.ratio == "1.00×"
    for speed in SPEEDS:
        row = rows[f"e2e gateway, early-exit v2 at speed {speed:g}"]
        assert row.ratio.endswith("× direct") and "accuracy" in row.how and "AVX" in row.how
    assert rows["e2e :embed vs infinity"].value.startswith("skipped: no minilm demo model")
    assert any(f.strip().startswith("exit machinery at speed 0") for f in rows)
    assert any(f.strip().startswith("model server per call") for f in rows)
    assert any(f.strip().startswith("the floor under it") for f in rows)
    assert any("every request its own upstream call" in f for f in rows)
    assert any("on gunicorn's gthread worker" in f for f in rows)
    assert any("one intra-op thread per call" in f for f in rows)
    assert any("p50 at 1 client" in f for f in rows)
    # a smoke run leaves the committed breakdown alone
    assert (NOTE.stat().st_mtime if NOTE.exists() else None) == before
