"""Batching per fixed-length signature: one queue per ``seq_<L>``, so no padding is ever needed.

With ``pad_variable_length_inputs: false`` (serving_config/batching_parameters.txt), concurrent
calls of different lengths to ``serving_default`` cannot share a batch and are refused; sent to
their bucket's ``seq_<L>`` signature they batch with their own length only, and every caller
gets exactly its own rows.
"""

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

from tests.contract.conftest import BATCHES, Server, metric, start_batching_server

PADDING_OFF = "from different tasks have different shapes and padding is turned off"


@pytest.fixture(scope="module")
def bucket_server(contract_root: Path, tiny_base: Path) -> Iterator[Server]:
    """Batching on, padding off (as in serving_config/), a 20 ms window so calls do meet."""
    server = start_batching_server(
        contract_root,
        "bucket",
        [{"name": "tiny", "base_path": str(tiny_base)}],
        "max_batch_size { value: 16 }\nbatch_timeout_micros { value: 20000 }\n"
        "num_batch_threads { value: 2 }\nmax_enqueued_batches { value: 64 }\n"
        "pad_variable_length_inputs: false\n",
    )
    yield server
    server.stop()


def _feeds(seed: int, rows: int, seq: int) -> dict[str, np.ndarray]:
    """Return ``rows`` BERT rows padded to ``seq`` (real lengths vary, padding id 0, mask 0)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, seq + 1, size=rows)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
    ids = rng.integers(5, 60, size=(rows, seq)).astype(np.int32) * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def _request(feeds: dict[str, np.ndarray], signature: str) -> Any:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "tiny"
    request.model_spec.signature_name = signature
    for name, value in feeds.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    return request


def _embed(server: Server, feeds: dict[str, np.ndarray], signature: str) -> np.ndarray:
    reply = server.prediction_stub().Predict(_request(feeds, signature), timeout=60)
    return np.asarray(tf.make_ndarray(reply.outputs["embedding"]))


def test_concurrent_calls_to_bucket_signatures_all_succeed_with_their_own_rows(
    bucket_server: Server, main_server: Server
) -> None:
    # distinct inputs, 1-3 rows each, half at length 16 and half at 32, all at once
    calls = [(_feeds(i, 1 + i % 3, 16 if i % 2 else 32), f"seq_{16 if i % 2 else 32}")
             for i in range(64)]  # fmt: skip
    expected = [_embed(main_server, feeds, "serving_default") for feeds, _ in calls]
    start = threading.Barrier(16)

    def call(index: int) -> np.ndarray:
        if index < 16:
            start.wait()
        feeds, signature = calls[index]
        return _embed(bucket_server, feeds, signature)

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(call, range(len(calls))))

    for want, have in zip(expected, got, strict=True):
        assert have.shape == want.shape
        np.testing.assert_allclose(have, want, rtol=0, atol=1e-5)


def test_bucket_signature_over_rest_gives_the_same_rows(
    bucket_server: Server, main_server: Server
) -> None:
    feeds = _feeds(7, 2, 16)
    body = {"signature_name": "seq_16", "inputs": {k: v.tolist() for k, v in feeds.items()}}
    reply = requests.post(bucket_server.url + "/v1/models/tiny:predict", json=body, timeout=30)

    assert reply.status_code == 200, reply.text
    np.testing.assert_allclose(
        np.asarray(reply.json()["outputs"], np.float32),
        _embed(main_server, feeds, "serving_default"),
        rtol=0,
        atol=1e-5,
    )


def test_bucket_signature_calls_were_merged_into_batches(bucket_server: Server) -> None:
    """16 calls released together, 8 to ``seq_16`` and 8 to ``seq_32``, run in fewer batches.

    The binary exports the same processed_batch_size histogram; counted before and after these
    calls, as its warmup records are batches there and not here.
    """
    start = threading.Barrier(16)

    def call(index: int) -> None:
        seq = 16 if index % 2 else 32
        feeds = _feeds(200 + index, 1, seq)
        start.wait(timeout=30)
        _embed(bucket_server, feeds, f"seq_{seq}")

    before = metric(bucket_server, BATCHES)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(call, range(16)))

    assert 2 <= metric(bucket_server, BATCHES) - before < 16  # a batch per signature at least


def test_mixed_lengths_on_serving_default_get_tf_servings_padding_off_error(
    bucket_server: Server,
) -> None:
    start = threading.Barrier(16)

    def call(index: int) -> tuple[str, str]:
        feeds = _feeds(100 + index, 1, 16 if index % 2 else 32)
        start.wait()
        try:
            _embed(bucket_server, feeds, "serving_default")
        except grpc.RpcError as exc:
            return exc.code().name, exc.details() or ""
        return "OK", ""

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(call, range(16)))

    errors = [r for r in results if r[0] != "OK"]
    assert errors, "16 simultaneous mixed-length calls never shared a batch"
    assert all(code == "INVALID_ARGUMENT" and PADDING_OFF in msg for code, msg in errors)
