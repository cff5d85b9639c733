"""Gateway benchmarks: overhead over a direct upstream call, bucketing, worker footprint.

All figures come from one run against one modelserver (docs/architecture.md, "Performance model"):
- overhead = gateway end-to-end − direct call to the same modelserver with the same tensors,
  p50 and p99, one short text, over grpc and over rest (gunicorn, 1 worker, keep-alive client);
- bucketing vs padding to the longest text: 256 mixed-length texts through the gateway's
  pipeline (tokenize → chunk → grpc → reassemble), throughput ratio;
- a gateway worker's RSS and import time vs a worker that also imports tensorflow-serving-api.
Uses the demo models (``minilm``, ``minilm-intent``) under ctx.base_path when present, else
exports tiny random models into ctx.work_dir.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import psutil
import requests

from backend.timing import STAGES
from benchmarks import BenchContext, Row, median, percentile
from benchmarks.stack import Http, Stack, gateway_batch, interleaved
from ops.procs import REPO, child_env

TEXT = "my card was charged twice"
_WORDS_TEXT = (
    "my card was charged twice and the refund never arrived please help me with the order "
    "delivery package account password login payment invoice subscription cancel app error"
)
WORDS = _WORDS_TEXT.split(" ")


def _models(ctx: BenchContext) -> tuple[Path, str, str]:
    """Return (base path, classify model, embed model): the demo models or tiny stand-ins."""
    if (ctx.base_path / "minilm-intent").is_dir() and (ctx.base_path / "minilm").is_dir():
        return ctx.base_path, "minilm-intent", "minilm"
    from export.tiny import export_tiny_model

    base = ctx.work_dir / "gateway-models"
    ctx.notes.append("gateway_bench: no demo models under --base-path; used tiny random models")
    export_tiny_model(base, "tiny-intent", task="classify", version=1, max_seq_len=128)
    export_tiny_model(base, "tiny-embed", task="embed", version=1, max_seq_len=128)
    return base, "tiny-intent", "tiny-embed"


def _overhead(ctx: BenchContext, stack: Stack, base: Path, model: str) -> list[Row]:
    """Return the overhead rows (grpc and rest) for one short text."""
    from backend.clients.grpc_client import GrpcClient

    version = stack.version(model)
    # Exactly what the gateway sends for this text: one row padded to its bucket, to the
    # bucket's seq_<L> signature when the export has them.
    batch = gateway_batch(base, model, version, [TEXT])
    inputs, signature = batch.inputs, batch.signature or "serving_default"
    n = 60 if ctx.quick else 300
    # http.client keep-alive connections: a thin client, so the figures are the servers' time.
    gateways = {name: Http(url) for name, url in stack.gateways.items()}
    upstream_http = Http(stack.rest_url)
    body = orjson.dumps({"texts": [TEXT]})
    grpc_client = GrpcClient(f"127.0.0.1:{stack.grpc_port}")
    rest_body = orjson.dumps(
        {"signature_name": signature, "inputs": inputs}, option=orjson.OPT_SERIALIZE_NUMPY
    )
    rest_path = f"/v1/models/{model}/versions/{version}:predict"
    direct: dict[str, Callable[[], object]] = {
        "grpc": lambda: grpc_client.predict(
            model, inputs, version=version, timeout_s=30, signature_name=signature
        ),
        "rest": lambda: upstream_http.call("POST", rest_path, rest_body),
    }
    rows = []
    path = f"/v1/models/{model}:classify"
    for upstream in ("grpc", "rest"):
        gateway = gateways[upstream]
        # The floor: an HTTP round trip to the same gunicorn that does no work (/healthz), on
        # the same keep-alive client, interleaved with the pairs.
        d, g, f = interleaved(
            [direct[upstream], partial(gateway.call, "POST", path, body),
             partial(gateway.call, "GET", "/healthz")], n,
        )  # fmt: skip
        # Per-pair differences: each gateway call against the direct call right before it.
        diffs = [(gi - di) * 1000 for gi, di in zip(g, d, strict=True)]
        floor = median(f) * 1000
        p50, p99 = median(diffs), percentile(diffs, 99)
        how = (
            f"{n} interleaved triples (direct, gateway, /healthz; http.client keep-alive), "
            f"1 text ({model} v{version}, {signature}); p50 gateway {median(g) * 1000:.2f} ms "
            f"vs direct {median(d) * 1000:.2f} ms; floor = /healthz p50"
        )
        rows += [
            Row(f"gateway overhead p50 ({upstream})", f"{p50:.2f} ms",
                f"{p50 / floor:.1f}× the floor", "≤ 1.5× the floor", how),
            Row(f"gateway overhead p99 ({upstream})", f"{p99:.2f} ms",
                f"{p99 / floor:.1f}× the floor", "", how),
            Row(f"  HTTP floor: /healthz round trip p50 ({upstream} gateway)", f"{floor:.2f} ms",
                how="same client and gunicorn, no work: the floor under any HTTP hop here"),
        ]  # fmt: skip
        stages = _worker_stages_ms(stack.gateways[upstream])
        in_worker = stages.pop("request") - stages["call"]
        split = ", ".join(f"{name} {ms:.3f}" for name, ms in stages.items() if name != "call")
        note = ("mean request time − mean call stage, from the gateway's own /metrics; "
                f"stages (ms): {split}; rest = HTTP, Flask, hooks, metrics")  # fmt: skip
        rows.append(Row(f"  of which inside the worker ({upstream})", f"{in_worker:.2f} ms",
                        how=note))  # fmt: skip
    grpc_client.close()
    return rows


def _client_shapes(ctx: BenchContext, stack: Stack, model: str) -> list[Row]:
    """Return the cost of /v1/embeddings against :embed for the same texts, and rerank texts/s."""
    gateway = Http(stack.gateways["grpc"])
    texts = _corpus(8, seed=11)
    n = 30 if ctx.quick else 150
    ours = orjson.dumps({"texts": texts})
    theirs = orjson.dumps({"input": texts, "model": model})
    packed = orjson.dumps({"input": texts, "model": model, "encoding_format": "base64"})
    embed_t, openai_t, base64_t = interleaved(
        [partial(gateway.call, "POST", f"/v1/models/{model}:embed", ours),
         partial(gateway.call, "POST", "/v1/embeddings", theirs),
         partial(gateway.call, "POST", "/v1/embeddings", packed)], n,
    )  # fmt: skip
    e, o, b = median(embed_t) * 1000, median(openai_t) * 1000, median(base64_t) * 1000
    how = (f"{n} interleaved triples, 8 texts ({model}, grpc gateway, 1 worker): p50 :embed "
           f"{e:.2f} ms, /v1/embeddings {o:.2f} ms (float), {b:.2f} ms (base64)")  # fmt: skip
    docs = _corpus(32, seed=12)
    rerank = orjson.dumps({"model": model, "query": TEXT, "documents": docs})
    (rerank_t,) = interleaved([partial(gateway.call, "POST", "/v2/rerank", rerank)], n // 3)
    per_s = 33 / median(rerank_t)
    return [
        Row("/v1/embeddings ÷ :embed, same 8 texts (p50)", f"{o / e:.2f}×",
            f"base64 {b / e:.2f}×", "≈ 1×: one path", how),
        Row("rerank 1 query × 32 documents (/v2/rerank)", f"{per_s:.0f} texts/s",
            f"{median(rerank_t) * 1000:.1f} ms per request", "",
            f"{n // 3} sequential requests, {model} (cosine; query and documents in one call)"),
    ]  # fmt: skip


def _worker_stages_ms(gateway_url: str) -> dict[str, float]:
    """Return mean ms per :classify request and per stage, and the rest, from /metrics."""
    text = requests.get(f"{gateway_url}/metrics", timeout=10).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        values[name] = float(value)

    def mean_ms(metric: str, labels: str) -> float:
        count = values.get(f"{metric}_count{{{labels}}}", 0.0)
        return values.get(f"{metric}_sum{{{labels}}}", 0.0) / count * 1000 if count else 0.0

    request = mean_ms("gateway_request_duration_seconds", 'route="/v1/models/<model>:classify"')
    stages = {name: mean_ms("gateway_stage_duration_seconds", f'stage="{name}"') for name in STAGES}
    return {"request": request, **stages, "rest": request - sum(stages.values())}


def _corpus(n: int = 256, seed: int = 7) -> list[str]:
    """Return ``n`` texts of mixed length: mostly short, a tail of long ones (like real traffic)."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        words = rng.choice(
            [rng.randint(2, 12)] * 6 + [rng.randint(13, 40)] * 3 + [rng.randint(60, 180)]
        )
        texts.append(" ".join(rng.choice(WORDS) for _ in range(words)))
    return texts


