"""Load generation for loadtest.py: request makers per target/protocol, a closed-loop cell runner.

A *cell* is one point of the grid (target, protocol, concurrency, texts per request, words per
text). ``concurrency`` threads each send requests back to back; requests that start during the
warm-up are discarded. The clients are the stock ones a user would write: ``tensorflow_serving``
gRPC stubs with ``tensor_content`` and REST columnar ``inputs`` JSON (orjson) straight at the
model server, plain HTTP JSON at the gateway (requests; or a raw http.client keep-alive
connection where the generator's own CPU should stay small, as in benchmarks/).
"""

from __future__ import annotations

import http.client
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import requests

JSON_HEADERS = {"Content-Type": "application/json"}
# Token ids 5..99 exist in every BERT vocabulary here (ids 0..4 are the special tokens).
_ID_LOW, _ID_HIGH = 5, 100
_SENTENCE = (
    "my card was charged twice and the order still has not arrived please help me get a refund "
    "for the package that was delivered to the wrong address last week thanks"
)


@dataclass(frozen=True)
class Cell:
    """One grid point."""

    target: str  # modelserver | gateway
    protocol: str  # grpc | rest (for the gateway: its upstream protocol)
    concurrency: int
    texts: int
    words: int


@dataclass
class Sample:
    """One finished request."""

    started: float
    latency_s: float
    ok: bool
    sent_bytes: int
    received_bytes: int
    version: int | None = None
    error: str = ""


@dataclass
class CellResult:
    """Measured figures of a cell (the warm-up excluded)."""

    cell: Cell
    duration_s: float
    requests: int
    errors: int
    throughput_rps: float
    texts_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    sent_bytes: float
    received_bytes: float
    client_cpu_ms: float
    versions: list[int] = field(default_factory=list)
    first_error: str = ""
    # Measured apart from the timed run, through a counting TCP proxy: HTTP headers / HTTP/2
    # frames and HPACK included, connection setup amortized over the calls.
    wire_sent_bytes: float = float("nan")
    wire_received_bytes: float = float("nan")


# A request maker sends one request and returns (ok, sent bytes, received bytes, version, error).
Sender = Callable[[], tuple[bool, int, int, int | None, str]]


def make_texts(texts: int, words: int, seed: int = 0) -> list[str]:
    """Return ``texts`` sentences of ``words`` words each, varied so no cache can help."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(_SENTENCE.split(), size=words)) for _ in range(texts)]


def make_tensors(texts: int, words: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Return pre-tokenized int32 inputs: [CLS] + one id per word + [SEP], no padding needed."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(_ID_LOW, _ID_HIGH, size=(texts, words + 2), dtype=np.int32)
    ids[:, 0], ids[:, -1] = 2, 3
    return {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "token_type_ids": np.zeros_like(ids),
    }


def grpc_sender(
    channel: Any,
    model: str,
    tensors: dict[str, np.ndarray],
    timeout_s: float,
    version: int | None = None,
    signature_name: str | None = None,
) -> Sender:
    """Return a sender doing PredictionService/Predict with tensor_content bytes.

    ``tensors`` go as given: pass the gateway's own bucket-padded batch and its ``seq_<L>``
    ``signature_name`` to send exactly what the gateway sends (default: serving_default).
    """
    import grpc
    from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

    def send() -> tuple[bool, int, int, int | None, str]:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model
        if version is not None:
            request.model_spec.version.value = version
        if signature_name is not None:
            request.model_spec.signature_name = signature_name
        for name, array in tensors.items():
            # Built per call on purpose: the client's serialization cost is part of the figure.
            proto = tensor_pb2.TensorProto(
                dtype=types_pb2.DT_INT32,
                tensor_shape=tensor_shape_pb2.TensorShapeProto(
                    dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in array.shape]
                ),
                tensor_content=array.tobytes(),
            )
            request.inputs[name].CopyFrom(proto)
        try:
            reply = stub.Predict(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            return False, request.ByteSize(), 0, None, f"{exc.code().name}: {exc.details()}"
        return True, request.ByteSize(), reply.ByteSize(), reply.model_spec.version.value, ""

    return send


def rest_sender(
    session: requests.Session,
    url: str,
    model: str,
    tensors: dict[str, np.ndarray],
    timeout_s: float,
    version: int | None = None,
) -> Sender:
    """Return a sender doing REST :predict with the columnar ``inputs`` format."""
    path = f"{model}/versions/{version}" if version is not None else model
    endpoint = f"{url.rstrip('/')}/v1/models/{path}:predict"

    def decoded(answer: bytes) -> int | None:
        orjson.loads(answer)  # a client decodes the answer; that cost belongs in the figure
        return version

    def send() -> tuple[bool, int, int, int | None, str]:
        body = orjson.dumps({"inputs": {k: v.tolist() for k, v in tensors.items()}})
        return _posted(session, endpoint, body, timeout_s, decoded)

    return send


def _posted(
    session: requests.Session,
    endpoint: str,
    body: bytes,
    timeout_s: float,
    version_of: Callable[[bytes], int | None],
) -> tuple[bool, int, int, int | None, str]:
    """POST ``body`` as JSON; return a sender's tuple (``version_of`` reads a 200's answer)."""
    try:
        resp = session.post(endpoint, data=body, headers=JSON_HEADERS, timeout=timeout_s)
    except requests.RequestException as exc:
        return False, len(body), 0, None, type(exc).__name__
    if resp.status_code != 200:
        return False, len(body), len(resp.content), None, f"{resp.status_code} {resp.text[:200]}"
    return True, len(body), len(resp.content), version_of(resp.content), ""


def gateway_payload(texts: list[str], version: int | None) -> dict[str, Any]:
    """Return the JSON body of a gateway ``:classify``/``:embed`` request."""
    return {"texts": texts} if version is None else {"texts": texts, "version": version}


def served_version(answer: bytes) -> int | None:
    """Return the model version a gateway answer names (None if it names none)."""
    served = orjson.loads(answer).get("model", {}).get("version")
    return int(served) if served else None


def gateway_sender(
    session: requests.Session,
    url: str,
    model: str,
    verb: str,
    texts: list[str],
    timeout_s: float,
    version: int | None = None,
) -> Sender:
    """Return a sender doing the gateway's ``:classify`` or ``:embed`` with raw texts."""
    endpoint = f"{url.rstrip('/')}/v1/models/{model}:{verb}"
    payload = gateway_payload(texts, version)

    def send() -> tuple[bool, int, int, int | None, str]:
        return _posted(session, endpoint, orjson.dumps(payload), timeout_s, served_version)

    return send


