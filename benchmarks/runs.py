"""Benchmark results that stay true: one dated file per run and CPU class, a summary made from them.

``make bench`` (scripts/bench.py) writes ``results/runs/<date>-<time>-<cpu-class>-<bench>.md``
for each run (never an existing file) and regenerates ``results/summary.md`` from every run file:
per CPU class, the newest value of each figure, with the run it came from. Hand-written pages
(results/bench.md, the breakdowns, docs/performance/) are never written by a benchmark. Paths of
the machine a run was taken on are written relative to the checkout (or shortened), so that
committed results hold none.

Every run file compares itself with the previous runs of its CPU class: each figure against
its newest earlier value of that class; one more than 10 % worse gets a mark beside its value
(``▲ 12 % worse than <run>``) and is listed under the table, so the next change that adds cost
is seen the day it lands. Which way is worse: the aim's ``≤``/``≥`` when it has one, else the
value's unit (ms, s, MB, cores: lower is better; per second: higher is better); a figure with
neither is not compared.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUNS_DIR = REPO / "results" / "runs"
SUMMARY = REPO / "results" / "summary.md"
HEADER = "| figure | value | ratio | aim | CPU | how measured |"
# Absolute paths that name a machine: a home, root's home, the work tree, a temp directory.
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|root|home)(?:/[^\s`|)\]'\",;]+)+")


def slug(cpu_class: str) -> str:
    """Return a file-name form of a CPU class: ``AVX-512 + bf16`` -> ``avx512-bf16``."""
    return re.sub(r"[^a-z0-9]+", "-", cpu_class.lower().replace("-", "")).strip("-") or "unknown"


def scrub_paths(text: str, repo: Path = REPO) -> str:
    """Return ``text`` with paths in ``repo`` made relative and other machine paths shortened."""
    text = text.replace(str(repo) + "/", "").replace(str(repo), ".")

    def shorten(match: re.Match[str]) -> str:
        parts = match.group(0).rstrip("/").split("/")
        return "…/" + "/".join(parts[-2:])

    return MACHINE_PATH.sub(shorten, text)


def run_path(
    runs_dir: Path, when: dt.datetime, cpu_class: str, bench: str, suffix: str = ".md"
) -> Path:
    """Return a new file name for a run (``-2``, ``-3`` … when one of that minute exists)."""
    stem = f"{when:%Y-%m-%d-%H%M}-{slug(cpu_class)}-{bench}"
    path = runs_dir / f"{stem}{suffix}"
    n = 2
    while path.exists():
        path = runs_dir / f"{stem}-{n}{suffix}"
        n += 1
    return path


def write_run(
    runs_dir: Path,
    when: dt.datetime,
    cpu_class: str,
    bench: str,
    machine: str,
    command: str,
    body: str,
) -> Path:
    """Write one run file (never over an existing one) and return its path."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    body = mark_worse(body, previous_figures(runs_dir, cpu_class))
    path = run_path(runs_dir, when, cpu_class, bench)
    text = (
        f"# {bench}: {when:%Y-%m-%d %H:%M} UTC, {cpu_class}\n\n"
        f"- measured: {when:%Y-%m-%d %H:%M} UTC\n"
        f"- cpu_class: {cpu_class}\n"
        f"- machine: {machine}\n"
        f"- command: `{command}`\n\n"
        f"{body.strip()}\n"
    )
    with path.open("x", encoding="utf-8") as out:  # "x": a run file is never overwritten
        out.write(scrub_paths(text))
    return path


@dataclass(frozen=True)
class Figure:
    """One row of a run file, with the run it came from."""

    figure: str
    value: str
    ratio: str
    aim: str
    cpu_class: str
    measured: str
    run: str


def read_run(path: Path) -> list[Figure]:
    """Return the table rows of one run file."""
    text = path.read_text(encoding="utf-8")
    measured = re.search(r"^- measured: (.+)$", text, re.M)
    cpu = re.search(r"^- cpu_class: (.+)$", text, re.M)
    if not measured or not cpu or HEADER not in text:
        return []
    table = text.split(HEADER, 1)[1].splitlines()[2:]
    rows = []
    for line in table:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 6:
            continue
        figure, value, ratio, aim = cells[:4]
        when, cpu_class = measured.group(1).strip(), cpu.group(1).strip()
        rows.append(Figure(figure, value, ratio, aim, cpu_class, when, path.name))
    return rows


WORSE_BY = 0.10
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_LOWER_UNITS = re.compile(r"^-?[\d.]+\s*(?:ms|µs|us|ns|s|KB|MB|GB|KiB|MiB|GiB|cores?)\b")


