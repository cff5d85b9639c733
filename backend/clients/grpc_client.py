"""gRPC transport: TF Serving's PredictionService / ModelService over one channel per worker.

A target with a resolver scheme (``dns:///tf-serving-headless:8500``, ``ipv4:a:p,b:p``) names
several replicas: the channel spreads calls over them with gRPC's own ``round_robin`` policy and
skips a replica whose connection is down. Version states come from every replica (one status
channel per resolved address), merged so a version counts as AVAILABLE only where all report it.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

import grpc
import numpy as np

import backend.clients.endpoints as endpoints
from backend.clients.base import Outputs, error_for_status
from backend.errors import UpstreamTimeout, UpstreamUnavailable
from backend.tensors import fill_tensor_proto, from_tensor_proto
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
# Several replicas: a subchannel per resolved address, each call to the next READY one. (The
# default, pick_first, would pin every call of a worker to one replica.)
ROUND_ROBIN = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})
# How often the status channels follow the resolver's answer (replicas added or replaced).
RESOLVE_EVERY_S = 5.0

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
        self.multi = endpoints.is_multi(target)
        options = [*CHANNEL_OPTIONS, ("grpc.service_config", ROUND_ROBIN)] if self.multi else None
        self._channel = grpc.insecure_channel(target, options=options or CHANNEL_OPTIONS)
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
        # Multi-replica targets: address -> (channel, GetModelStatus) for the per-replica status.
        self._replicas: dict[str, tuple[grpc.Channel, Callable[..., Any]]] = {}
        self._resolved_at = -float("inf")
        self._replica_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

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
        """Return every version's state, newest first (merged over a multi target's replicas)."""
        request = serving_pb2.GetModelStatusRequest()
        request.model_spec.name = model
        if not self.multi:
            return from_grpc(self._call(self._status, request, model, timeout_s))
        fetchers = [
            partial(self._replica_status, status, request, model, timeout_s)
            for status in self._replica_stubs()
        ]
        return endpoints.merged_status(fetchers, self._pool)

    def replicas(self) -> list[str]:
        """Return the addresses the status calls go to (multi targets; else the target)."""
        if not self.multi:
            return [self.target]
        self._replica_stubs()
        with self._replica_lock:
            return list(self._replicas)

    def _replica_status(
        self, status: Callable[..., Any], request: Any, model: str, timeout_s: float
    ) -> list[VersionStatus]:
        # No retry: a replica that is down is left out of this answer, not waited for.
        return from_grpc(self._call(status, request, model, timeout_s, retries=0))

    def _replica_stubs(self) -> list[Callable[..., Any]]:
        """Return a GetModelStatus callable per resolved address, re-resolving now and then."""
        with self._replica_lock:
            if time.monotonic() - self._resolved_at >= RESOLVE_EVERY_S:
                try:
                    addresses = endpoints.resolve(self.target)
                except endpoints.EndpointError as exc:
                    if not self._replicas:
                        raise UpstreamUnavailable(
                            f"model server {self.target}: {exc}", retry_after_s=self.retry_after_s
                        ) from exc
                    addresses = list(self._replicas)  # keep the last answer
                self._resolved_at = time.monotonic()
                for gone in set(self._replicas) - set(addresses):
                    self._replicas.pop(gone)[0].close()
                for address in addresses:
                    if address not in self._replicas:
                        channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
                        status = channel.unary_unary(
                            GET_MODEL_STATUS,
                            request_serializer=serving_pb2.GetModelStatusRequest.SerializeToString,
                            response_deserializer=serving_pb2.GetModelStatusResponse.FromString,
                        )
                        self._replicas[address] = (channel, status)
                if self._pool is None and len(self._replicas) > 1:
                    self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="status")
            return [status for _, status in self._replicas.values()]

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
        retries: int | None = None,
    ) -> Reply:
        """Call ``method`` with a deadline, retrying UNAVAILABLE a bounded number of times.

        With several replicas round_robin sends a retry to the next READY one.
        """
        retries = self.retries if retries is None else retries
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
                    and attempt < retries
                    and deadline - time.monotonic() > pause
                ):
                    attempt += 1
                    time.sleep(pause)
                    continue
                raise error_for_status(
                    code.name, message or "", model=model, retry_after_s=self.retry_after_s
                ) from exc

    def close(self) -> None:
        """Close the channels."""
        self._channel.close()
        with self._replica_lock:
            for channel, _ in self._replicas.values():
                channel.close()
            self._replicas.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


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
        fill_tensor_proto(request.inputs[name], array)
    return request


def parse_predict_response(reply: serving_pb2.PredictResponse) -> tuple[Outputs, int]:
    """Return (outputs as numpy, served version) from a PredictResponse."""
    outputs = {name: from_tensor_proto(tensor) for name, tensor in reply.outputs.items()}
    return outputs, int(reply.model_spec.version.value)