def gateway_http_sender(
    url: str,
    model: str,
    verb: str,
    texts: list[str],
    timeout_s: float,
    version: int | None = None,
) -> Sender:
    """Return a sender doing what ``gateway_sender`` does over one raw keep-alive connection.

    http.client instead of requests: a fraction of the client CPU per request, so a load
    generator sharing the host with the servers takes less of it from them.
    """
    parsed = urllib.parse.urlsplit(url)
    host = parsed.hostname or "127.0.0.1"
    conn = http.client.HTTPConnection(host, parsed.port, timeout=timeout_s)
    path = f"{parsed.path.rstrip('/')}/v1/models/{model}:{verb}"
    payload = gateway_payload(texts, version)

    def send() -> tuple[bool, int, int, int | None, str]:
        body = orjson.dumps(payload)
        try:
            try:
                conn.request("POST", path, body=body, headers=JSON_HEADERS)
                resp = conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionError):
                # The server closed an idle keep-alive connection (gunicorn: after 5 s): reconnect.
                conn.close()
                conn.request("POST", path, body=body, headers=JSON_HEADERS)
                resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            return False, len(body), 0, None, type(exc).__name__
        if resp.status != 200:
            return False, len(body), len(data), None, f"{resp.status} {data[:200]!r}"
        return True, len(body), len(data), served_version(data), ""

    return send


def run_cell(
    cell: Cell,
    make_sender: Callable[[], Sender],
    duration_s: float,
    warmup_s: float,
    on_window: Callable[[str], None] | None = None,
) -> CellResult:
    """Run ``cell.concurrency`` closed-loop clients; measure ``duration_s`` after the warm-up.

    ``on_window("start")`` and ``on_window("end")`` are called where the measured window opens
    and closes (beside the client's own CPU marks), e.g. to read the servers' CPU over it.
    """
    samples: list[Sample] = []
    lock = threading.Lock()
    stop = threading.Event()
    senders = [make_sender() for _ in range(cell.concurrency)]
    started = time.perf_counter()
    window = (started + warmup_s, started + warmup_s + duration_s)
    cpu_marks: dict[str, float] = {}

    def client(send: Sender) -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            ok, sent, received, version, error = send()
            sample = Sample(t0, time.perf_counter() - t0, ok, sent, received, version, error)
            if window[0] <= t0 < window[1]:
                with lock:
                    samples.append(sample)

    threads = [threading.Thread(target=client, args=(s,), daemon=True) for s in senders]
    for thread in threads:
        thread.start()
    time.sleep(max(0.0, window[0] - time.perf_counter()))
    if on_window is not None:  # outside the client's CPU marks: its own cost is not the client's
        on_window("start")
    cpu_marks["start"] = time.process_time()
    time.sleep(max(0.0, window[1] - time.perf_counter()))
    cpu_marks["end"] = time.process_time()
    if on_window is not None:
        on_window("end")
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    return summarize(cell, samples, duration_s, cpu_marks["end"] - cpu_marks["start"])


def summarize(cell: Cell, samples: list[Sample], duration_s: float, cpu_s: float) -> CellResult:
    """Return the cell's figures from its samples (pure)."""
    ok = [s for s in samples if s.ok]
    latencies = np.array([s.latency_s for s in ok]) * 1000.0
    n = len(samples)

    def pct(q: float) -> float:
        return float(np.percentile(latencies, q)) if len(latencies) else float("nan")

    errors = [s for s in samples if not s.ok]
    return CellResult(
        cell=cell,
        duration_s=duration_s,
        requests=n,
        errors=len(errors),
        throughput_rps=len(ok) / duration_s,
        texts_per_s=len(ok) * cell.texts / duration_s,
        p50_ms=pct(50),
        p95_ms=pct(95),
        p99_ms=pct(99),
        sent_bytes=float(np.mean([s.sent_bytes for s in samples])) if n else float("nan"),
        received_bytes=float(np.mean([s.received_bytes for s in ok])) if ok else float("nan"),
        client_cpu_ms=cpu_s * 1000.0 / n if n else float("nan"),
        versions=sorted({s.version for s in ok if s.version is not None}),
        first_error=errors[0].error if errors else "",
    )
