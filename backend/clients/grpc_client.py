"""gRPC transport: TF Serving's PredictionService / ModelService over one channel per replica.

A target with a resolver scheme (``dns:///tf-serving-headless:8500``, ``ipv4:a:p,b:p``) names
several replicas: ``backend.clients.replicas.ReplicaSet`` resolves it (in the background), keeps a
channel per replica and what each reported, and sends each call to one replica that has the
version, round robin, failing over where it is safe. A call waiting long on one replica makes the
set probe that replica's status; if it has hung (TCP open, no answers) the call is cancelled and
retried on another. A plain ``host:port`` is one channel, as before.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import numpy as np

import backend.clients.endpoints as endpoints
from backend import tracing
from backend.clients.base import Outputs, error_for_status
from backend.clients.replicas import Replica, ReplicaHung, ReplicaSet
from backend.errors import (
    GatewayError,
    PayloadTooLarge,
    UpstreamStatus,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from backend.tensors import fill_tensor_proto, from_tensor_proto
from backend.tfs_json import HTTP_STATUS
from modelformat.protos import serving_pb2
from modelformat.status import VersionStatus, from_grpc

PREDICT = "/tensorflow.serving.PredictionService/Predict"
GET_MODEL_METADATA = "/tensorflow.serving.PredictionService/GetModelMetadata"
GET_MODEL_STATUS = "/tensorflow.serving.ModelService/GetModelStatus"
CLASSIFY = "/tensorflow.serving.PredictionService/Classify"
REGRESS = "/tensorflow.serving.PredictionService/Regress"
SIGNATURE = "serving_default"

# TF Serving sends up to 2 GiB; grpc-python would refuse replies over 4 MiB by default. The
# gateway's channels take what its answer budget allows (``receive_limit``), the rest none.
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # After a model-server restart, reconnect within ~1 s instead of gRPC's default backoff,
    # which grows to 120 s and would keep answering 503 long after the server is back.
    # (min_reconnect_backoff_ms stays at its default: it is also the connect timeout, and a
    # hung server must end in DEADLINE_EXCEEDED → 504, not UNAVAILABLE after 0.2 s.)
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]
# What a reply may hold beyond the tensors GATEWAY_MAX_ANSWER_BYTES bounds (names, shapes, the
# version): the receive limit is the budget plus this
RECEIVE_MARGIN_BYTES = 1 << 20
GRPC_MAX_MESSAGE = (1 << 31) - 1  # gRPC's own ceiling (an int32): a larger limit is none
# grpc-python's words for a reply over the channel's max_receive_message_length
_LARGER_THAN_MAX = re.compile(r"Received message larger than max \((\d+) vs")


def receive_limit(max_answer_bytes: int) -> int:
    """Return the channel's max_receive_message_length for an answer budget: the budget plus
    RECEIVE_MARGIN_BYTES (the gateway counts each call's reply against it before sending, so a
    larger reply is a wrong count or a /tfs reply past the budget), -1 over gRPC's ceiling."""
    limit = max_answer_bytes + RECEIVE_MARGIN_BYTES
    return limit if max_answer_bytes > 0 and limit <= GRPC_MAX_MESSAGE else -1


# A call that has waited this long on one replica makes the set probe that replica's status.
SUSPECT_AFTER_S = 0.5
# How often each replica is asked for the states of a model requests name by version or label.
STATUS_EVERY_S = 1.0

Reply = TypeVar("Reply")


