"""What a request through the gateway costs its worker, beside the relay floor (issue 43).

One run, one model server, three servers in front of it, each one gunicorn worker:
- the floor (benchmarks/relay_floor_app.py, importing nothing of the project): gunicorn
  gthread + a bare Flask route that ``json.loads`` the body, makes one prepared ``Predict``
  call with grpcio's sync stub (the very request the gateway sends for those texts) and answers
  the floats with ``json.dumps``; it answers one text and 32 texts;
- the gateway as shipped (docker/gunicorn.conf.py, product defaults: JSON access log, metrics,
  timing headers; grpc upstream; 32 threads, its default; the floor has 8): one-text ``:embed``,
  ``:classify`` (the classifier of the same encoder) and ``/v1/embeddings``, 32-text ``:embed``;
- the same gateway with a REST upstream (``GATEWAY_UPSTREAM=rest``): one-text and 32-text
  ``:embed``.

Figure: worker CPU per request = utime+stime of the worker process (all its threads; psutil
reads /proc/<pid>/stat) over a stretch of requests after a warm-up, divided by the requests;
sequential (one keep-alive client) and under 16 concurrent clients (16 threads, one keep-alive
connection each). Each round measures every server × route × mode once, in turn, and the
figures are medians over rounds, so the machine's drift lands on all of them; "× the floor"
divides by the floor measured in the same run for the same number of texts. The per-stage
split is the gateway's own stage clock (backend/timing.py) as its ``Server-Timing`` header
reports it (wall ms, sequential requests). A PNG shows both.

Uses the demo models (``minilm``, ``minilm-intent``) under ctx.base_path, else tiny random
models (--quick smoke runs).
"""

from __future__ import annotations

import datetime as dt
import http.client
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psutil

from benchmarks import BenchContext, Row, median, request_pieces, runs
from benchmarks.gateway_bench import _models
from benchmarks.stack import Stack, gateway_batch
from ops.load.cells import make_texts
from ops.procs import REPO, ServerProcess, child_env, free_port, python_cmd

WORDS = 8
BATCH = 32
CLIENTS = 16
FLOOR_THREADS = 8  # the floor's threads per worker: gthread as issue 43 measured it
GATEWAY_THREADS = 32  # docker/gunicorn.conf.py's default (benchmarks/stack.py pins 4)
TIMEOUT_S = 60.0
# A stretch goes on until the worker has spent at least this much CPU: /proc counts it in 10 ms
# ticks, so a short stretch of cheap requests (a --quick run's tiny models) can read 0.
MIN_CPU_S = 0.05
MAX_STRETCHES = 50
# The throughput figure of issue 43: one H200 runs the demo's MiniLM at about 143,000 texts/s
# (fp16, batches of 1,024 × 32 tokens).
GPU_TEXTS_PER_S = 143_000
_SERVER_TIMING = re.compile(r"([\w-]+);dur=([\d.]+)")


@dataclass(frozen=True)
class Target:
    """One thing measured: a server's route with a body of some texts."""

    key: str
    server: str  # floor | gateway
    label: str
    path: str
    body: bytes
    texts: int
    headers: tuple[tuple[str, str], ...] = ()  # request headers beside Content-Type


@dataclass
class Reading:
    """A stretch's worker CPU ms per request and its answers' Server-Timing stages (ms)."""

    cpu_ms: float
    stages: dict[str, float]