def better(value: str, aim: str) -> int:
    """Return +1 when a higher value is better, -1 when a lower one is, 0 when unknown."""
    aim = aim.strip()
    if aim.startswith(("≤", "<")):
        return -1
    if aim.startswith(("≥", ">")):
        return 1
    if "/s" in value.split(",")[0]:
        return 1
    return -1 if _LOWER_UNITS.match(value.strip()) else 0


def worse_by(value: str, previous: str, direction: int) -> float | None:
    """Return how much worse ``value`` is than ``previous`` (0.12 = 12 %), None if unknown."""
    new, old = _NUMBER.search(value.replace(",", "")), _NUMBER.search(previous.replace(",", ""))
    if direction == 0 or new is None or old is None or float(old.group(0)) <= 0:
        return None
    change = (float(new.group(0)) - float(old.group(0))) / float(old.group(0))
    return change * -direction


def previous_figures(runs_dir: Path, cpu_class: str) -> dict[str, Figure]:
    """Return the newest earlier value of each figure measured on ``cpu_class``."""
    newest: dict[str, Figure] = {}
    for path in sorted(runs_dir.glob("*.md")) if runs_dir.is_dir() else []:
        for row in read_run(path):
            if row.cpu_class == cpu_class and (
                row.figure not in newest or row.measured >= newest[row.figure].measured
            ):
                newest[row.figure] = row
    return newest


def mark_worse(body: str, previous: dict[str, Figure]) -> str:
    """Return ``body`` with each figure more than WORSE_BY worse than ``previous`` marked beside
    its value, and the comparison summed up under the table."""
    if HEADER not in body:
        return body
    head, table = body.split(HEADER, 1)
    lines = table.split("\n")
    compared, worse = 0, []
    for i, line in enumerate(lines[2:], start=2):
        if not line.startswith("|"):
            break
        cells = line.strip().strip("|").split("|")
        figure, value, aim = cells[0].strip(), cells[1].strip(), cells[3].strip()
        before = previous.get(figure)
        by = worse_by(value, before.value, better(value, aim)) if before else None
        if before is None or by is None:
            continue
        compared += 1
        if by > WORSE_BY:
            cells[1] = f" {value} ▲ {by * 100:.0f} % worse than {before.run} "
            lines[i] = "|" + "|".join(cells) + "|"
            worse.append(f"- {figure}: {value}, was {before.value.split(' ▲')[0]} ({before.run})")
    note = (f"Compared with the previous runs of this CPU class: {compared} figure(s); "
            f"{len(worse)} more than {WORSE_BY * 100:.0f} % worse.")  # fmt: skip
    return (
        "\n".join([head + HEADER + lines[0], *lines[1:]]).rstrip()
        + "\n\n"
        + "\n".join([note, *(["", *worse] if worse else [])])
        + "\n"
    )


def render_summary(runs_dir: Path) -> str:
    """Return results/summary.md: per CPU class, each figure's newest value and its run."""
    newest: dict[tuple[str, str], Figure] = {}
    for path in sorted(runs_dir.glob("*.md")):
        for row in read_run(path):
            key = (row.cpu_class, row.figure)
            if key not in newest or row.measured >= newest[key].measured:
                newest[key] = row
    lines = [
        "# Benchmark summary",
        "",
        "Generated from the run files in [runs/](runs/) by `make bench` and `make docs`"
        " (benchmarks/runs.py); do not edit: a new run adds a file there. Per CPU class, the newest"
        " value of each figure and the run it came from; ratios are within that run. How the"
        " figures are measured: docs/performance/index.md.",
    ]
    if not newest:
        lines += ["", "No run files yet: `make bench` writes the first."]
    for cpu_class in sorted({c for c, _ in newest}):
        lines += [
            "",
            f"## {cpu_class}",
            "",
            "| figure | value | ratio | aim | measured | run |",
            "|---|---|---|---|---|---|",
        ]
        for (c, _), row in newest.items():
            if c == cpu_class:
                lines.append(
                    f"| {row.figure} | {row.value} | {row.ratio} | {row.aim} | {row.measured} "
                    f"| [{row.run}](runs/{row.run}) |"
                )
    return "\n".join(lines) + "\n"


def write_summary(runs_dir: Path = RUNS_DIR, summary: Path = SUMMARY) -> Path:
    """Regenerate the summary file from the run files and return its path."""
    summary.write_text(render_summary(runs_dir), encoding="utf-8")
    return summary
