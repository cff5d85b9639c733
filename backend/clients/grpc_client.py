"""gRPC transport: TF Serving's PredictionService / ModelService over one channel per worker."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import grpc
import numpy as np

from backend.clients.base import Outputs, error_for_status
from backend.errors import UpstreamTimeout
from backend.tensors import from_tensor_proto, to_tensor_proto
from modelformat.protos import serving_pb2
from modelformat.status import VersionStatus, from_grpc

PREDICT = "/tensorflow.serving.PredictionService/Predict"
GET_MODEL_METADATA = "/tensorflow.serving.PredictionService/GetModelMetadata"
GET_MODEL_STATUS = "/tensorflow.serving.ModelService/GetModelStatus"
SIGNATURE = "serving_default"

# TF Serving sends up to 2 GiB; grpc-python would refuse replies over 4 MiB by default.
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # After a model-server restart, reconnect within ~1 s instead of gRPC's default backoff,
    # which grows to 120 s and would keep answering 503 long after the server is back.
    # (min_reconnect_backoff_ms stays at its default: it is also the connect timeout, and a
    # hung server must end in DEADLINE_EXCEEDED → 504, not UNAVAILABLE after 0.2 s.)
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]

Reply = TypeVar("Reply")


class GrpcClient:
    """PredictClient over gRPC; create it after fork (a channel must not cross a fork)."""

    transport = "grpc"
    enforces_deadline = True

    def __init__(
        self,
        target: str,
        *,
        retries: int = 2,
        backoff_s: float = 0.05,
        retry_after_s: int = 1,
    ) -> None:
        self.target = target
        self.retries = retries
        self.backoff_s = backoff_s
        self.retry_after_s = retry_after_s
        self._channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
        self._predict = self._channel.unary_unary(
            PREDICT,
            request_serializer=serving_pb2.PredictRequest.SerializeToString,
            response_deserializer=serving_pb2.PredictResponse.FromString,
        )
        self._status = self._channel.unary_unary(
            GET_MODEL_STATUS,
            request_serializer=serving_pb2.GetModelStatusRequest.SerializeToString,
            response_deserializer=serving_pb2.GetModelStatusResponse.FromString,
        )
        self._metadata = self._channel.unary_unary(
            GET_MODEL_METADATA,
            request_serializer=serving_pb2.GetModelMetadataRequest.SerializeToString,
            response_deserializer=serving_pb2.GetModelMetadataResponse.FromString,
        )

    def predict(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: int | None = None,
        label: str | None = None,
        timeout_s: float,
        signature_name: str | None = None,
    ) -> tuple[Outputs, int]:
        """Return the outputs and the served version of one Predict call."""
        request = build_predict_request(
            model, inputs, version=version, label=label, signature_name=signature_name
        )
        reply = self._call(self._predict, request, model, timeout_s)
        return parse_predict_response(reply)

    def model_status(self, model: str, *, timeout_s: float) -> list[VersionStatus]:
        """Return every version's state, newest first."""
        request = serving_pb2.GetModelStatusRequest()
        request.model_spec.name = model
        reply = self._call(self._status, request, model, timeout_s)
        return from_grpc(reply)

    def signature(self, model: str, *, timeout_s: float) -> dict[str, Any]:
        """Return serving_default's input and output names from GetModelMetadata."""
        request = serving_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        request.model_spec.name = model
        reply = self._call(self._metadata, request, model, timeout_s)
        # The Any's type URL names TF Serving's package, so decode the bytes directly.
        sigs = serving_pb2.SignatureDefMap.FromString(reply.metadata["signature_def"].value)
        sig = sigs.signature_def[SIGNATURE]
        return {"inputs": sorted(sig.inputs), "outputs": sorted(sig.outputs)}

    def _call(
        self,
        method: Callable[..., Reply],
        request: Any,
        model: str,
        timeout_s: float,
    ) -> Reply:
        """Call ``method`` with a deadline, retrying UNAVAILABLE a bounded number of times."""
        deadline = time.monotonic() + timeout_s
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise UpstreamTimeout(f"the model server did not answer within {timeout_s:.3g}s")
            try:
                return method(request, timeout=remaining)
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
                message = exc.details() if hasattr(exc, "details") else str(exc)
                # Only UNAVAILABLE is safe and worth retrying (server restarting, queue full).
                pause = self.backoff_s * (2**attempt) * random.uniform(0.5, 1.5)
                if (
                    code == grpc.StatusCode.UNAVAILABLE
                    and attempt < self.retries
                    and deadline - time.monotonic() > pause
                ):
                    attempt += 1
                    time.sleep(pause)
                    continue
                raise error_for_status(
                    code.name, message or "", model=model, retry_after_s=self.retry_after_s
                ) from exc

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()


def build_predict_request(
    model: str,
    inputs: Mapping[str, np.ndarray],
    *,
    version: int | None = None,
    label: str | None = None,
    signature_name: str | None = None,
) -> serving_pb2.PredictRequest:
    """Return a PredictRequest (serving_default unless named) with tensor_content tensors."""
    request = serving_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature_name or SIGNATURE
    if version is not None:
        request.model_spec.version.value = int(version)
    elif label is not None:
        request.model_spec.version_label = label
    for name, array in inputs.items():
        request.inputs[name].CopyFrom(to_tensor_proto(array))
    return request


def parse_predict_response(reply: serving_pb2.PredictResponse) -> tuple[Outputs, int]:
    """Return (outputs as numpy, served version) from a PredictResponse."""
    outputs = {name: from_tensor_proto(tensor) for name, tensor in reply.outputs.items()}
    return outputs, int(reply.model_spec.version.value)
