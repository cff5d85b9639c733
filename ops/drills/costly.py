"""Costly requests (issue 41): bodies under 1 MiB that once made one worker do seconds of work or
grow by a gigabyte, each sent alone to a one-worker gateway and measured.

  python -m ops.drills costly --spawn models/ --model minilm

Starts a throw-away model server on a copy of the model's newest version and a gateway with one
worker (gRPC upstream), sends each probe of ``probes()`` alone and prints, per probe, the status,
the time to its answer, the worker's CPU time for it (utime + stime from /proc: what a loaded
machine disturbs least) and its peak resident memory above what it held before (the kernel's
high-water mark, VmHWM, reset before each probe through ``/proc/<pid>/clear_refs``; sampled
VmRSS where that reset is refused). Checks: no 500, the worker's CPU within ``CPU_BOUND_S``, the
answer within ``TIME_BOUND_S`` (no hang) and the worker's peak within ``RSS_PEAK_BOUND_MIB``. The
hostile drill sends the same bodies as its ``costly`` attack.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psutil
import requests

from ops import stack
from ops.drills import common
from ops.procs import REPO

CPU_BOUND_S = 0.5  # the worker's CPU per probe; they took 1.3 to 14 s before issue 41
TIME_BOUND_S = 5.0  # each probe's answer (the request timeout is 10 s)
RSS_PEAK_BOUND_MIB = 64.0  # the worker's peak above its resting RSS; one took 1,210 MB


@dataclass(frozen=True)
class Probe:
    name: str
    path: str  # {model} is the drill's model
    body: dict[str, Any]


def probes(ids: int = 500_000) -> list[Probe]:
    """Return the probes of issue 41's table (each body under 1 MiB with ``ids`` 500,000)."""
    openai = "/v1/embeddings"
    return [
        Probe("ints then a text", openai, {"model": "{model}", "input": [1] * ids + ["x"]}),
        Probe("integral float ids", openai, {"model": "{model}", "input": [5] * ids + [5.0]}),
        Probe("tokenize ints", "/v1/models/{model}:tokenize", {"texts": [1] * ids}),
        Probe(
            "chunk 52 long texts",
            "/v1/models/{model}:embed",
            {"texts": ["!" * 20000] * 52, "long_text": "chunk"},
        ),
    ]


def encoded(probe: Probe, model: str) -> tuple[str, bytes]:
    """Return the probe's path and body for ``model``."""
    body = orjson.dumps(probe.body).replace(b"{model}", model.encode())
    return probe.path.replace("{model}", model), body


def _kib(pid: int, field: str) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(rf"^{field}:\s+(\d+) kB", status, re.MULTILINE)
    return int(found.group(1)) if found else 0


class PeakRss:
    """The peak resident memory of ``pid`` while a block runs, above its RSS before it: the
    kernel's VmHWM after resetting it (clear_refs 5), else VmRSS sampled every millisecond."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakRss:
        self.before_kib = _kib(self.pid, "VmRSS")
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
            self.hwm = True
        except OSError:
            self.hwm = False
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_kib = max(self.peak_kib, _kib(self.pid, "VmRSS"))
            time.sleep(0.001)

    def __exit__(self, *exc: object) -> None:
        if self.hwm:
            self.peak_kib = _kib(self.pid, "VmHWM")
        else:
            self._stop.set()
            assert self._thread is not None
            self._thread.join()

    @property
    def grown_mib(self) -> float:
        return max(0, self.peak_kib - self.before_kib) / 1024


def cpu_s(pid: int) -> float:
    """Return the CPU seconds (user + system, every thread) process ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def send_probes(url: str, worker: int, model: str, ids: int = 500_000) -> list[dict[str, Any]]:
    """Send each probe alone; return its name, status, seconds, the worker's CPU seconds and
    its peak growth."""
    rows = []
    session = requests.Session()
    for probe in probes(ids):
        path, body = encoded(probe, model)
        with PeakRss(worker) as peak:
            started, cpu = time.monotonic(), cpu_s(worker)
            reply = session.post(url + path, data=body, timeout=60,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
            took, cpu = time.monotonic() - started, cpu_s(worker) - cpu
        rows.append({
            "probe": probe.name, "bytes": len(body), "status": reply.status_code,
            "seconds": round(took, 3), "cpu s": round(cpu, 2),
            "peak RSS MiB": round(peak.grown_mib, 1), "answer": reply.text[:160],
        })  # fmt: skip
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Return the rows as a Markdown table."""
    lines = [
        "| probe | body bytes | status | time s | worker CPU s | worker peak RSS +MiB |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['probe']} | {r['bytes']:,} | {r['status']} | {r['seconds']:.3f} | "
                     f"{r['cpu s']:.2f} | {r['peak RSS MiB']:.1f} |")  # fmt: skip
    return "\n".join(lines)


def checks(rows: list[dict[str, Any]]) -> dict[str, bool]:
    """Return the probes' checks: each cheap, small and answered (no 500)."""
    out = {}
    for r in rows:
        out[f"{r['probe']}: {r['status']} in {r['seconds']:.2f} s (bound {TIME_BOUND_S})"] = (
            r["seconds"] <= TIME_BOUND_S and r["status"] != 500
        )
        out[f"{r['probe']}: worker CPU {r['cpu s']:.2f} s (bound {CPU_BOUND_S})"] = (
            r["cpu s"] <= CPU_BOUND_S
        )
        out[f"{r['probe']}: worker peak +{r['peak RSS MiB']:.1f} MiB "
            f"(bound {RSS_PEAK_BOUND_MIB})"] = r["peak RSS MiB"] <= RSS_PEAK_BOUND_MIB  # fmt: skip
    return out


def worker_of(gateway: Any) -> int:
    """Return the pid of a one-worker gateway's worker."""
    children = psutil.Process(gateway.proc.pid).children()
    if len(children) != 1:
        raise RuntimeError(f"expected one gateway worker, found {len(children)}")
    return int(children[0].pid)


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    config_path = common.newest_config(args.spawn, args.model, work)
    base = work / "models"
    server, grpc_port, rest_port = stack.start_modelserver(config_path, work, batching=False)
    try:
        gateway, url = stack.start_gateway(
            "grpc", grpc_port, rest_port, base, config_path, work,
            settings={"GATEWAY_WORKERS": "1", "GATEWAY_ACCESS_LOG": ""},
        )  # fmt: skip
        try:
            warm = requests.post(f"{url}/v1/models/{args.model}:embed",
                                 json={"texts": ["warm up"]}, timeout=60)  # fmt: skip
            print(f"warm-up: {warm.status_code}", flush=True)
            rows = send_probes(url, worker_of(gateway), args.model, args.ids)
        finally:
            gateway.stop()
    finally:
        server.stop()
    print(table(rows))
    for r in rows:
        print(f"  {r['probe']}: {r['answer']}")
    verdicts = checks(rows)
    common.print_checks(verdicts)
    return {"rows": rows, "checks": verdicts}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--spawn", type=Path, default=REPO / "models", help="base path to copy from")
    p.add_argument("--model", default="minilm", help="an embedding model")
    p.add_argument("--ids", type=int, default=500_000, help="items in the long lists")
    p.add_argument("--json", type=Path, help="also write the rows and checks here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return common.run_in_tmp("costly_probes", args.json, lambda work: run(args, work))
