"""loadtest.py's outputs: CSV rows, a markdown report and PNG plots (matplotlib, Agg backend)."""

from __future__ import annotations

import csv
import importlib.metadata
import math
import platform
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

from export.hardware import cpu_info
from ops.load.cells import Cell, CellResult

CSV_FIELDS = [
    "target", "protocol", "concurrency", "texts", "words", "duration_s", "requests", "errors",
    "throughput_rps", "texts_per_s", "p50_ms", "p95_ms", "p99_ms", "sent_bytes",
    "received_bytes", "wire_sent_bytes", "wire_received_bytes", "client_cpu_ms", "versions",
    "first_error",
]  # fmt: skip
PACKAGES = ["grpcio", "protobuf", "tensorflow-serving-api", "requests", "orjson", "numpy"]


def machine() -> dict[str, str]:
    """Return the machine and software the figures were measured with."""
    cpu = cpu_info()
    info = {
        "cpu": cpu.model,
        "cpu class": cpu.cpu_class,
        "cpu flags": " ".join(cpu.notable_flags),
        "cores": str(cpu.cores),
        "os": platform.platform(),
        "python": platform.python_version(),
    }
    for package in PACKAGES:
        try:
            info[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            info[package] = "not installed"
    return info


def row(result: CellResult) -> dict[str, Any]:
    """Return a result as one flat CSV row."""
    out: dict[str, Any] = {**asdict(result.cell)}
    for key in CSV_FIELDS:
        if key not in out:
            out[key] = getattr(result, key)
    out["versions"] = " ".join(map(str, result.versions))
    for key in ("throughput_rps", "texts_per_s", "p50_ms", "p95_ms", "p99_ms", "client_cpu_ms"):
        out[key] = round(out[key], 3)
    for key in ("wire_sent_bytes", "wire_received_bytes"):
        out[key] = "" if math.isnan(out[key]) else round(out[key])
    out["sent_bytes"] = round(out["sent_bytes"])
    out["received_bytes"] = (
        round(out["received_bytes"]) if not math.isnan(result.received_bytes) else ""
    )
    return out


def write_csv(path: Path, results: list[CellResult]) -> None:
    """Write all cells to ``path``."""
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for result in results:
            writer.writerow(row(result))


def read_csv(path: Path) -> list[CellResult]:
    """Return the cells of a CSV written by ``write_csv`` (to re-plot without re-measuring)."""
    results = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            cell = Cell(r["target"], r["protocol"], int(r["concurrency"]), int(r["texts"]),
                        int(r["words"]))  # fmt: skip
            numbers = {
                key: float(r[key]) if r.get(key) not in (None, "") else float("nan")
                for key in CSV_FIELDS[5:-2]
            }
            results.append(
                CellResult(
                    cell=cell,
                    duration_s=numbers["duration_s"],
                    requests=int(numbers["requests"]),
                    errors=int(numbers["errors"]),
                    throughput_rps=numbers["throughput_rps"],
                    texts_per_s=numbers["texts_per_s"],
                    p50_ms=numbers["p50_ms"],
                    p95_ms=numbers["p95_ms"],
                    p99_ms=numbers["p99_ms"],
                    sent_bytes=numbers["sent_bytes"],
                    received_bytes=numbers["received_bytes"],
                    client_cpu_ms=numbers["client_cpu_ms"],
                    versions=[int(v) for v in r["versions"].split()],
                    first_error=r["first_error"],
                    wire_sent_bytes=numbers["wire_sent_bytes"],
                    wire_received_bytes=numbers["wire_received_bytes"],
                )
            )
    return results


def ratios(results: list[CellResult]) -> dict[tuple[str, int, int, int], float]:
    """Return gRPC/REST throughput per (target, concurrency, texts, words) where both ran."""
    by_key: dict[tuple[str, int, int, int], dict[str, float]] = defaultdict(dict)
    for r in results:
        c = r.cell
        by_key[(c.target, c.concurrency, c.texts, c.words)][c.protocol] = r.throughput_rps
    return {
        key: v["grpc"] / v["rest"] for key, v in by_key.items() if v.get("rest") and "grpc" in v
    }


def markdown(results: list[CellResult], meta: dict[str, str], settings: dict[str, Any]) -> str:
    """Return the markdown report: context, the table, the gRPC/REST ratios."""
    lines = ["# Load test", ""]
    lines += [f"- **{k}**: {v}" for k, v in {**settings, **meta}.items()]
    lines += [
        "",
        "Throughput counts successful requests per second; latencies are client-side wall times "
        "of successful requests. Body bytes are the message bodies (gRPC: serialized protobuf; "
        "REST: JSON). Wire bytes are everything on the TCP connection per request (HTTP headers, "
        "HTTP/2 frames and HPACK, setup amortized over 20 calls), counted through a TCP proxy in "
        "a separate pass. Client CPU is this process's CPU time per request (serialization, "
        "HTTP/gRPC stack, threads).",
        "",
        "| target | protocol | conc. | texts | words | req/s | texts/s | p50 ms | p95 ms | p99 ms "
        "| errors | body req/resp B | wire req/resp B | client CPU ms/req |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        c = r.cell
        lines.append(
            f"| {c.target} | {c.protocol} | {c.concurrency} | {c.texts} | {c.words} "
            f"| {r.throughput_rps:.1f} | {r.texts_per_s:.1f} | {r.p50_ms:.1f} | {r.p95_ms:.1f} "
            f"| {r.p99_ms:.1f} | {r.errors} | {r.sent_bytes:.0f} / {r.received_bytes:.0f} "
            f"| {r.wire_sent_bytes:.0f} / {r.wire_received_bytes:.0f} | {r.client_cpu_ms:.2f} |"
        )
    found = ratios(results)
    if found:
        lines += ["", "## gRPC / REST throughput", "", "| target | conc. | texts | words | ratio |"]
        lines += ["|---|---:|---:|---:|---:|"]
        lines += [
            f"| {t} | {c} | {n} | {w} | {v:.2f} |" for (t, c, n, w), v in sorted(found.items())
        ]
    errors = [r for r in results if r.first_error]
    if errors:
        lines += ["", "## First error per failing cell", ""]
        lines += [f"- {r.cell}: `{r.first_error}`" for r in errors]
    return "\n".join(lines) + "\n"


def plot(results: list[CellResult], out_dir: Path, prefix: str) -> list[Path]:
    """Write throughput, latency and ratio plots; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = sorted({(r.cell.texts, r.cell.words) for r in results})
    concurrencies = sorted({r.cell.concurrency for r in results})
    series: dict[tuple[str, str, int, int], list[CellResult]] = defaultdict(list)
    for r in results:
        series[(r.cell.target, r.cell.protocol, r.cell.texts, r.cell.words)].append(r)
    paths = []

    fig, axes = plt.subplots(1, len(shapes), figsize=(4.5 * len(shapes), 3.8), squeeze=False)
    for ax, (texts, words) in zip(axes[0], shapes, strict=True):
        for (target, protocol, t, w), rs in sorted(series.items()):
            if (t, w) == (texts, words):
                rs = sorted(rs, key=lambda r: r.cell.concurrency)
                ax.plot([r.cell.concurrency for r in rs], [r.texts_per_s for r in rs], "o-",
                        label=f"{target} {protocol}")  # fmt: skip
        ax.set(title=f"{texts} texts x {words} words", xlabel="concurrent clients",
               ylabel="texts / s", xscale="log")  # fmt: skip
        _tidy(ax, concurrencies)
    paths.append(_save(fig, out_dir / f"{prefix}_throughput.png"))

    fig, axes = plt.subplots(1, len(shapes), figsize=(4.5 * len(shapes), 3.8), squeeze=False)
    for ax, (texts, words) in zip(axes[0], shapes, strict=True):
        for (target, protocol, t, w), rs in sorted(series.items()):
            if (t, w) == (texts, words):
                rs = sorted(rs, key=lambda r: r.cell.concurrency)
                xs = [r.cell.concurrency for r in rs]
                line = ax.plot(xs, [r.p50_ms for r in rs], "o-", label=f"{target} {protocol} p50")
                ax.fill_between(xs, [r.p50_ms for r in rs], [r.p99_ms for r in rs],
                                color=line[0].get_color(), alpha=0.2)  # fmt: skip
                ax.plot(xs, [r.p95_ms for r in rs], "--", color=line[0].get_color(), lw=1)
        ax.set(title=f"{texts} texts x {words} words (band: p50..p99, dashed p95)",
               xlabel="concurrent clients", ylabel="latency ms",
               xscale="log", yscale="log")  # fmt: skip
        ax.title.set_fontsize(8)
        _tidy(ax, concurrencies)
    paths.append(_save(fig, out_dir / f"{prefix}_latency.png"))

    found = ratios(results)
    if found:
        fig, ax = plt.subplots(figsize=(6, 3.8))
        curves: dict[tuple[str, int, int], list[tuple[int, float]]] = defaultdict(list)
        for (target, conc, texts, words), value in found.items():
            curves[(target, texts, words)].append((conc, value))
        for (target, texts, words), points in sorted(curves.items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], "o-",
                    label=f"{target}, {texts} text(s) x {words} words")  # fmt: skip
        ax.axhline(1.0, color="grey", lw=1)
        ax.set(title="gRPC / REST throughput (>1: gRPC faster)", xlabel="concurrent clients",
               ylabel="ratio", xscale="log")  # fmt: skip
        _tidy(ax, concurrencies)
        paths.append(_save(fig, out_dir / f"{prefix}_ratio.png"))
    return paths


def _tidy(ax: Any, concurrencies: list[int]) -> None:
    """Label the log axes with plain numbers at the measured concurrencies."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax.set_xticks(concurrencies)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
