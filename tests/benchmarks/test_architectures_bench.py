"""architectures_bench: its pure parts (table, ratios, CPU class, run files) and one smoke run.

Speed is never asserted: only that the table says what was measured, on which CPU class, and that
a run file never replaces another.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks.architectures_bench import (
    ARCHS,
    Result,
    _run_path,
    cost_table,
    document,
    keep,
    measure,
    render,
    rows,
)
from export.architectures import architectures
from export.hardware import cpu_info

AVX2 = cpu_info("model name : AMD EPYC\nflags : avx2 fma f16c\n")
AVX512_BF16 = cpu_info("model name : AMD EPYC\nflags : avx2 avx512f avx512_bf16\n")


def _result(cpu_class: str = "AVX2") -> Result:
    result = Result(cpu_class, f"AMD EPYC ({cpu_class})", 1, 32, (1, 32), 5)
    result.archs = ["bert", "modernbert"]
    result.labels = {"bert": "BERT", "modernbert": "ModernBERT"}
    result.ms = {
        "bert": {"ours": {1: 17.1, 32: 377.0}, "torch": {1: 16.5, 32: 373.0},
                 "onnxruntime": {1: 11.4, 32: 313.0}},
        "modernbert": {"ours": {1: 20.0, 32: 400.0}, "torch": {1: 25.0, 32: 500.0}},
    }  # fmt: skip
    result.cosine = {"bert": {"ours": 0.999999, "onnxruntime": 0.99999}}
    result.skipped = {"onnxruntime/modernbert": "export failed: unsupported op"}
    result.details = {"ours": "export's module", "torch": "AutoModel"}
    return result


def test_the_table_gives_ms_per_engine_and_batch_with_ours_over_each_engine() -> None:
    lines = render(_result()).splitlines()
    assert lines[0] == (
        "| architecture | ours (TF), batch 1 | torch, batch 1 | ONNX Runtime, batch 1 "
        "| ours (TF), batch 32 | torch, batch 32 | ONNX Runtime, batch 32 |"
    )
    assert lines[2] == (
        "| BERT | 17.1 | 16.5 (1.04×) | 11.4 (1.50×) | 377 | 373 (1.01×) | 313 (1.20×) |"
    )
    assert lines[3] == "| ModernBERT | 20.0 | 25.0 (0.80×) | — | 400 | 500 (0.80×) | — |"


def test_each_architecture_is_set_beside_bert_per_engine() -> None:
    lines = cost_table(_result()).splitlines()
    assert lines[2] == "| BERT | 1.00× | 1.00× | 1.00× |"
    assert lines[3] == "| ModernBERT | 1.06× | 1.34× | — |"


@pytest.mark.parametrize(("cpu", "named"), [(AVX2, "AVX2"), (AVX512_BF16, "AVX-512 + bf16")])
def test_the_page_names_the_cpu_class_the_command_and_what_was_skipped(cpu, named) -> None:
    page = document(_result(cpu.cpu_class), "2026-11-26 21:00 UTC", "make bench", "x.png")
    assert f"CPU class **{named}**" in page
    assert "Command: `make bench`" in page and "1 thread(s) per engine" in page
    assert "Models: 6 layers, hidden 384" in page
    assert "onnxruntime/modernbert skipped: export failed: unsupported op" in page
    assert "1 − cosine ≤ 1.0e-05" in page and page.rstrip().endswith("(x.png)")


def test_bench_rows_carry_the_three_engines_and_the_skips() -> None:
    by_figure = {r.figure: r for r in rows(_result())}
    bert = by_figure["BERT, batch 32: ms ours / torch / ONNX Runtime"]
    assert bert.value == "377.0 / 373.0 / 313.0 ms"
    assert bert.ratio == "torch 1.01×, ONNX Runtime 1.20×"
    modern = by_figure["ModernBERT, batch 1: ms ours / torch / ONNX Runtime"]
    assert modern.value == "20.0 / 25.0 / — ms" and modern.ratio == "torch 0.80×"
    assert by_figure["architectures: onnxruntime/modernbert"].value.startswith("skipped: ")


def test_a_run_file_never_replaces_another(tmp_path: Path) -> None:
    import datetime as dt

    when = dt.datetime(2026, 11, 26, 21, 5, tzinfo=dt.UTC)
    first = _run_path(tmp_path, when, "AVX-512 + bf16", ".md")
    assert first.name == "2026-11-26-2105-avx512-bf16-architectures.md"
    first.write_text("hand-kept")
    assert _run_path(tmp_path, when, "AVX-512 + bf16", ".md").name.endswith("-architectures-2.md")
    page = keep(_result(), tmp_path, "make bench")
    assert first.read_text() == "hand-kept" and page != first
    assert page.with_suffix(".png").stat().st_size > 0
    assert json.loads(page.with_suffix(".json").read_text())["cpu_class"] == "AVX2"


def test_every_registered_architecture_is_benched() -> None:
    types = {a.config["model_type"].replace("-", "_") for a in ARCHS}
    registered = {name.replace("-", "_") for name in architectures()}
    assert registered <= types | {"xlm_roberta", "camembert"}, registered - types


@pytest.mark.slow  # two worker processes start (TF, torch): 19 s at load average 6
@pytest.mark.timeout(300)
def test_a_smoke_run_times_ours_and_torch_on_one_tiny_model(tmp_path: Path) -> None:
    bert = [a for a in ARCHS if a.name == "bert"]
    work = tmp_path / "not-yet"  # as scripts/bench.py passes it: made by measure()
    result = measure(bert, quick=True, work=work, engines=("ours", "torch"), say=lambda _: None)
    assert set(result.ms["bert"]) == {"ours", "torch"} and not result.skipped
    for engine in ("ours", "torch"):
        assert set(result.ms["bert"][engine]) == {1, 32}
    assert result.cosine["bert"]["ours"] > 0.9999  # the same model in both engines
    assert re.search(r"\| BERT \(MiniLM-L6's shape\) \| [\d.]+ \| [\d.]+ \(", render(result))
    assert all("--quick" in row.how for row in rows(result))