@dataclass(frozen=True)
class Stubs:
    """One channel and the calls the gateway makes on it (classify and regress: /tfs only)."""

    channel: grpc.Channel
    predict: Any
    status: Any
    metadata: Any
    classify: Any
    regress: Any

    @classmethod
    def open(cls, target: str, max_receive_bytes: int = -1) -> Stubs:
        """Return the stubs of a new channel to ``target`` receiving replies of at most
        ``max_receive_bytes`` (-1: any size)."""
        options = [*CHANNEL_OPTIONS, ("grpc.max_receive_message_length", max_receive_bytes)]
        channel = grpc.insecure_channel(target, options=options)
        return cls(
            channel,
            channel.unary_unary(
                PREDICT,
                request_serializer=serving_pb2.PredictRequest.SerializeToString,
                response_deserializer=serving_pb2.PredictResponse.FromString,
            ),
            channel.unary_unary(
                GET_MODEL_STATUS,
                request_serializer=serving_pb2.GetModelStatusRequest.SerializeToString,
                response_deserializer=serving_pb2.GetModelStatusResponse.FromString,
            ),
            channel.unary_unary(
                GET_MODEL_METADATA,
                request_serializer=serving_pb2.GetModelMetadataRequest.SerializeToString,
                response_deserializer=serving_pb2.GetModelMetadataResponse.FromString,
            ),
            channel.unary_unary(
                CLASSIFY,
                request_serializer=serving_pb2.ClassificationRequest.SerializeToString,
                response_deserializer=serving_pb2.ClassificationResponse.FromString,
            ),
            channel.unary_unary(
                REGRESS,
                request_serializer=serving_pb2.RegressionRequest.SerializeToString,
                response_deserializer=serving_pb2.RegressionResponse.FromString,
            ),
        )

    def close(self) -> None:
        self.channel.close()


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
        status_deadline_s: float = 1.0,
        max_receive_bytes: int = -1,
    ) -> None:
        """``max_receive_bytes``: the largest reply a channel takes (``receive_limit``; -1 any)."""
        self.target = target
        self.max_receive_bytes = max_receive_bytes
        self.retries = retries
        self.backoff_s = backoff_s
        self.retry_after_s = retry_after_s
        self.multi = endpoints.is_multi(target)
        self.replicas: ReplicaSet[Stubs] | None = None
        self._single: Stubs | None = None
        if self.multi:
            self.replicas = ReplicaSet(
                target,
                resolve=lambda: endpoints.resolve(target),
                connect=lambda address: Stubs.open(address, max_receive_bytes),
                disconnect=Stubs.close,
                status=self._replica_status,
                transport=self.transport,
                status_deadline_s=status_deadline_s,
                retry_after_s=retry_after_s,
            )
        else:
            self._single = Stubs.open(target, max_receive_bytes)

    def predict(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: int | None = None,
        label: str | None = None,
        timeout_s: float,
        signature_name: str | None = None,
        output_filter: Sequence[str] = (),
    ) -> tuple[Outputs, int]:
        """Return the outputs and the served version of one Predict call (``output_filter``'s
        outputs only, when it names any)."""
        request = build_predict_request(
            model, inputs, version=version, label=label, signature_name=signature_name
        )
        request.output_filter.extend(output_filter)
        if self.replicas is None:
            assert self._single is not None
            tracing.annotate("tfserving.replica", self.target)
            return parse_predict_response(
                self._call(self._single.predict, request, model, timeout_s)
            )
        self.replicas.refresh_in_background(model, STATUS_EVERY_S)

        def on(replica: Replica[Stubs], remaining: float) -> Any:
            tracing.annotate("tfserving.replica", replica.address)
            return self._watched(replica, request, model, remaining)

        reply = self.replicas.call(model, version, on, time.monotonic() + timeout_s)
        return parse_predict_response(reply)

    def model_status(self, model: str, *, timeout_s: float) -> list[VersionStatus]:
        """Return every version's state, newest first (merged over a multi target's replicas)."""
        if self.replicas is not None:
            return self.replicas.status(model)
        assert self._single is not None
        return self._status_on(self._single, model, timeout_s, self.retries)

    def replica_addresses(self) -> list[str]:
        """Return the replicas' addresses (multi targets; else the target)."""
        return self.replicas.addresses() if self.replicas is not None else [self.target]

    def _replica_status(self, stubs: Stubs, model: str, timeout_s: float) -> list[VersionStatus]:
        # No retry: a replica that is down is left out of this answer, not waited for.
        return self._status_on(stubs, model, timeout_s, 0)

    def _status_on(
        self, stubs: Stubs, model: str, timeout_s: float, retries: int
    ) -> list[VersionStatus]:
        request = serving_pb2.GetModelStatusRequest()
        request.model_spec.name = model
        return from_grpc(self._call(stubs.status, request, model, timeout_s, retries=retries))

    def _watched(self, replica: Replica[Stubs], request: Any, model: str, timeout_s: float) -> Any:
        """Predict on one replica as a cancellable call: the set cancels it if the replica hangs."""
        assert self.replicas is not None
        deadline = time.monotonic() + timeout_s
        try:
            future = replica.handle.predict.future(
                request, timeout=timeout_s, metadata=tracing.grpc_metadata()
            )
        except ValueError as exc:  # the channel was closed under us (the replica went away)
            raise UpstreamUnavailable(f"model server replica {replica.address}: {exc}") from exc
        self.replicas.watch(replica, future)
        try:
            while True:
                try:
                    return future.result(
                        timeout=max(0.0, min(SUSPECT_AFTER_S, deadline - time.monotonic()))
                    )
                except grpc.FutureTimeoutError:
                    if time.monotonic() >= deadline:
                        future.cancel()
                        raise UpstreamTimeout(
                            f"the model server did not answer within {timeout_s:.3g}s"
                        ) from None
                    self.replicas.suspect(replica, model)
                except grpc.FutureCancelledError:
                    raise ReplicaHung(
                        f"model server replica {replica.address} stopped answering",
                        retry_after_s=self.retry_after_s,
                    ) from None
                except grpc.RpcError as exc:
                    raise self._mapped(exc, model) from exc
        finally:
            self.replicas.unwatch(replica, future)

    def forward(
        self, method: str, request: Any, *, model: str, version: int | None, timeout_s: float
    ) -> Any:
        """Return the reply of one call (``predict``, ``classify``, ``regress``, ``status``,
        ``metadata``: the /tfs passthrough); the model server's error comes back as
        ``UpstreamStatus``: its code's HTTP status (TF Serving's table) and its message."""

        def on(stubs: Stubs, left: float) -> Any:
            try:
                call = getattr(stubs, method)
                return call(request, timeout=left, metadata=tracing.grpc_metadata())
            except ValueError as exc:  # the channel was closed under us
                raise UpstreamUnavailable(
                    f"model server channel closed: {exc}", retry_after_s=self.retry_after_s
                ) from exc
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
                details = exc.details() if hasattr(exc, "details") else str(exc)
                too_large = self._too_large(code, details or "")
                if too_large is not None:
                    raise too_large from exc
                status = HTTP_STATUS.get(code.name, 500)
                raise UpstreamStatus(details or code.name, status) from exc

        if self.replicas is None:
            assert self._single is not None
            tracing.annotate("tfserving.replica", self.target)
            return on(self._single, timeout_s)
        return self.replicas.call(
            model, version, lambda r, left: on(r.handle, left), time.monotonic() + timeout_s
        )

    def signature(self, model: str, *, timeout_s: float) -> dict[str, Any]:
        """Return serving_default's input and output names from GetModelMetadata."""
        request = serving_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        request.model_spec.name = model
        if self.replicas is None:
            assert self._single is not None
            reply = self._call(self._single.metadata, request, model, timeout_s)
        else:
            reply = self.replicas.call(
                model, None,
                lambda r, left: self._call(r.handle.metadata, request, model, left, retries=0),
                time.monotonic() + timeout_s,
            )  # fmt: skip
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
        """Call ``method`` with a deadline, retrying UNAVAILABLE a bounded number of times with a
        jittered exponential backoff (one server: a full batch queue may drain meanwhile)."""
        retries = self.retries if retries is None else retries
        deadline = time.monotonic() + timeout_s
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise UpstreamTimeout(f"the model server did not answer within {timeout_s:.3g}s")
            try:
                # the trace context goes on to TF Serving (traceparent), when tracing
                return method(request, timeout=remaining, metadata=tracing.grpc_metadata())
            except ValueError as exc:  # "Cannot invoke RPC on closed channel!"
                raise UpstreamUnavailable(
                    f"model server channel closed: {exc}", retry_after_s=self.retry_after_s
                ) from exc
            except grpc.RpcError as exc:
                error = self._mapped(exc, model)
                pause = self.backoff_s * (2**attempt) * random.uniform(0.5, 1.5)
                if (
                    isinstance(error, UpstreamUnavailable)
                    and attempt < retries
                    and deadline - time.monotonic() > pause
                ):
                    attempt += 1
                    time.sleep(pause)
                    continue
                raise error from exc

    def _too_large(self, code: grpc.StatusCode, details: str) -> PayloadTooLarge | None:
        """Return the 413 of a reply the channel refused for its size (grpc-python's own
        RESOURCE_EXHAUSTED, not the model server's), else None."""
        found = _LARGER_THAN_MAX.search(details)
        if code != grpc.StatusCode.RESOURCE_EXHAUSTED or found is None:
            return None
        return PayloadTooLarge(
            f"the model server's reply is {found.group(1)} bytes, over the gateway's receive limit "
            f"of {self.max_receive_bytes} bytes (GATEWAY_MAX_ANSWER_BYTES plus "
            f"{RECEIVE_MARGIN_BYTES} bytes)"
        )

    def _mapped(self, exc: grpc.RpcError, model: str) -> GatewayError:
        code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
        message = exc.details() if hasattr(exc, "details") else str(exc)
        too_large = self._too_large(code, message or "")
        if too_large is not None:
            return too_large
        return error_for_status(
            code.name, message or "", model=model, retry_after_s=self.retry_after_s
        )

    def close(self) -> None:
        """Close the channels."""
        if self._single is not None:
            self._single.close()
        if self.replicas is not None:
            self.replicas.close()


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
