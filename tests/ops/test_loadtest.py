"""loadtest.py: the pure summaries, and one tiny grid end to end against a spawned stack."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from ops.load import report as loadreport
from ops.load.cells import Cell, CellResult, Sample, make_tensors, summarize
from ops.procs import REPO, child_env
from tests.ops.conftest import MODEL


def test_summarize_counts_errors_and_takes_percentiles_of_successes() -> None:
    cell = Cell("modelserver", "grpc", 2, 1, 8)
    samples = [Sample(0.0, (i + 1) / 1000, True, 100, 50) for i in range(100)]
    samples.append(Sample(0.0, 5.0, False, 100, 0, error="UNAVAILABLE"))
    result = summarize(cell, samples, duration_s=2.0, cpu_s=0.101)
    assert (result.requests, result.errors, result.first_error) == (101, 1, "UNAVAILABLE")
    assert result.throughput_rps == 50.0
    assert result.p50_ms == pytest.approx(50.5) and result.p99_ms < 101
    assert result.client_cpu_ms == pytest.approx(1.0)


def test_ratio_is_grpc_over_rest_throughput_per_cell() -> None:
    def result(protocol: str, rps: float) -> CellResult:
        cell = Cell("gateway", protocol, 4, 8, 8)
        return summarize(cell, [Sample(0, 0.01, True, 1, 1)] * int(rps), 1.0, 0.0)

    found = loadreport.ratios([result("grpc", 30), result("rest", 20)])
    assert found == {("gateway", 4, 8, 8): 1.5}


def test_tensors_are_pretokenized_int32_with_cls_and_sep() -> None:
    tensors = make_tensors(texts=3, words=5)
    assert tensors["input_ids"].shape == (3, 7) and str(tensors["input_ids"].dtype) == "int32"
    assert (tensors["input_ids"][:, 0] == 2).all() and (tensors["input_ids"][:, -1] == 3).all()
    assert tensors["attention_mask"].sum() == 21 and tensors["token_type_ids"].sum() == 0


@pytest.mark.slow
def test_small_grid_writes_csv_markdown_and_plots(tiny_exports: Path, tmp_path: Path) -> None:
    cmd = [
        sys.executable, "scripts/loadtest.py", "--spawn", str(tiny_exports), "--model", MODEL,
        "--verb", "classify", "--concurrency", "1,2", "--texts-per-request", "2", "--words", "4",
        "--duration", "1", "--warmup", "0.5", "--out", str(tmp_path),
    ]  # fmt: skip
    result = subprocess.run(
        cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "[8/8]" in result.stdout  # progress, one line per cell
    rows = list(csv.DictReader((tmp_path / "loadtest.csv").open()))
    assert {(r["target"], r["protocol"]) for r in rows} == {
        (t, p) for t in ("modelserver", "gateway") for p in ("grpc", "rest")
    }
    assert all(r["errors"] == "0" and float(r["throughput_rps"]) > 0 for r in rows)
    # Wire bytes include headers / HTTP/2 framing, so they exceed the bodies.
    assert all(int(r["wire_sent_bytes"]) > int(r["sent_bytes"]) for r in rows)
    assert all(int(r["wire_received_bytes"]) > int(r["received_bytes"]) for r in rows)
    report = (tmp_path / "loadtest.md").read_text()
    assert "gRPC / REST throughput" in report and "grpcio" in report and "cpu" in report
    for name in ("throughput", "latency", "ratio"):
        assert (tmp_path / f"loadtest_{name}.png").stat().st_size > 1000


def test_csv_round_trips_for_replotting(tmp_path: Path) -> None:
    cell = Cell("gateway", "rest", 4, 8, 48)
    result = summarize(cell, [Sample(0.0, 0.02, True, 300, 900, version=2)] * 10, 1.0, 0.01)
    result.wire_sent_bytes, result.wire_received_bytes = 420.0, 1000.0
    loadreport.write_csv(tmp_path / "x.csv", [result])
    (back,) = loadreport.read_csv(tmp_path / "x.csv")
    assert back.cell == cell and back.versions == [2]
    assert (back.throughput_rps, back.wire_sent_bytes, back.p50_ms) == (10.0, 420.0, 20.0)
