"""Where a gunicorn worker's CPU per request goes when every request waits on a model (issue 43).

Three servers of the same shape, each one gunicorn gthread worker (32 threads, the gateway's
default; 8 before 2026-11-27 23:30 UTC) with one Flask route that reads a JSON body and answers a
fixed 1.5 kB document, driven by one sequential keep-alive client and then by 16 concurrent ones;
worker CPU per request is utime+stime of the worker (``/proc/<pid>/stat``):

- ``back-to-back``: the route answers at once;
- ``sleep``: the route sleeps ``WAIT_MS`` first (a model's time, no gRPC);
- ``grpc``: the route makes one sync grpcio unary call (a prepared 1.5 kB request, bytes in and
  out) to a gRPC server in this process that answers after ``WAIT_MS``.

Beside them: the CPU of the same gRPC call measured around the call in the worker's own thread
(``time.thread_time``, sent back in a header), and in this process, calling in a loop. Nothing
of the gateway is imported: this is the stack's floor under a waiting request.

Run: ``python -m benchmarks.request_wait_bench`` (writes a run file in results/runs/).
"""

from __future__ import annotations

import datetime as dt
import http.client
import os
import subprocess
import sys
import time
from concurrent import futures
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import orjson
from flask import Flask, Response, request

from benchmarks import BenchContext, Row, median

WAIT_MS = 15.0
METHOD = "/probe.Probe/Wait"
ANSWER = orjson.dumps({"embeddings": [[0.012345678] * 128]})
BODY = orjson.dumps({"texts": ["my card was charged twice"]})
TICK_HZ = os.sysconf("SC_CLK_TCK")

app = Flask("request_wait")
_stub: Any = None


def _call() -> Any:
    """Return the worker's prepared unary call (its channel opened after the fork)."""
    global _stub
    if _stub is None:
        channel = grpc.insecure_channel(os.environ["PROBE_GRPC_TARGET"])
        _stub = channel.unary_unary(METHOD)  # bytes in, bytes out: no messages built
    return _stub


@app.post("/<mode>")
def answer(mode: str) -> Response:
    """Read the body, then answer at once, after a sleep, or after one gRPC call."""
    orjson.loads(request.get_data())
    spent = 0.0
    if mode == "sleep":
        time.sleep(WAIT_MS / 1000)
    elif mode == "grpc":
        started = time.thread_time()
        _call()(ANSWER, timeout=10)
        spent = time.thread_time() - started
    response = Response(ANSWER, mimetype="application/json")
    response.headers["X-Call-Cpu-Us"] = str(int(spent * 1e6))
    return response