def _bucketing(ctx: BenchContext, stack: Stack, base: Path, model: str) -> list[Row]:
    """Return the bucketing-vs-padding throughput row (gateway pipeline, in-process, grpc)."""
    from backend.schemas import EmbedRequest
    from backend.service import Gateway
    from backend.settings import load_settings

    texts = _corpus()
    request = EmbedRequest(texts=texts)
    gateways = {}
    for bucketing in (True, False):
        settings = load_settings(
            {"upstream": "grpc", "tfs_grpc_target": f"127.0.0.1:{stack.grpc_port}",
             "model_base_path": str(base), "bucketing": bucketing, "max_batch_size": 32,
             "max_texts_per_request": 256, "request_timeout_s": 300},
            environ={},
        )  # fmt: skip
        gateways[bucketing] = Gateway(settings)
        gateways[bucketing].embed(model, request)  # warm-up: every shape this corpus needs
    runs: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(1 if ctx.quick else max(3, ctx.repeats)):
        for bucketing, gateway in gateways.items():  # interleaved: both see the same load
            started = time.perf_counter()
            gateway.embed(model, request)
            runs[bucketing].append(time.perf_counter() - started)
    for gateway in gateways.values():
        gateway.close()
    timings = {bucketing: median(times) for bucketing, times in runs.items()}
    on, off = len(texts) / timings[True], len(texts) / timings[False]
    how = (f"{len(texts)} mixed-length texts, {model}, max batch 32, grpc; "
           f"sorted + bucketed {on:.0f} texts/s vs caller order, each chunk padded to its longest "
           f"{off:.0f} texts/s")  # fmt: skip
    return [Row("bucketing vs padding to the longest", f"{on:.0f} texts/s", f"{on / off:.2f}×",
                "≥ 1.25×", how)]  # fmt: skip


