"""An early-exit model (export build --early-exit) served with batching on, over gRPC and REST.

Concurrent calls with different ``speed`` values are merged into one batch by the server's
batching layer; inside the graph rows leave the batch at different layers, and every caller must
still get exactly its own rows' answers. A bad speed is clamped in its own row (never failing
the callers batched with it); a wrong length is refused per request.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2

from export.warmup import token_batch
from tests.contract.conftest import Server, start_batching_server

SEQ = 16


@pytest.fixture(scope="module")
def ee_server(contract_root: Path) -> Iterator[Server]:
    """A 3-layer tiny model with random students; batching on, a 20 ms window."""
    from export.tiny import export_tiny_model

    base = contract_root / "ee-models"
    export_tiny_model(base, "ee", version=1, early_exit=True, layers=3, max_seq_len=32)
    server = start_batching_server(
        contract_root,
        "ee",
        [{"name": "ee", "base_path": str(base / "ee")}],
        "max_batch_size { value: 32 }\nbatch_timeout_micros { value: 20000 }\n"
        "num_batch_threads { value: 2 }\nmax_enqueued_batches { value: 64 }\n"
        "pad_variable_length_inputs: false\n",
    )
    yield server
    server.stop()


def _feeds(seed: int, rows: int, speed: float | list[float]) -> dict[str, np.ndarray]:
    feeds = token_batch(rows, SEQ, 80, 2, 3, seed=seed)
    feeds["speed"] = np.broadcast_to(np.asarray(speed, np.float32), (rows,)).copy()
    return feeds


def _predict(server: Server, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "ee"
    request.model_spec.signature_name = f"seq_{SEQ}"
    for name, value in feeds.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    reply = server.prediction_stub().Predict(request, timeout=60)
    return {name: np.asarray(tf.make_ndarray(t)) for name, t in reply.outputs.items()}


def test_concurrent_calls_with_different_speeds_get_their_own_rows(ee_server: Server) -> None:
    speeds = (0.0, 0.3, 0.6, 0.9, 1.0)
    calls = [_feeds(i, 1 + i % 4, speeds[i % len(speeds)]) for i in range(40)]
    alone = [_predict(ee_server, feeds) for feeds in calls]  # one at a time first
    start = threading.Barrier(16)

    def call(index: int) -> dict[str, np.ndarray]:
        if index < 16:
            start.wait()
        return _predict(ee_server, calls[index])

    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(call, range(len(calls))))

    layers_seen: set[int] = set()
    for want, got in zip(alone, together, strict=True):
        np.testing.assert_array_equal(got["exit_layer"], want["exit_layer"])
        np.testing.assert_allclose(got["logits"], want["logits"], rtol=0, atol=1e-5)
        layers_seen.update(got["exit_layer"].tolist())
    assert layers_seen >= {1, 3}  # speed 1 leaves at layer 1, speed 0 runs all 3


def test_rest_columnar_call_takes_speed_and_returns_exit_layer(ee_server: Server) -> None:
    feeds = _feeds(77, 3, [0.0, 1.0, 0.0])
    body = {"signature_name": f"seq_{SEQ}", "inputs": {k: v.tolist() for k, v in feeds.items()}}
    reply = requests.post(ee_server.url + "/v1/models/ee:predict", json=body, timeout=30)

    assert reply.status_code == 200, reply.text
    outputs = reply.json()["outputs"]
    assert outputs["exit_layer"] == [3, 1, 3]
    np.testing.assert_allclose(
        np.asarray(outputs["logits"], np.float32), _predict(ee_server, feeds)["logits"], atol=1e-5
    )


@pytest.mark.parametrize(("bad", "read_as"), [(1.5, 1.0), (-0.5, 0.0), (float("nan"), 0.0)])
def test_a_bad_speed_batched_with_others_fails_no_caller(
    ee_server: Server, bad: float, read_as: float
) -> None:
    """Sent straight to the model server (only the gateway may, in deploy/k8s) and merged by the
    batching layer with good calls: the bad row is clamped, every caller gets its answer."""
    good = [_feeds(10 + i, 2, 0.5) for i in range(6)]
    want = [_predict(ee_server, feeds) for feeds in good]
    start = threading.Barrier(7)

    def call(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        start.wait()
        return _predict(ee_server, feeds)

    with ThreadPoolExecutor(7) as pool:
        futures = [pool.submit(call, feeds) for feeds in [*good, _feeds(3, 2, bad)]]
        got = [f.result() for f in futures]
    for one, alone in zip(got, want, strict=False):
        np.testing.assert_allclose(one["logits"], alone["logits"], atol=1e-5)
    np.testing.assert_allclose(
        got[-1]["logits"], _predict(ee_server, _feeds(3, 2, read_as))["logits"], atol=1e-5
    )


def test_wrong_speed_length_is_refused_by_the_batching_layer(ee_server: Server) -> None:
    feeds: dict[str, Any] = {k: v.tolist() for k, v in _feeds(4, 3, 0.0).items()}
    feeds["speed"] = [0.0]
    body = {"signature_name": f"seq_{SEQ}", "inputs": feeds}
    reply = requests.post(ee_server.url + "/v1/models/ee:predict", json=body, timeout=30)

    # with batching on, TF Serving's batching layer refuses it before the graph's own check
    assert reply.status_code == 400, reply.text
    assert "input tensors must have equal 0th-dimension size" in reply.json()["error"]
