"""The gRPC client against a scripted in-process gRPC server: retries, error mapping, decoding."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest

from backend.clients.grpc_client import GrpcClient
from backend.errors import (
    LabelNotFound,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
    VersionNotFound,
)
from modelformat.protos import serving_pb2
from tests.backend.fake_grpc import predict_server

INPUTS = {"input_ids": np.array([[2, 3]], np.int32)}


class Script:
    """What the fake server does on each Predict call, in order; records what it received."""

    def __init__(self) -> None:
        self.steps: list[Any] = []
        self.received: list[serving_pb2.PredictRequest] = []

    def __call__(self, request: serving_pb2.PredictRequest, context: grpc.ServicerContext) -> Any:
        self.received.append(request)
        step = self.steps.pop(0) if self.steps else "ok"
        if isinstance(step, tuple):
            context.abort(step[0], step[1])
        if step == "sleep":
            import time

            time.sleep(2)
        reply = serving_pb2.PredictResponse()
        reply.model_spec.name = request.model_spec.name
        reply.model_spec.version.value = request.model_spec.version.value or 9
        out = reply.outputs["probabilities"]
        out.dtype = 1  # DT_FLOAT, typed float_val as TF Serving sends by default
        out.tensor_shape.dim.add().size = 1
        out.tensor_shape.dim.add().size = 2
        out.float_val.extend([0.25, 0.75])
        return reply


@pytest.fixture()
def scripted() -> Iterator[tuple[Script, str]]:
    script = Script()
    with predict_server(script, max_workers=4) as target:
        yield script, target


def test_unavailable_is_retried_then_succeeds(scripted: tuple[Script, str]) -> None:
    script, target = scripted
    script.steps = [(grpc.StatusCode.UNAVAILABLE, "queue full"), (grpc.StatusCode.UNAVAILABLE, "x")]
    client = GrpcClient(target, retries=2, backoff_s=0.01)

    outputs, version = client.predict("m", INPUTS, version=4, timeout_s=5)

    assert len(script.received) == 3 and version == 4
    np.testing.assert_allclose(outputs["probabilities"], [[0.25, 0.75]])


def test_retries_are_bounded(scripted: tuple[Script, str]) -> None:
    script, target = scripted
    script.steps = [(grpc.StatusCode.UNAVAILABLE, "down")] * 5
    client = GrpcClient(target, retries=2, backoff_s=0.01)

    with pytest.raises(UpstreamUnavailable):
        client.predict("m", INPUTS, timeout_s=5)
    assert len(script.received) == 3


@pytest.mark.parametrize(
    ("status", "message", "error"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, "bad tensor", UpstreamError),
        (
            grpc.StatusCode.NOT_FOUND,
            "Servable not found for request: Specific(m, 4)",
            VersionNotFound,
        ),
        (grpc.StatusCode.INVALID_ARGUMENT, "Unrecognized servable version label: x", LabelNotFound),
        (
            grpc.StatusCode.FAILED_PRECONDITION,
            'Serving signature key "x" not found.',
            UpstreamError,
        ),
    ],
)
def test_other_codes_are_mapped_and_not_retried(
    scripted: tuple[Script, str], status: grpc.StatusCode, message: str, error: type
) -> None:
    script, target = scripted
    script.steps = [(status, message)]
    client = GrpcClient(target, retries=2, backoff_s=0.01)

    with pytest.raises(error):
        client.predict("m", INPUTS, version=4, timeout_s=5)
    assert len(script.received) == 1


def test_deadline_becomes_a_timeout(scripted: tuple[Script, str]) -> None:
    script, target = scripted
    script.steps = ["sleep"]

    with pytest.raises(UpstreamTimeout):
        GrpcClient(target).predict("m", INPUTS, timeout_s=0.3)


def test_requests_carry_the_exact_version_and_tensor_content(scripted: tuple[Script, str]) -> None:
    script, target = scripted

    GrpcClient(target).predict("m", INPUTS, version=7, timeout_s=5)

    [request] = script.received
    assert request.model_spec.version.value == 7
    assert request.model_spec.signature_name == "serving_default"
    assert request.inputs["input_ids"].tensor_content == INPUTS["input_ids"].tobytes()


def test_a_reply_over_the_receive_limit_is_a_413_naming_the_answer_budget(
    scripted: tuple[Script, str],
) -> None:
    """The channel takes replies up to GATEWAY_MAX_ANSWER_BYTES plus a margin (``receive_limit``):
    a larger one is refused by gRPC itself and answered 413 naming the setting, not the 503 of a
    full batch queue (RESOURCE_EXHAUSTED either way on the wire)."""
    from backend.clients.grpc_client import RECEIVE_MARGIN_BYTES, receive_limit
    from backend.errors import PayloadTooLarge

    _, target = scripted
    client = GrpcClient(target, retries=0, max_receive_bytes=20)  # the reply is about 30 bytes
    roomy = GrpcClient(target, retries=0, max_receive_bytes=receive_limit(20))

    with pytest.raises(PayloadTooLarge, match="GATEWAY_MAX_ANSWER_BYTES"):
        client.predict("m", INPUTS, timeout_s=5)
    outputs, _ = roomy.predict("m", INPUTS, timeout_s=5)

    np.testing.assert_allclose(outputs["probabilities"], [[0.25, 0.75]])
    assert receive_limit(20) == 20 + RECEIVE_MARGIN_BYTES
    assert receive_limit(1 << 31) == -1  # over gRPC's own ceiling: no limit