def _serve_grpc() -> tuple[grpc.Server, int]:
    """Start a gRPC server that answers every call after WAIT_MS (in this process)."""

    def wait(req: bytes, _context: Any) -> bytes:
        time.sleep(WAIT_MS / 1000)
        return req

    handler = grpc.method_handlers_generic_handler(
        "probe.Probe", {"Wait": grpc.unary_unary_rpc_method_handler(wait)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK_HZ


def _worker_pid(master: int) -> int:
    return int(Path(f"/proc/{master}/task/{master}/children").read_text().split()[0])


def _serving(port: int, master: int) -> bool:
    """Return True once gunicorn listens on ``port`` and has forked its worker."""
    from ops.procs import port_open

    children = Path(f"/proc/{master}/task/{master}/children")
    return port_open(port) and bool(children.read_text().split())


def _per_request(port: int, pid: int, mode: str, n: int) -> tuple[float, float]:
    """Return (worker CPU ms per request, median thread CPU µs of the gRPC call) over n."""
    conn = http.client.HTTPConnection("127.0.0.1", port)
    inside: list[float] = []

    def send() -> None:
        conn.request("POST", f"/{mode}", BODY, {"Content-Type": "application/json"})
        reply = conn.getresponse()
        data = reply.read()
        if reply.status != 200:
            raise RuntimeError(f"/{mode}: {reply.status} {data[:200]!r}")
        inside.append(float(reply.headers.get("X-Call-Cpu-Us", "0")))

    for _ in range(10):
        send()
    inside.clear()
    before = _cpu_s(pid)
    for _ in range(n):
        send()
    spent = _cpu_s(pid) - before
    conn.close()
    return spent / n * 1000, median(inside)


def _concurrent_per_request(port: int, pid: int, mode: str, each: int) -> float:
    """Return the worker's CPU ms per request while 16 keep-alive clients each send ``each``
    requests at once (gateway_cost_bench's bursts)."""
    from benchmarks.gateway_cost_bench import Target, concurrent

    target = Target(mode, "probe", f"/{mode}", f"/{mode}", BODY, 1)
    return concurrent(f"http://127.0.0.1:{port}", target, pid, each).cpu_ms


def _bare_call_cpu_ms(port: int, n: int) -> float:
    """Return a fresh process's CPU ms per sync unary call, calling in a loop."""
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.request_wait_bench", "--loop", str(port), str(n)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return float(out.stdout.split()[-1])


def _loop(port: int, n: int) -> float:
    """Return this process's CPU ms per sync unary call, calling in a loop."""
    stub = grpc.insecure_channel(f"127.0.0.1:{port}").unary_unary(METHOD)
    for _ in range(10):
        stub(ANSWER, timeout=10)
    started = time.process_time()
    for _ in range(n):
        stub(ANSWER, timeout=10)
    return (time.process_time() - started) / n * 1000


def _times(ms: float, fast: float) -> str:
    """Return ``ms`` as a multiple of ``fast``; none when a short run read no clock tick for it
    (/proc counts CPU in 10 ms ticks: 20 requests of 0.6 ms can read 0)."""
    return f"{ms / fast:.2f}x" if fast > 0 else ""


def measure(n: int = 300, rounds: int = 3) -> list[Row]:
    """Start the gRPC server and one gunicorn per mode; return the rows (medians of rounds)."""
    from ops.procs import ServerProcess, child_env, free_port

    server, grpc_port = _serve_grpc()
    modes = ("back-to-back", "sleep", "grpc")
    procs: dict[str, tuple[int, ServerProcess]] = {}
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    try:
        for mode in modes:
            port = free_port()
            cmd = [sys.executable, "-m", "gunicorn", "-k", "gthread", "--threads", "32", "-w", "1",
                   "--bind", f"127.0.0.1:{port}", "benchmarks.request_wait_bench:app"]  # fmt: skip
            env = child_env(PROBE_GRPC_TARGET=f"127.0.0.1:{grpc_port}")
            procs[mode] = (port, ServerProcess(cmd, logs / f"request-wait-{mode}.log", env))
        for port, proc in procs.values():
            proc.wait_until(partial(_serving, port, proc.pid), 60)
        cpu: dict[str, list[float]] = {m: [] for m in modes}
        crowd: dict[str, list[float]] = {m: [] for m in modes[:2]}
        inside: list[float] = []
        bare: list[float] = []
        for _ in range(rounds):
            for mode in modes:
                port, proc = procs[mode]
                ms, call_us = _per_request(port, _worker_pid(proc.pid), mode, n)
                cpu[mode].append(ms)
                if mode == "grpc":
                    inside.append(call_us)
                else:
                    crowd[mode].append(
                        _concurrent_per_request(port, _worker_pid(proc.pid), mode, max(2, n // 15))
                    )
            bare.append(_bare_call_cpu_ms(grpc_port, n))
    finally:
        for _, proc in procs.values():
            proc.stop()
        server.stop(0)
    fast = median(cpu["back-to-back"])
    how = f"one sequential keep-alive client, {n} requests x {rounds} rounds, medians"
    crowd_how = (f"16 keep-alive clients at once, bursts of {max(2, n // 15)} requests each until "
                 f"50 ms of worker CPU, x {rounds} rounds")  # fmt: skip
    return [
        Row("Flask route, back-to-back: worker CPU/request", f"{fast:.3f} ms", "1.00x", "", how),
        Row(
            f"same route after a {WAIT_MS:g} ms sleep",
            f"{median(cpu['sleep']):.3f} ms",
            _times(median(cpu["sleep"]), fast),
            "",
            how,
        ),
        Row(
            f"same route with one sync gRPC call ({WAIT_MS:g} ms server)",
            f"{median(cpu['grpc']):.3f} ms",
            _times(median(cpu["grpc"]), fast),
            "",
            how,
        ),
        Row(
            "that gRPC call, its thread's CPU inside the worker",
            f"{median(inside) / 1000:.3f} ms",
            "",
            "",
            "time.thread_time around the call, median of every request",
        ),
        Row(
            "the same call in a bare process (loop)",
            f"{median(bare):.3f} ms",
            "",
            "",
            "process CPU (all threads) per call, another process than the server's",
        ),
        Row(
            "Flask route, back-to-back, 16 clients: worker CPU/request",
            f"{median(crowd['back-to-back']):.3f} ms",
            _times(median(crowd["back-to-back"]), fast),
            "",
            crowd_how,
        ),
        Row(
            f"same route after a {WAIT_MS:g} ms sleep, 16 clients",
            f"{median(crowd['sleep']):.3f} ms",
            _times(median(crowd["sleep"]), fast),
            "",
            crowd_how,
        ),
    ]


def run(ctx: BenchContext) -> list[Row]:
    """The rows for scripts/bench.py (``--only request_wait_bench``)."""
    return measure(n=60 if ctx.quick else 300, rounds=1 if ctx.quick else 3)


def main() -> int:
    from benchmarks.runs import HEADER, RUNS_DIR, write_run
    from export.hardware import cpu_info

    cpu = cpu_info()
    rows = measure()
    table = "\n".join(
        f"| {r.figure} | {r.value} | {r.ratio} | {r.aim} | {cpu.cpu_class} | {r.how} |"
        for r in rows
    )
    body = f"{HEADER}\n|---|---|---|---|---|---|\n{table}\n"
    path = write_run(RUNS_DIR, dt.datetime.now(dt.UTC), cpu.cpu_class, "request-wait",
                     cpu.describe(), "python -m benchmarks.request_wait_bench", body)  # fmt: skip
    print(body)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--loop"]:  # the bare-process figure, in a process of its own
        print(f"{_loop(int(sys.argv[2]), int(sys.argv[3])):.6f}")
        raise SystemExit(0)
    raise SystemExit(main())
