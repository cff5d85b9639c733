"""The fixed costs under the load figures: the exported graph in process (batch 1/8/32), the
model server's and each gateway's cost per one-text call on tiny-floor, the gateway's bare
HTTP floor (benchmarks/floor_app.py) and one client's latency."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import orjson

from benchmarks import median
from benchmarks.e2e.cells import Watched
from benchmarks.e2e.plan import (
    ALONE_SPEED,
    BATCHES,
    EXITS,
    FLOOR,
    FULL,
    GTHREAD_WORKER,
    LINGERING_WORKER,
    MODEL,
    ROUNDS,
    TIMEOUT_S,
)
from benchmarks.e2e.senders import (
    Direct,
    HttpConnection,
)
from benchmarks.gateway_load_bench import cpu_delta
from ops.procs import ServerProcess, child_env, free_port, python_cmd


def graph_costs(base: Path, texts: Sequence[str], quick: bool) -> dict[str, Any]:
    """Return ms per call of the exported graphs at batch 1/8/32 (seq 32 bucket) and a fit.

    The non-exit export, the early-exit one at speed 0 (every row runs every layer: only the
    machinery's cost is added) and at 0.8, each through its ``seq_32`` signature as TF Serving
    calls it; calls interleaved, medians. ``fixed`` and ``per_row`` are a least-squares line
    through the three batch sizes.
    """
    import tensorflow as tf

    from backend.versions import load_assets

    assets = load_assets(base, MODEL, FULL)
    seq = 32
    rows = [e.ids[:seq] for e in assets.tokenizer.encode(list(texts))]
    from backend.bucketing import pad_batch

    loaded = {v: tf.saved_model.load(str(base / MODEL / str(v))) for v in (FULL, EXITS)}
    fns = {v: m.signatures[f"seq_{seq}"] for v, m in loaded.items()}
    graphs: dict[str, Callable[[int], Callable[[], object]]] = {}

    def caller(version: int, speed: float | None) -> Callable[[int], Callable[[], object]]:
        def make(batch: int) -> Callable[[], object]:
            feeds = {k: tf.constant(v) for k, v in pad_batch(rows[:batch], seq, 0).items()}
            if speed is not None:
                feeds["speed"] = tf.fill([batch], tf.constant(speed, tf.float32))
            return lambda: fns[version](**feeds)

        return make

    graphs = {"full": caller(FULL, None), "exits, speed 0": caller(EXITS, 0.0),
              "exits, speed 0.8": caller(EXITS, 0.8)}  # fmt: skip
    calls = {(name, b): make(b) for name, make in graphs.items() for b in BATCHES}
    for call in calls.values():  # trace and warm
        call()
        call()
    reps = {1: 6, 8: 3, 32: 2} if quick else {1: 40, 8: 15, 32: 6}
    times: dict[tuple[str, int], list[float]] = {key: [] for key in calls}
    for b in BATCHES:
        for _ in range(reps[b]):
            for name in graphs:
                started = time.perf_counter()
                calls[(name, b)]()
                times[(name, b)].append(time.perf_counter() - started)
    out: dict[str, Any] = {"seq_len": seq}
    for name in graphs:
        ms = [median(times[(name, b)]) * 1000 for b in BATCHES]
        per_row, fixed = np.polyfit(BATCHES, ms, 1)
        out[name] = {"ms": dict(zip(BATCHES, ms, strict=True)), "fixed": float(fixed),
                     "per_row": float(per_row)}  # fmt: skip
    return out


def _sequential(
    n: int, call: Callable[[], object], watched: Watched
) -> tuple[list[float], dict[str, float]]:
    """Return wall times of ``n`` sequential calls and CPU ms per call by role."""
    for _ in range(max(5, n // 10)):
        call()
    before = watched.snapshot()
    times = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    after = watched.snapshot()
    return times, {r: cpu_delta(before[r], after[r]) / n * 1000 for r in before}


def floor_costs(
    gateways: dict[str, tuple[str, Watched]],
    grpc_port: int,
    base: Path,
    watched: Watched,
    quick: bool,
    work: Path,
) -> dict[str, float]:
    """Return the model server's and each gateway's cost per one-text call on tiny-floor
    (``gateways``: name -> URL and its processes and the model server's; the first is the
    product's)."""
    from backend.clients.grpc_client import GrpcClient

    direct = Direct(base, FLOOR, 1)
    inputs, signature = direct.request("my card was charged twice")
    client = GrpcClient(f"127.0.0.1:{grpc_port}")
    body = orjson.dumps({"texts": ["my card was charged twice"]})
    # CPU times tick every 10 ms: each measured stretch needs a few hundred milliseconds of it
    n = 60 if quick else 300

    def poster(url: str) -> Callable[[], None]:
        http = HttpConnection(url)

        def gw() -> None:
            status, data = http.post(f"/v1/models/{FLOOR}:classify", body)
            if status != 200:
                raise RuntimeError(f"tiny-floor through the gateway: {status} {data[:200]!r}")

        return gw

    try:
        d_times, d_cpu = _sequential(
            n, lambda: client.predict(FLOOR, inputs, version=1, timeout_s=TIMEOUT_S,
                                      signature_name=signature), watched)  # fmt: skip
        # each gateway in turn, several rounds (the machine's drift lands on all of them)
        g_times: dict[str, list[float]] = {name: [] for name in gateways}
        g_cpu: dict[str, list[float]] = {name: [] for name in gateways}
        s_cpu: dict[str, list[float]] = {name: [] for name in gateways}
        posts = {name: poster(url) for name, (url, _) in gateways.items()}
        for _ in range(ROUNDS):
            for name, (_, own) in gateways.items():
                times, cpu = _sequential(n, posts[name], own)
                g_times[name] += times
                g_cpu[name].append(cpu["gateway"])
                s_cpu[name].append(cpu["model server"])
        first = next(iter(gateways))
        grpc_cpu = _bare_grpc_cpu(grpc_port, inputs, signature, n)
    finally:
        client.close()
    return {
        "calls": n,
        "direct_p50_ms": median(d_times) * 1000,
        "server_cpu_ms": d_cpu["model server"],
        "gateway_p50_ms": median(g_times[first]) * 1000,
        **{f"{name}_cpu_ms": median(cpus) for name, cpus in g_cpu.items()},
        **{f"{name}_p50_ms": median(times) * 1000 for name, times in g_times.items()},
        "server_cpu_via_gateway_ms": median(s_cpu[first]),
        "grpc_client_cpu_ms": grpc_cpu,
        **{f"{app}_cpu_ms": cpu for app, cpu in _bare_server_cpu(work, body, n).items()},
    }


def one_client(
    urls: dict[str, str], texts: Sequence[str], n: int, per_request: int = 1
) -> dict[str, float]:
    """Return p50 ms of one client's sequential requests of ``per_request`` tickets at speed 0.8
    through each gateway (interleaved, each gateway the same tickets in the same order): what
    grouping (or a server setting) costs a lone client, if anything."""
    from benchmarks.stack import interleaved

    def body(i: int) -> bytes:
        chunk = list(texts[i : i + per_request])
        return orjson.dumps({"texts": chunk, "version": EXITS, "speed": ALONE_SPEED})

    bodies = [body(i) for i in range(0, len(texts) - per_request + 1, per_request)]

    def caller(url: str) -> Callable[[], object]:
        conn, cycle = HttpConnection(url), itertools.cycle(bodies)
        return lambda: conn.post(f"/v1/models/{MODEL}:classify", next(cycle))

    times = interleaved([caller(url) for url in urls.values()], n)
    return {name: median(t) * 1000 for name, t in zip(urls, times, strict=True)}


def _bare_grpc_cpu(grpc_port: int, inputs: dict[str, np.ndarray], signature: str,
                   n: int) -> float:  # fmt: skip
    """Return this process's CPU ms per bare Predict call (request bytes built once, reply
    bytes not parsed): what one gRPC call costs its caller, whatever the caller."""
    from backend.clients.grpc_client import build_predict_request

    raw = build_predict_request(FLOOR, inputs, version=1,
                                signature_name=signature).SerializeToString()  # fmt: skip
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    predict = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
    try:
        for _ in range(max(5, n // 10)):
            predict(raw, timeout=TIMEOUT_S)
        started = time.process_time()
        for _ in range(n):
            predict(raw, timeout=TIMEOUT_S)
        return (time.process_time() - started) / n * 1000
    finally:
        channel.close()


def _bare_server_cpu(work: Path, body: bytes, n: int) -> dict[str, float]:
    """Return gunicorn's CPU ms per sequential request (master + worker) for benchmarks/floor_app's
    bare WSGI app and Flask app, under the gateway's worker class and gunicorn's gthread, 8
    threads ("wsgi", "flask"; "wsgi_gthread", "flask_gthread").

    The four boot at once and are measured one at a time (CPU is read per process: the idle
    others don't count, and their boots overlap instead of adding up).
    """
    procs: dict[str, tuple[ServerProcess, str]] = {}
    out: dict[str, float] = {}
    try:
        for name, target, worker in (
            ("wsgi", "benchmarks.floor_app:raw", LINGERING_WORKER),
            ("flask", "benchmarks.floor_app:app", LINGERING_WORKER),
            ("wsgi_gthread", "benchmarks.floor_app:raw", GTHREAD_WORKER),
            ("flask_gthread", "benchmarks.floor_app:app", GTHREAD_WORKER),
        ):
            port = free_port()
            cmd = python_cmd("-m", "gunicorn", "--worker-class", worker, "--workers", "1",
                             "--threads", "8", "--keep-alive", "5", "--bind", f"127.0.0.1:{port}",
                             target)  # fmt: skip
            procs[name] = (ServerProcess(cmd, work / f"floor-{name}.log", env=child_env()),
                           f"http://127.0.0.1:{port}")  # fmt: skip
        for name, (proc, url) in procs.items():
            proc.wait_until(partial(_answers, url, body), 60)
            post = partial(HttpConnection(url).post, f"/v1/models/{FLOOR}:classify", body)
            _, cpu = _sequential(n, post, Watched({name: [proc.pid]}))
            out[name] = cpu[name]
    finally:
        for proc, _ in procs.values():
            proc.stop()
    return out


def _answers(url: str, body: bytes) -> bool:
    """Return True once ``url`` answers a classify POST."""
    try:
        return HttpConnection(url).post(f"/v1/models/{FLOOR}:classify", body)[0] == 200
    except OSError:
        return False
