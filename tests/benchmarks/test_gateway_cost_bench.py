"""gateway_cost_bench --quick: its whole code path once on tiny models (real modelserver, the
gateway and the relay floor under gunicorn). Speed is never asserted: only that every figure was
measured and is well-formed, and that the floor stays the bare relay it says it is."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from backend.timing import STAGES
from benchmarks import BenchContext
from benchmarks.gateway_cost_bench import run, stage_ms
from ops.procs import REPO
from scripts.bench import module_name

PROJECT = {"backend", "benchmarks", "export", "finetune", "modelformat", "modelserver", "ops",
           "scripts", "tests"}  # fmt: skip


def test_the_floor_app_imports_nothing_of_the_project() -> None:
    tree = ast.parse((REPO / "benchmarks" / "relay_floor_app.py").read_text(encoding="utf-8"))
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }  # fmt: skip

    assert "grpc" in imported and "flask" in imported and "json" in imported
    assert not {name.split(".")[0] for name in imported} & PROJECT, imported


def test_server_timing_gives_each_stage_in_ms() -> None:
    header = "validate;dur=0.012, tokenize;dur=0.231, call;dur=3.500, total;dur=4.010"

    assert stage_ms(header) == {"validate": 0.012, "tokenize": 0.231, "call": 3.5,
                                "total": 4.01}  # fmt: skip


def test_only_takes_the_group_name() -> None:
    assert module_name("gateway_cost") == "gateway_cost_bench"
    assert module_name("e2e") == "e2e"


@pytest.mark.slow  # two tiny exports, a model server, a gateway and the floor: ~90 s at load
@pytest.mark.timeout(400)
def test_quick_run_gives_every_row_well_formed(tmp_path: Path) -> None:
    ctx = BenchContext(base_path=tmp_path / "no-demo-models", work_dir=tmp_path, quick=True)

    rows = {r.figure: r for r in run(ctx)}

    cpu = [r for f, r in rows.items() if f.endswith("worker CPU per request")]
    assert len(cpu) == 16  # floor 1 and 32 texts, 4 gateway routes and 2 through REST; seq and c16
    for row in cpu:
        assert re.fullmatch(r"\d+\.\d\d ms", row.value), row.value
        assert row.ratio == "the floor" or re.fullmatch(r"\d+\.\d\d× the floor", row.ratio)
        assert "--quick" in row.how
    splits = [r for f, r in rows.items() if "stage split" in f]
    assert len(splits) == 4
    for row in splits:
        assert all(stage in row.value for stage in STAGES), row.value
    png = rows["gateway_cost plot"].value
    assert (tmp_path / png).stat().st_size > 10_000
    assert re.fullmatch(r"\d+ cores", rows["gateway_cost gateway cores per GPU, 1 text/request"]
                        .value)  # fmt: skip
    pieces = [r for f, r in rows.items() if f.startswith("gateway_cost piece: ")]
    assert len(pieces) == 8  # validation, protobuf, tensors, JSON, metric writes
    for row in pieces:
        assert re.fullmatch(r"\d+\.\d µs", row.value), row.value
        assert re.fullmatch(r"\d+\.\d % of a one-text :embed", row.ratio), row.ratio
