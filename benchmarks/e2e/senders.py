"""Load generation: what each cell's clients send (a direct gRPC client that tokenizes itself,
one-text gateway requests over keep-alive HTTP), each client from its own offset in the tickets."""

from __future__ import annotations

import http.client
import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import orjson

from benchmarks.e2e.plan import (
    CLIENTS,
    TIMEOUT_S,
)
from ops.load.cells import Sender
from ops.procs import child_env


@dataclass
class Direct:
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


def predict_request(direct: Direct, text: str) -> Any:
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


def direct_sender(channel: Any, direct: Direct, texts: Sequence[str], start: int) -> Sender:
    """Return a sender that tokenizes the next ticket and calls Predict on its bucket."""
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    cycle = itertools.islice(itertools.cycle(texts), start, None)

    def send() -> tuple[bool, int, int, int | None, str]:
        request = predict_request(direct, next(cycle))  # tokenizing is the client's work
        try:
            reply = stub.Predict(request, timeout=TIMEOUT_S)
        except grpc.RpcError as exc:
            return False, request.ByteSize(), 0, None, f"{exc.code().name}: {exc.details()}"
        return True, request.ByteSize(), reply.ByteSize(), reply.model_spec.version.value, ""

    return send


class HttpConnection:
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


def http_sender(url: str, path: str, bodies: Sequence[bytes], start: int) -> Sender:
    """Return a sender posting the next of ``bodies`` (cycled from ``start``) to ``path``."""
    conn = HttpConnection(url)
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


def gateway_sender(
    url: str, path: str, bodies: Sequence[bytes], start: Callable[[], int]
) -> Sender:
    """Return ``http_sender`` for the next client, from its own offset in ``bodies``."""
    return http_sender(url, path, bodies, start())


def offsets(n: int) -> Callable[[], int]:
    """Return a counter handing each new client its own start in the cycled tickets."""
    counter = itertools.count()
    lock = threading.Lock()

    def nxt() -> int:
        with lock:
            return next(counter) * n // CLIENTS

    return nxt