_PROBE = """
import json, os, sys, time
import psutil
started = time.perf_counter()
from backend.app import create_app
from backend.worker import start_worker
app = create_app({"upstream": "grpc", "tfs_grpc_target": "127.0.0.1:1"})
start_worker(app)
if sys.argv[1] == "tfs":
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc  # noqa: F401
elapsed = time.perf_counter() - started
rss = psutil.Process().memory_info().rss
tf = sum(1 for m in sys.modules if m.split(".")[0] == "tensorflow")
print(json.dumps({"import_s": elapsed, "rss": rss, "tf_modules": tf}))
"""


def _probe(kind: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, kind],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _footprint(ctx: BenchContext, stack: Stack) -> list[Row]:
    """Return RSS and import-time rows: our worker vs one importing tensorflow-serving-api."""
    rss = [psutil.Process(pid).memory_info().rss for pid in stack.worker_pids("grpc")]
    repeats = 1 if ctx.quick else 3
    ours = [_probe("ours") for _ in range(repeats)]
    theirs = [_probe("tfs") for _ in range(repeats)]
    ours_s = median([p["import_s"] for p in ours])
    theirs_s = median([p["import_s"] for p in theirs])
    ours_mb = median([p["rss"] for p in ours]) / 2**20
    theirs_mb = median([p["rss"] for p in theirs]) / 2**20
    return [
        Row("gateway worker RSS (serving, grpc)", f"{median(rss) / 2**20:.0f} MB", "", "",
            "psutil RSS of the gunicorn worker after the overhead run"),
        Row("gateway import + app + client", f"{ours_s:.2f} s, {ours_mb:.0f} MB",
            f"{theirs_s / ours_s:.1f}× faster, {theirs_mb / ours_mb:.1f}× smaller", "",
            f"fresh process, median of {repeats}; {ours[0]['tf_modules']} tensorflow modules"),
        Row("same + tensorflow-serving-api", f"{theirs_s:.2f} s, {theirs_mb:.0f} MB", "", "",
            f"adds `from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc`"
            f" ({theirs[0]['tf_modules']} tensorflow modules)"),
    ]  # fmt: skip


def run(ctx: BenchContext) -> list[Row]:
    """Run the gateway benchmarks and return their rows."""
    base, classify_model, embed_model = _models(ctx)
    print("gateway_bench: starting modelserver + gateways ...", flush=True)
    stack = Stack(ctx, base, [classify_model, embed_model])
    try:
        print("gateway_bench: overhead ...", flush=True)
        rows = _overhead(ctx, stack, base, classify_model)
        print("gateway_bench: bucketing vs padding ...", flush=True)
        rows += _bucketing(ctx, stack, base, embed_model)
        print("gateway_bench: /v1/embeddings and rerank ...", flush=True)
        rows += _client_shapes(ctx, stack, embed_model)
        print("gateway_bench: footprint ...", flush=True)
        rows += _footprint(ctx, stack)
    finally:
        stack.stop()
    return rows
