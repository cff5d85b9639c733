"""Benchmark results that stay true (benchmarks/runs.py): a run adds a dated file per CPU class and
the summary is made from the run files; nothing hand-written is overwritten; no machine paths."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import runs

TABLE = """| figure | value | ratio | aim | CPU | how measured |
|---|---|---|---|---|---|
| gateway overhead p50 | {p50} | 1.7× the floor | ≤ 1.5× | {cpu} | 300 calls |
| bucketing vs padding | 36 texts/s | 2.07× | ≥ 1.25× | {cpu} | 256 texts |
"""


def write(runs_dir: Path, when: dt.datetime, cpu: str, p50: str, machine: str = "AMD EPYC") -> Path:
    body = TABLE.format(p50=p50, cpu=cpu)
    return runs.write_run(runs_dir, when, cpu, "bench", machine, "python scripts/bench.py", body)


def test_each_run_gets_its_own_dated_file_per_cpu_class(tmp_path: Path) -> None:
    when = dt.datetime(2026, 11, 26, 21, 5, tzinfo=dt.UTC)
    first = write(tmp_path, when, "AVX2", "1.94 ms")
    second = write(tmp_path, when, "AVX2", "1.90 ms")  # the same minute: a second file
    other = write(tmp_path, when, "AVX-512 + bf16", "1.20 ms")
    assert [p.name for p in (first, second, other)] == [
        "2026-11-26-2105-avx2-bench.md",
        "2026-11-26-2105-avx2-bench-2.md",
        "2026-11-26-2105-avx512-bf16-bench.md",
    ]
    assert "1.94 ms" in first.read_text() and "1.90 ms" in second.read_text()


def test_nothing_hand_written_is_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    curated = tmp_path / "2026-11-26-2105-avx2-bench.md"
    curated.write_text("a page someone wrote by hand\n")
    when = dt.datetime(2026, 11, 26, 21, 5, tzinfo=dt.UTC)
    path = write(tmp_path, when, "AVX2", "1.94 ms")
    assert path != curated and curated.read_text() == "a page someone wrote by hand\n"
    # even handed an existing name, the writer refuses rather than overwrite
    monkeypatch.setattr(runs, "run_path", lambda *args, **kwargs: curated)
    with pytest.raises(FileExistsError):
        write(tmp_path, when, "AVX2", "1.50 ms")
    assert curated.read_text() == "a page someone wrote by hand\n"


def test_the_summary_holds_the_newest_value_of_each_figure_per_class(tmp_path: Path) -> None:
    write(tmp_path, dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC), "AVX2", "2.10 ms")
    write(tmp_path, dt.datetime(2026, 11, 25, 9, 0, tzinfo=dt.UTC), "AVX2", "1.94 ms")
    write(tmp_path, dt.datetime(2026, 11, 24, 9, 0, tzinfo=dt.UTC), "AVX-512 + bf16", "1.20 ms")
    (tmp_path / "notes.md").write_text("# not a run file: no header, no table\n")
    summary = runs.write_summary(tmp_path, tmp_path.parent / "summary.md").read_text()
    avx2 = summary.split("## AVX2", 1)[1]
    assert "1.94 ms" in avx2 and "2.10 ms" not in avx2
    assert "[2026-11-25-0900-avx2-bench.md](runs/2026-11-25-0900-avx2-bench.md)" in avx2
    assert "1.20 ms" in summary.split("## AVX-512 + bf16", 1)[1].split("## AVX2", 1)[0]
    # regenerated from the files: the same text every time
    assert runs.render_summary(tmp_path) == summary


def test_run_files_carry_no_machine_paths(tmp_path: Path) -> None:
    repo = runs.REPO
    machine = f"AMD EPYC; model {repo}/run/finetune-demo/tickets-v1; venv /home/ci/.venv/lib"
    path = write(tmp_path, dt.datetime(2026, 11, 26, tzinfo=dt.UTC), "AVX2", "1 ms", machine)
    text = path.read_text()
    assert "run/finetune-demo/tickets-v1" in text
    assert str(repo) not in text and "/home/" not in text and "/root/" not in text


def test_the_committed_summary_is_what_the_run_files_give() -> None:
    assert runs.SUMMARY.read_text(encoding="utf-8") == runs.render_summary(runs.RUNS_DIR)


# scripts/bench.py's main with one more group whose run raises at once (--only takes only real
# groups, so the broken one is added to MODULES before main parses the arguments).
BROKEN_GROUP = """
import importlib.util, sys, types
spec = importlib.util.spec_from_file_location("bench", "scripts/bench.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
broken = types.ModuleType("benchmarks.broken_bench")
def run(ctx):
    raise RuntimeError("broken at once")
broken.run = run
sys.modules["benchmarks.broken_bench"] = broken
bench.MODULES.append("broken_bench")
sys.argv = ["scripts/bench.py", *sys.argv[1:]]
sys.exit(bench.main())
"""


def test_bench_writes_a_run_file_and_the_summary_where_it_is_told(tmp_path: Path) -> None:
    """scripts/bench.py end to end on a module that fails at once: its row still lands in a new
    run file under --runs-dir, the summary is regenerated, and results/ is left alone."""
    before = sorted(runs.RUNS_DIR.iterdir()), runs.SUMMARY.read_text(encoding="utf-8")
    summary = tmp_path / "summary.md"
    done = subprocess.run(
        [sys.executable, "-c", BROKEN_GROUP, "--only", "broken_bench", "--runs-dir",
         str(tmp_path / "runs"), "--summary", str(summary)],
        cwd=runs.REPO, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    (run_file,) = (tmp_path / "runs").glob("*-bench.md")
    assert "FAILED" in run_file.read_text() and "- cpu_class: " in run_file.read_text()
    assert run_file.name in summary.read_text() and "run file:" in done.stdout
    assert (sorted(runs.RUNS_DIR.iterdir()), runs.SUMMARY.read_text(encoding="utf-8")) == before


def _value(path: Path, figure: str) -> str:
    return next(f.value for f in runs.read_run(path) if f.figure == figure)


def test_a_figure_over_10_percent_worse_than_the_last_run_of_its_class_is_marked(
    tmp_path: Path,
) -> None:
    write(tmp_path, dt.datetime(2026, 11, 25, 9, 0, tzinfo=dt.UTC), "AVX2", "2.00 ms")
    write(tmp_path, dt.datetime(2026, 11, 25, 9, 30, tzinfo=dt.UTC), "AVX-512 + bf16", "1.00 ms")
    path = write(tmp_path, dt.datetime(2026, 11, 26, 9, 0, tzinfo=dt.UTC), "AVX2", "2.30 ms")

    text = path.read_text()
    # the AVX2 run, not the newer AVX-512 one (half the time): 15 % worse
    assert _value(path, "gateway overhead p50") == (
        "2.30 ms ▲ 15 % worse than 2026-11-25-0900-avx2-bench.md"
    )
    assert _value(path, "bucketing vs padding") == "36 texts/s"  # the same: not marked
    assert "2 figure(s); 1 more than 10 % worse" in text
    assert "- gateway overhead p50: 2.30 ms, was 2.00 ms (2026-11-25-0900-avx2-bench.md)" in text


@pytest.mark.parametrize(
    ("value", "previous", "aim", "marked"),
    [
        ("2.19 ms", "2.00 ms", "", False),  # 9.5 %: within
        ("2.21 ms", "2.00 ms", "", True),
        ("1.50 ms", "2.00 ms", "", False),  # better
        ("88 texts/s", "100 texts/s", "", True),  # throughput: lower is worse
        ("120 texts/s", "100 texts/s", "", False),
        ("1.10×", "1.30×", "≥ 1.25×", True),  # the aim says which way is better
        ("1.50×", "1.30×", "≤ 1.5×", True),
        ("queue 0.1, upstream 3", "queue 0.1, upstream 2", "", False),  # no unit: not compared
    ],
)
def test_which_way_is_worse_comes_from_the_aim_or_the_unit(
    value: str, previous: str, aim: str, marked: bool
) -> None:
    by = runs.worse_by(value, previous, runs.better(value, aim))

    assert (by is not None and by > runs.WORSE_BY) == marked
