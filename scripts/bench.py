"""Run every benchmark side by side in one run; print one table and keep it as a dated run file.

Each benchmark in ``benchmarks/`` (a ``*_bench.py`` module, or the ``e2e`` package) exposes
``run(ctx) -> list[Row]``; figures are medians over repeats and ratios are taken within this run,
because absolute times on shared 2-core machines are noisy. The table goes to
``results/runs/<date>-<time>-<cpu-class>-bench.md`` (a new file each run) and
``results/summary.md`` is regenerated from every run file (benchmarks/runs.py); no hand-written
page is written.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import platform
import shlex
import sys
import tempfile
import traceback
from pathlib import Path

from benchmarks import BenchContext, Row, runs
from export.hardware import CpuInfo
from ops.procs import REPO

MODULES = [
    "export_bench",
    "modelserver_bench",
    "gateway_bench",
    "gateway_load_bench",
    "finetune_bench",
    "early_exit_bench",
    "e2e",
    "heads_bench",
    "observability_bench",
    "architectures_bench",
    "gateway_cost_bench",
    "cache_bench",
    "batch_bench",
    "tfs_passthrough_bench",
    "retrieval_bench",
]


def groups() -> list[str]:
    """Return what ``--only`` may name: ``MODULES`` (what a plain run runs), then every other
    ``benchmarks/*_bench.py`` (run only when named: speed_curve_bench trains two teachers), then
    each ``*_bench`` module's short name (``gateway_cost`` for gateway_cost_bench)."""
    found = sorted(path.stem for path in (REPO / "benchmarks").glob("*_bench.py"))
    names = [*MODULES, *(name for name in found if name not in MODULES)]
    return [*names, *(n.removesuffix("_bench") for n in names if n.endswith("_bench"))]


def module_name(name: str) -> str:
    """Return the module of a group named on --only: ``gateway_cost`` is gateway_cost_bench."""
    return name if name in MODULES or f"{name}_bench" not in MODULES else f"{name}_bench"


def machine(cpu: CpuInfo) -> str:
    """Return a one-line description of this machine: CPU model, class, flags, cores, Python."""
    return f"{cpu.describe()}, Python {platform.python_version()}"


def render(rows: list[Row], cpu: CpuInfo) -> str:
    """Return the rows as a markdown table, each figure beside the CPU class it was measured on."""
    out = ["| figure | value | ratio | aim | CPU | how measured |", "|---|---|---|---|---|---|"]
    out += [
        f"| {r.figure} | {r.value} | {r.ratio} | {r.aim} | {cpu.cpu_class} | {r.how} |"
        for r in rows
    ]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base-path", default="models", type=Path)
    parser.add_argument(
        "--only",
        nargs="*",
        choices=groups(),
        metavar="NAME",
        help=f"benchmark modules to run (default: {', '.join(MODULES)}); also: "
        f"{', '.join(groups()[len(MODULES) :])}",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer calls, for a smoke run")
    parser.add_argument(
        "--runs-dir", type=Path, default=runs.RUNS_DIR, help="where the dated run file goes"
    )
    parser.add_argument(
        "--summary", type=Path, default=runs.SUMMARY, help="regenerated from the run files"
    )
    args = parser.parse_args()

    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        ctx = BenchContext(
            base_path=args.base_path.resolve(),
            work_dir=Path(tmp),
            repeats=args.repeats,
            quick=args.quick,
            runs_dir=args.runs_dir,
        )
        for name in args.only or MODULES:
            print(f"== {name}", flush=True)
            try:
                module = importlib.import_module(f"benchmarks.{module_name(name)}")
                rows += module.run(ctx)
            except Exception as exc:  # one broken benchmark must not hide the others
                traceback.print_exc()
                rows.append(Row(figure=f"{name}", value=f"FAILED: {exc}"))
    when = dt.datetime.now(dt.UTC)
    table = render(rows, ctx.cpu)
    text = f"{table}\n"
    if ctx.notes:
        text += "\n" + "\n".join(f"- {n}" for n in ctx.notes) + "\n"
    print()
    print(f"Measured {when:%Y-%m-%d %H:%M} UTC on {machine(ctx.cpu)}.\n\n{text}")
    if args.quick:  # a smoke run is not a measurement: nothing is kept
        return 0
    command = "python scripts/bench.py " + shlex.join(sys.argv[1:])
    path = runs.write_run(
        args.runs_dir, when, ctx.cpu.cpu_class, "bench", machine(ctx.cpu), command.strip(), text
    )
    runs.write_summary(args.runs_dir, args.summary)
    print(f"run file: {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    print(f"summary: {args.summary}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
