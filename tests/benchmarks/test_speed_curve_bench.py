"""speed_curve_bench --quick: two tiny distilled models, calibrated and raw curves, coherent rows.

Speed is never asserted; only that every speed was measured in both modes and that the
calibrated curve's ends are the calibration's (speed 0: every layer; speed 1: the first).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import BenchContext
from benchmarks.early_exit_bench import DATA
from benchmarks.speed_curve_bench import SPEEDS, _Curves, checkpoints, measure_model, rows


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_quick_run_measures_both_models_in_both_modes(tmp_path: Path) -> None:
    from finetune.data import read_examples

    ctx = BenchContext(base_path=tmp_path, work_dir=tmp_path, quick=True)
    test = read_examples(DATA / "test.tsv")
    results = {}
    for name, checkpoint in checkpoints(ctx):
        results[name] = measure_model(_Curves(checkpoint, test.texts, test.labels), 1)
    for r in results.values():
        assert r["thresholds"] is not None and len(r["thresholds"]) == 21
        layers = [r["calibrated"][str(s)]["layers"] for s in SPEEDS]
        assert layers[0] == r["num_layers"] and layers[-1] == 1.0
        assert layers == sorted(layers, reverse=True)
    table = {row.figure.strip(): row for row in rows(results, "AVX2")}
    gaps = [f for f in table if f.startswith("speed curve: largest gap")]
    assert len(gaps) == 2 and all(table[f].value.endswith(" layers") for f in gaps)