class Client:
    """One keep-alive HTTP/1.1 connection that returns the answer's Server-Timing header."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.host, self.port = host, int(port)
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT_S)

    def post(self, path: str, body: bytes, extra: tuple[tuple[str, str], ...] = ()) -> str:
        headers = {"Content-Type": "application/json", **dict(extra)}
        try:
            self.conn.request("POST", path, body=body, headers=headers)
            response = self.conn.getresponse()
        except (http.client.RemoteDisconnected, ConnectionError):  # an idle keep-alive closed
            self.conn.close()
            self.conn.request("POST", path, body=body, headers=headers)
            response = self.conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"POST {path}: {response.status} {data[:200]!r}")
        return response.getheader("Server-Timing") or ""

    def close(self) -> None:
        self.conn.close()


def worker_cpu_s(pid: int) -> float:
    """Return utime+stime in seconds of process ``pid`` (all its threads)."""
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def stage_ms(header: str) -> dict[str, float]:
    """Return the ms of each stage of a ``Server-Timing`` header (``name;dur=ms, ...``)."""
    return {name: float(ms) for name, ms in _SERVER_TIMING.findall(header)}


def sequential(url: str, target: Target, pid: int, n: int) -> Reading:
    """Return the worker's CPU ms per request over stretches of ``n`` requests from one
    keep-alive client, as many as it takes to spend MIN_CPU_S of the worker's CPU."""
    client = Client(url)
    try:
        for _ in range(max(3, n // 10)):
            client.post(target.path, target.body, target.headers)
        before, headers = worker_cpu_s(pid), []
        for _ in range(MAX_STRETCHES):
            headers += [client.post(target.path, target.body, target.headers) for _ in range(n)]
            spent = worker_cpu_s(pid) - before
            if spent >= MIN_CPU_S:
                break
    finally:
        client.close()
    _spent_some(spent, target)
    parsed = [stage_ms(h) for h in headers if h]
    names = list(parsed[0]) if parsed else []
    stages = {name: median([p.get(name, 0.0) for p in parsed]) for name in names}
    return Reading(spent / len(headers) * 1000, stages)


def concurrent(url: str, target: Target, pid: int, each: int, clients: int = CLIENTS) -> Reading:
    """Return the worker's CPU ms per request over bursts of ``clients`` × ``each`` requests
    from ``clients`` threads at once, each on its own keep-alive connection, as many bursts as
    it takes to spend MIN_CPU_S of the worker's CPU."""
    spent, sent = 0.0, 0
    for _ in range(MAX_STRETCHES):
        spent += _burst(url, target, pid, each, clients)
        sent += clients * each
        if spent >= MIN_CPU_S:
            break
    _spent_some(spent, target)
    return Reading(spent / sent * 1000, {})


def _spent_some(spent: float, target: Target) -> None:
    if spent <= 0:  # the worker isn't the process answering: no figure to divide by
        raise RuntimeError(f"{target.label}: the worker read no CPU over {MAX_STRETCHES} stretches")


def _burst(url: str, target: Target, pid: int, each: int, clients: int) -> float:
    """Return the worker CPU seconds of one burst of ``clients`` × ``each`` requests."""
    ready, go = threading.Barrier(clients + 1), threading.Barrier(clients + 1)
    errors: list[BaseException] = []

    def run() -> None:
        client = Client(url)
        try:
            client.post(
                target.path, target.body, target.headers
            )  # connect and warm this connection
            ready.wait()
            go.wait()
            for _ in range(each):
                client.post(target.path, target.body, target.headers)
        except BaseException as exc:  # any failure: reported by the caller below
            errors.append(exc)
            ready.abort()
            go.abort()
        finally:
            client.close()

    threads = [threading.Thread(target=run, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    ready.wait()
    before = worker_cpu_s(pid)
    go.wait()
    for thread in threads:
        thread.join(TIMEOUT_S * each)
    after = worker_cpu_s(pid)
    if errors:
        raise RuntimeError(f"{target.label} under {clients} clients: {errors[0]!r}")
    return after - before


def compile_floor_protos(out: Path) -> Path:
    """Compile the TF Serving messages (the repo's .proto copies, imports made top-level) into
    ``out`` for the floor, which imports nothing of the project; return ``out``. protoc runs in
    a child: in a process that has imported TensorFlow (tiny exports) it crashes."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("serving.proto", "tensor.proto"):
        text = (REPO / "modelformat" / "protos" / name).read_text(encoding="utf-8")
        text = text.replace('import "modelformat/protos/', 'import "')
        (out / name).write_text(text, encoding="utf-8")
    code = (
        "import sys; from importlib import resources; from grpc_tools import protoc; "
        "sys.exit(protoc.main(['protoc', f'-I{sys.argv[1]}', "
        "f'-I{resources.files(\"grpc_tools\") / \"_proto\"}', f'--python_out={sys.argv[1]}', "
        "'serving.proto', 'tensor.proto']))"
    )
    subprocess.run([sys.executable, "-c", code, str(out)], cwd=out, check=True, timeout=120)
    return out


def prepare_requests(base: Path, model: str, version: int, bodies: dict[int, list[str]],
                     out: Path) -> Path:  # fmt: skip
    """Write ``<n>.pb``: the PredictRequest the gateway sends for each list of texts."""
    from backend.clients.grpc_client import build_predict_request

    out.mkdir(parents=True, exist_ok=True)
    for n, texts in bodies.items():
        batch = gateway_batch(base, model, version, texts)
        request = build_predict_request(model, batch.inputs, version=version,
                                        signature_name=batch.signature)  # fmt: skip
        (out / f"{n}.pb").write_bytes(request.SerializeToString())
    return out


class Floor:
    """benchmarks/relay_floor_app.py under gunicorn gthread, one worker."""

    def __init__(self, ctx: BenchContext, grpc_port: int, protos: Path, requests: Path,
                 output: str) -> None:  # fmt: skip
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        cmd = python_cmd("-m", "gunicorn", "--worker-class", "gthread", "--workers", "1",
                         "--threads", str(FLOOR_THREADS), "--keep-alive", "5", "--bind",
                         f"127.0.0.1:{port}", "benchmarks.relay_floor_app:app")  # fmt: skip
        env = child_env(FLOOR_TARGET=f"127.0.0.1:{grpc_port}", FLOOR_PROTOS=str(protos),
                        FLOOR_REQUESTS=str(requests), FLOOR_OUTPUT=output)  # fmt: skip
        self.process = ServerProcess(cmd, ctx.work_dir / "relay-floor.log", env=env)
        self.process.wait_until(self._answers, 60)

    def _answers(self) -> bool:
        try:
            Client(self.url).post("/v1/models/any:embed", b'{"texts": ["x"]}')
        except (OSError, RuntimeError):
            return False
        return True

    @property
    def worker_pid(self) -> int:
        (worker,) = psutil.Process(self.process.pid).children()
        return int(worker.pid)

    def stop(self) -> None:
        self.process.stop()


def targets(embed: str, classify: str, one: list[str], batch: list[str]) -> list[Target]:
    """Return what is measured: the floor at 1 and 32 texts, the gateway's routes."""

    def body(value: dict[str, Any]) -> bytes:
        return orjson.dumps(value)

    embed_path = f"/v1/models/{embed}:embed"
    return [
        Target("floor-1", "floor", "floor, 1 text", embed_path, body({"texts": one}), 1),
        Target("embed-1", "gateway", ":embed, 1 text", embed_path, body({"texts": one}), 1),
        Target("classify-1", "gateway", ":classify, 1 text", f"/v1/models/{classify}:classify",
               body({"texts": one}), 1),
        Target("openai-1", "gateway", "/v1/embeddings, 1 text", "/v1/embeddings",
               body({"input": one[0], "model": embed}), 1),
        Target("floor-32", "floor", f"floor, {BATCH} texts", embed_path, body({"texts": batch}),
               BATCH),
        Target("embed-32", "gateway", f":embed, {BATCH} texts", embed_path,
               body({"texts": batch}), BATCH),
        # the same gateway with a REST upstream (GATEWAY_UPSTREAM=rest)
        Target("rest-1", "gateway-rest", ":embed, 1 text, REST upstream", embed_path,
               body({"texts": one}), 1),
        Target("rest-32", "gateway-rest", f":embed, {BATCH} texts, REST upstream", embed_path,
               body({"texts": batch}), BATCH),
    ]  # fmt: skip


def measure(ctx: BenchContext) -> dict[str, Any]:
    """Start the stack and the floor, run the interleaved rounds; return the readings."""
    base, classify_model, embed_model = _models(ctx)
    one, batch = make_texts(1, WORDS, seed=1), make_texts(BATCH, WORDS, seed=2)
    # the product's log and threads (benchmarks/stack.py turns the log off and pins 4 threads)
    defaults = {"GATEWAY_ACCESS_LOG": "-", "GATEWAY_THREADS": str(GATEWAY_THREADS)}
    stack = Stack(ctx, base, [classify_model, embed_model], upstreams=("grpc", "rest"),
                  settings=defaults)  # fmt: skip
    floor: Floor | None = None
    try:
        version = stack.version(embed_model)
        output = _embed_output(base, embed_model, version)
        protos = compile_floor_protos(ctx.work_dir / "floor-protos")
        prepared = prepare_requests(base, embed_model, version, {1: one, BATCH: batch},
                                    ctx.work_dir / "floor-requests")  # fmt: skip
        floor = Floor(ctx, stack.grpc_port, protos, prepared, output)
        urls = {"floor": floor.url, "gateway": stack.gateways["grpc"],
                "gateway-rest": stack.gateways["rest"]}  # fmt: skip
        pids = {"floor": floor.worker_pid, "gateway": stack.worker_pids("grpc")[0],
                "gateway-rest": stack.worker_pids("rest")[0]}  # fmt: skip
        measured = targets(embed_model, classify_model, one, batch)
        readings, rounds = measure_rounds(ctx, "gateway_cost", measured, urls, pids)
        return {"targets": measured, "readings": readings, "rounds": rounds,
                "models": (embed_model, classify_model, version), "base": base}  # fmt: skip
    finally:
        if floor is not None:
            floor.stop()
        stack.stop()


def measure_rounds(
    ctx: BenchContext,
    name: str,
    measured: list[Target],
    urls: dict[str, str],
    pids: dict[str, int],
) -> tuple[dict[tuple[str, str], list[Reading]], int]:
    """Return each target's sequential and concurrent readings over the run's rounds (every
    target once per round, in turn, so the machine's drift lands on all of them) and the rounds."""
    rounds = 1 if ctx.quick else max(3, ctx.repeats)
    readings: dict[tuple[str, str], list[Reading]] = {}
    for r in range(rounds):
        print(f"{name}: round {r + 1}/{rounds}", flush=True)
        for target in measured:
            n, each = _sizes(ctx, target)
            url, pid = urls[target.server], pids[target.server]
            readings.setdefault((target.key, "sequential"), []).append(
                sequential(url, target, pid, n)
            )
            readings.setdefault((target.key, "concurrent"), []).append(
                concurrent(url, target, pid, each))  # fmt: skip
    return readings, rounds


def _sizes(ctx: BenchContext, target: Target) -> tuple[int, int]:
    """Return (sequential requests, requests per concurrent client) of a stretch: a few hundred
    ms of worker CPU at least (CPU times tick every 10 ms)."""
    if ctx.quick:
        return (6, 1) if target.texts > 1 else (20, 2)
    return (80, 5) if target.texts > 1 else (300, 20)


def _embed_output(base: Path, model: str, version: int) -> str:
    """Return the embedding output's name in the model's model.json (``embedding``)."""
    meta = orjson.loads((base / model / str(version) / "assets" / "model.json").read_bytes())
    outputs = [o for o in meta.get("outputs", []) if "embed" in o]
    return str(outputs[0]) if outputs else "embedding"


MODES = {"sequential": "sequential, 1 client", "concurrent": f"{CLIENTS} clients"}


def figures(result: dict[str, Any]) -> dict[tuple[str, str], float]:
    """Return the median worker CPU ms per request of each (target, mode)."""
    return {key: median([r.cpu_ms for r in rs]) for key, rs in result["readings"].items()}


def split(result: dict[str, Any], key: str) -> dict[str, float]:
    """Return a target's median Server-Timing stage ms over the sequential rounds."""
    rounds = [r.stages for r in result["readings"][(key, "sequential")]]
    names = list(rounds[0]) if rounds else []
    return {name: median([s.get(name, 0.0) for s in rounds]) for name in names}


def rows(result: dict[str, Any], png: Path | None, quick: bool) -> list[Row]:
    """Return the table's rows: each target and mode in ms and × the floor, the stage split,
    and what it means in cores."""
    cpu = figures(result)
    tag = " (--quick: not a measurement)" if quick else ""
    how = (f"worker utime+stime (/proc) per request, median of {result['rounds']} interleaved "
           f"round(s); same model server; setup: the notes under the table{tag}")  # fmt: skip
    out = []
    for target in result["targets"]:
        floor_key = f"floor-{target.texts}"
        for mode, words in MODES.items():
            ms = cpu[(target.key, mode)]
            floor_ms = cpu[(floor_key, mode)]
            is_floor = target.server == "floor"
            out.append(Row(
                f"gateway_cost {target.label}, {words}: worker CPU per request",
                f"{ms:.2f} ms",
                "the floor" if is_floor else f"{ms / floor_ms:.2f}× the floor",
                "" if is_floor else "≤ 0.6× the floor",
                how,
            ))  # fmt: skip
    for target in result["targets"]:
        if target.server == "gateway":
            stages = split(result, target.key)
            text = ", ".join(f"{name} {ms:.3f}" for name, ms in stages.items())
            out.append(Row(f"gateway_cost {target.label}: stage split (Server-Timing, wall ms)",
                           text or "no Server-Timing header", "", "",
                           "the gateway's stage clock (backend/timing.py), median per stage over "
                           f"the sequential requests' Server-Timing headers{tag}"))  # fmt: skip
    one, many = cpu[("embed-1", "sequential")], cpu[(f"embed-{BATCH}", "sequential")]
    per_gpu_one = GPU_TEXTS_PER_S * one / 1000
    per_gpu_many = GPU_TEXTS_PER_S / BATCH * many / 1000
    gpu_how = (f"{GPU_TEXTS_PER_S:,} texts/s (one H200, demo MiniLM, fp16, batches of 1,024 × "
               f"32 tokens) × :embed worker CPU per text, sequential figure{tag}")  # fmt: skip
    out += [
        Row("gateway_cost cores per 1,000 one-text :embed requests/s", f"{one:.2f} cores",
            how="= worker CPU ms per one-text request (sequential)" + tag),
        Row("gateway_cost gateway cores per GPU, 1 text/request", f"{per_gpu_one:.0f} cores",
            how=gpu_how),
        Row(f"gateway_cost gateway cores per GPU, {BATCH} texts/request",
            f"{per_gpu_many:.1f} cores", how=gpu_how),
    ]  # fmt: skip
    if png is not None:
        out.append(Row("gateway_cost plot", png.name, how="worker CPU per request and the "
                       "gateway's stage split"))  # fmt: skip
    return out


def plot(result: dict[str, Any], path: Path, title: str) -> None:
    """Draw worker CPU per request (gateway beside its floor) and the stage split as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cpu = figures(result)
    gateway = [t for t in result["targets"] if t.server != "floor"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.2))
    labels, floor_ms, gw_ms = [], [], []
    for target in gateway:
        for mode, words in MODES.items():
            labels.append(f"{target.label}\n{words}")
            gw_ms.append(cpu[(target.key, mode)])
            floor_ms.append(cpu[(f"floor-{target.texts}", mode)])
    xs = range(len(labels))
    left.bar([x - 0.2 for x in xs], floor_ms, 0.4, label="floor (bare Flask relay)", color="grey")
    left.bar([x + 0.2 for x in xs], gw_ms, 0.4, label="gateway", color="tab:blue")
    for x, g, f in zip(xs, gw_ms, floor_ms, strict=True):
        left.annotate(f"{g / f:.2f}×", (x + 0.2, g), ha="center", va="bottom", fontsize=7)
    left.set_xticks(list(xs), labels, fontsize=6, rotation=30, ha="right")
    left.set_ylabel("worker CPU ms per request")
    left.set_title("worker CPU per request (× the floor)", fontsize=9)
    left.set_ylim(0, max(floor_ms + gw_ms) * 1.15)
    left.legend(fontsize=7, loc="upper left")
    _plot_stages(right, result, gateway)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# Stages that wait on the model server: wall time, not the worker's work; left out of the bars.
WAITING = ("queue", "call")


def _plot_stages(ax: Any, result: dict[str, Any], gateway: list[Target]) -> None:
    """Stack each route's worker-side stages (wall ms) and the rest of its request."""
    splits = [split(result, t.key) for t in gateway]
    names = list(dict.fromkeys(n for s in splits for n in s if n not in (*WAITING, "total")))
    labels = [t.label for t in gateway]
    bottoms = [0.0] * len(gateway)
    for name in [*names, "rest"]:
        if name == "rest":  # the request outside every named stage: HTTP, Flask, JSON, metrics
            values = [
                max(0.0, s.get("total", 0.0) - sum(v for n, v in s.items() if n != "total"))
                for s in splits
            ]
        else:
            values = [s.get(name, 0.0) for s in splits]
        ax.bar(labels, values, bottom=bottoms, label=name)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    for x, s in enumerate(splits):
        waiting = "\n".join(f"{n} {s[n]:.1f} ms" for n in WAITING if s.get(n))
        ax.annotate(waiting, (x, bottoms[x]), ha="center", va="bottom", fontsize=6)
    ax.set_ylabel("wall ms in the gateway (Server-Timing, sequential, median)")
    ax.set_title("the gateway's stages, waiting on the model server left out", fontsize=9)
    ax.set_xticks(range(len(labels)), labels, fontsize=6, rotation=30, ha="right")
    ax.set_ylim(0, max(bottoms, default=1.0) * 1.3)
    ax.legend(fontsize=6, loc="upper left", ncol=2)


def run(ctx: BenchContext) -> list[Row]:
    """Run the gateway_cost group and return its rows (and draw its PNG)."""
    result = measure(ctx)
    when = dt.datetime.now(dt.UTC)
    out_dir = ctx.work_dir if ctx.quick or ctx.runs_dir is None else ctx.runs_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    png = runs.run_path(out_dir, when, ctx.cpu.cpu_class, "gateway-cost", ".png")
    title = (f"gateway_cost, {when:%Y-%m-%d %H:%M} UTC, {ctx.cpu.cpu_class}, "
             f"{ctx.cpu.cores} cores")  # fmt: skip
    plot(result, png, title)
    ctx.notes.append(setup(result))
    out = rows(result, png, ctx.quick)
    return out + piece_rows(request_pieces.in_child(), figures(result), ctx.quick)


def piece_rows(
    pieces: dict[str, float], cpu: dict[tuple[str, str], float], quick: bool
) -> list[Row]:
    """Return a row per piece of the gateway's own work, in µs and as a share of the one-text
    :embed request's worker CPU (sequential): the most a lever on that piece could save."""
    request_us = cpu[("embed-1", "sequential")] * 1000
    tag = " (--quick: not a measurement)" if quick else ""
    return [
        Row(f"gateway_cost piece: {name}", f"{us:.1f} µs",
            f"{us / request_us * 100:.1f} % of a one-text :embed", "",
            "in process, one core, best of 5 × 5,000 calls (benchmarks/request_pieces.py)" + tag)
        for name, us in pieces.items()
    ]  # fmt: skip


def setup(result: dict[str, Any]) -> str:
    """Return the note that says what gateway_cost's servers and requests were."""
    embed_model, classify_model, version = result["models"]
    return (f"gateway_cost: {embed_model} v{version} (:embed, /v1/embeddings) and "
            f"{classify_model} (:classify) behind one model server, {WORDS}-word texts; the "
            f"gateway: docker/gunicorn.conf.py with product defaults (JSON access log, metrics, "
            f"timing headers), grpc upstream, 1 worker, {GATEWAY_THREADS} threads; the floor: "
            f"benchmarks/relay_floor_app.py under gunicorn gthread, 1 worker, {FLOOR_THREADS} "
            f"threads, "
            f"answering the same texts with the gateway's own upstream request; stretches per "
            f"round: 300 sequential / {CLIENTS} × 20 concurrent requests of 1 text, 80 / "
            f"{CLIENTS} × 5 of {BATCH} texts")  # fmt: skip
