"""Batching contract: merged calls return each caller its own rows; a full queue sheds load."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2

from tests.contract.conftest import (
    BATCHES,
    Server,
    cpu_seconds,
    metric,
    start_batching_server,
    wait_until_spinning,
)

QUEUE_FULL = "The batch scheduling queue to which this task was submitted is full"
HP2_OK = ':tensorflow:serving:request_count{model_name="half_plus_two",status="OK"}'


@pytest.fixture(scope="session")
def batch_server(contract_root: Path, hp2_base: Path, tiny_base: Path) -> Iterator[Server]:
    """A server with --enable_batching: 4 rows per batch, 1 thread, 2 queued batches at most."""
    server = start_batching_server(
        contract_root,
        "batch",
        [
            {"name": "half_plus_two", "base_path": str(hp2_base)},
            {"name": "tiny", "base_path": str(tiny_base)},
        ],
        "max_batch_size { value: 4 }\nbatch_timeout_micros { value: 20000 }\n"
        "num_batch_threads { value: 1 }\nmax_enqueued_batches { value: 2 }\n"
        "pad_variable_length_inputs: true\n",
        extra=["--rest_api_num_threads=64"],  # 15 concurrent REST callers too
    )
    yield server
    server.stop()


def x_request(x: float, seconds: float | None = None, rows: int = 1) -> Any:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "half_plus_two"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.full((rows, 1), x, np.float32)))
    if seconds is not None:
        request.model_spec.signature_name = "slow"
        request.inputs["seconds"].CopyFrom(
            tf.make_tensor_proto(np.full((rows,), seconds, np.float32))
        )
    return request


def test_concurrent_callers_each_get_their_own_rows(batch_server: Server) -> None:
    stub = batch_server.prediction_stub()

    def call(i: int) -> float:
        if i % 2:
            body = {"instances": [[float(i)]]}
            reply = requests.post(
                batch_server.url + "/v1/models/half_plus_two:predict", json=body, timeout=30
            )
            return float(reply.json()["predictions"][0][0])
        response = stub.Predict(x_request(float(i)), timeout=30)
        return float(tf.make_ndarray(response.outputs["y"])[0][0])

    # 8 callers never overflow the queue: 4 rows in the model + 2 queued batches of 4.
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(call, range(48)))

    assert results == [0.5 * i + 3 for i in range(48)]


def test_batches_merge_concurrent_requests(batch_server: Server) -> None:
    """8 callers released together are answered in fewer model calls than requests.

    TF Serving 2.19 exports the same histogram (one observation per processed batch, one series
    for every model), so this is contract; it counts before and after its own calls because the
    binary's warmup replays through the batching session and adds batches that modelserver's
    unbatched warmup doesn't.
    """
    stub = batch_server.prediction_stub()
    start = threading.Barrier(8)

    def call(i: int) -> None:
        start.wait(timeout=30)
        stub.Predict(x_request(float(i)), timeout=30)

    batches, answered = metric(batch_server, BATCHES), metric(batch_server, HP2_OK)
    with ThreadPoolExecutor(8) as pool:  # 4 rows in the model + 2 queued batches of 4: no 503
        list(pool.map(call, range(8)))

    assert metric(batch_server, HP2_OK) - answered == 8
    assert 2 <= metric(batch_server, BATCHES) - batches < 8  # 8 rows, at most 4 a batch


def test_full_queue_answers_unavailable_and_others_complete(batch_server: Server) -> None:
    stub = batch_server.prediction_stub()

    def call(i: int) -> tuple[str, Any]:
        try:
            response = stub.Predict(x_request(float(i), seconds=1.0), timeout=30)
            return "ok", float(tf.make_ndarray(response.outputs["y"])[0][0])
        except grpc.RpcError as exc:
            return exc.code().name, exc.details()

    with ThreadPoolExecutor(16) as pool:
        before = cpu_seconds(batch_server)
        first = pool.submit(call, 100)  # occupies the only batch thread for 1 s
        wait_until_spinning(batch_server, before)
        results = list(pool.map(call, range(14)))  # 2 queued batches of 4 fit, the rest don't
        assert first.result() == ("ok", 53.0)

    rejected = [r for r in results if r[0] != "ok"]
    assert rejected and all(r == ("UNAVAILABLE", QUEUE_FULL) for r in rejected)
    assert all(r == ("ok", 0.5 * i + 3) for i, r in enumerate(results) if r[0] == "ok")


def test_full_queue_is_503_over_rest(batch_server: Server) -> None:
    def call(i: int) -> requests.Response:
        body = {"signature_name": "slow", "inputs": {"x": [[float(i)]], "seconds": [1.0]}}
        return requests.post(
            batch_server.url + "/v1/models/half_plus_two:predict", json=body, timeout=30
        )

    with ThreadPoolExecutor(16) as pool:
        before = cpu_seconds(batch_server)
        first = pool.submit(call, 100)  # occupies the only batch thread for 1 s
        wait_until_spinning(batch_server, before)
        replies = list(pool.map(call, range(14)))
        first.result()

    assert {r.status_code for r in replies} == {200, 503}
    assert all(r.json() == {"error": QUEUE_FULL} for r in replies if r.status_code == 503)


def test_request_larger_than_max_batch_is_rejected(batch_server: Server) -> None:
    with pytest.raises(grpc.RpcError) as info:
        batch_server.prediction_stub().Predict(x_request(1.0, rows=5), timeout=10)

    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "Task size 5 is larger than maximum input batch size 4"


def _bert_request(rng: np.random.Generator, seq: int) -> Any:
    ids = rng.integers(5, 60, size=(1, seq)).astype(np.int32)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "tiny"
    for name, value in [
        ("input_ids", ids),
        ("attention_mask", np.ones_like(ids)),
        ("token_type_ids", np.zeros_like(ids)),
    ]:
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    return request


def _embed(server: Server, request: Any) -> np.ndarray:
    reply = server.prediction_stub().Predict(request, timeout=30)
    return np.asarray(tf.make_ndarray(reply.outputs["embedding"]))


@pytest.mark.parametrize(
    "lengths", [(16,) * 8, (5, 9, 16, 7, 12, 3, 16, 10)], ids=["same-length", "mixed-lengths"]
)
def test_batched_bert_rows_match_unbatched_unless_padded(
    batch_server: Server, main_server: Server, lengths: tuple[int, ...]
) -> None:
    rng = np.random.default_rng(0)
    reqs = [_bert_request(rng, seq) for seq in lengths]
    expected = [_embed(main_server, r) for r in reqs]

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda r: _embed(batch_server, r), reqs))

    for seq, want, have in zip(lengths, expected, got, strict=True):
        assert have.shape == want.shape
        if seq == max(lengths):  # never padded: exactly the unbatched result
            np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-5)
    # Shorter rows may share a batch with longer ones: TF Serving pads them with each tensor's
    # first element ([CLS] id, mask 1), which changes BERT outputs - hence
    # pad_variable_length_inputs: false in serving_config/batching_parameters.txt.
