"""Transport-independent request handling: resolve the servable, predict (maybe batched), record.

Both the gRPC services and the REST handler call these functions, so codes and messages match.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2

from modelserver.batching import Batcher
from modelserver.errors import ServingError, invalid
from modelserver.manager import ModelManager
from modelserver.metrics import Metrics
from modelserver.servable import LoadedVersion
from modelserver.versions import STATE_NAMES


@dataclass(frozen=True)
class PredictResult:
    """Outputs by alias, plus what served them (for the echoed model_spec)."""

    outputs: dict[str, np.ndarray]
    version: int
    signature_name: str


class Core:
    """Shared request logic over a ModelManager, an optional Batcher and the metrics."""

    def __init__(
        self,
        manager: ModelManager,
        metrics: Metrics,
        batcher: Batcher | None = None,
        timed_workers: int = 32,
    ) -> None:
        self.manager = manager
        self.metrics = metrics
        self.batcher = batcher
        # Runs model calls that must stop waiting at a timeout (REST); gRPC runs inline.
        self._timed = ThreadPoolExecutor(max_workers=timed_workers, thread_name_prefix="timed")
        # Calls running or queued there: a caller that timed out no longer waits, but a call
        # already running finishes (TF can't be interrupted). Bounded, so calls that keep timing
        # out can't pile up work behind the callers' backs; past it the answer is UNAVAILABLE.
        self._timed_slots = threading.BoundedSemaphore(2 * timed_workers)

    def predict(
        self,
        name: str,
        version: int | None,
        label: str | None,
        signature_name: str,
        inputs: Mapping[str, np.ndarray],
        output_filter: Sequence[str] = (),
        timeout_s: float | None = None,
        batch_wait_s: float | None = None,
    ) -> PredictResult:
        """Run Predict on the servable the spec names and return outputs."""
        servable = self.manager.servable(name, version, label)
        return self.run_on(servable, signature_name, inputs, output_filter, timeout_s, batch_wait_s)

    def run_on(
        self,
        servable: LoadedVersion,
        signature_name: str,
        inputs: Mapping[str, np.ndarray],
        output_filter: Sequence[str] = (),
        timeout_s: float | None = None,
        batch_wait_s: float | None = None,
    ) -> PredictResult:
        """Run Predict on an already resolved servable.

        ``timeout_s`` bounds the whole call (REST's --rest_api_timeout_in_ms); ``batch_wait_s``
        bounds only a wait in the batch queue (gRPC passes its deadline, runs inline otherwise).
        """
        plan = servable.plan(signature_name, inputs, output_filter)
        if self.batcher is not None:
            wait = timeout_s if timeout_s is not None else batch_wait_s
            outputs = self.batcher.run(servable, plan, wait)
        elif timeout_s is None:
            outputs = servable.run(plan)
        else:
            outputs = self._run_timed(servable, plan, timeout_s)
        return PredictResult(outputs, servable.version or 0, plan.signature_name)

    def _run_timed(self, servable: LoadedVersion, plan: Any, timeout_s: float) -> Any:
        """Run ``plan`` on the timed pool; stop waiting (and drop it if not started) at timeout."""
        if not self._timed_slots.acquire(blocking=False):
            raise ServingError(
                grpc.StatusCode.UNAVAILABLE,
                "Too many requests in flight (earlier ones are still running past their timeout)",
            )
        future = self._timed.submit(servable.run, plan)
        future.add_done_callback(lambda _: self._timed_slots.release())
        try:
            return future.result(timeout=timeout_s)
        except FutureTimeout:
            future.cancel()  # a queued call never runs; a running one finishes unobserved
            raise ServingError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None

    def signature_for_json(
        self, name: str, version: int | None, label: str | None, signature_name: str
    ) -> tuple[LoadedVersion, str, Any]:
        """Return (servable, resolved signature name, SignatureDef) for REST's JSON decoding."""
        servable = self.manager.servable(name, version, label)
        resolved = signature_name or "serving_default"
        sig = servable.signature_defs.get(resolved)
        if sig is None:
            raise invalid(f'Serving signature name: "{resolved}" not found in signature def')
        return servable, resolved, sig

    def status(self, name: str, version: int | None) -> get_model_status_pb2.GetModelStatusResponse:
        """Return GetModelStatusResponse for a model (newest version first)."""
        response = get_model_status_pb2.GetModelStatusResponse()
        for status in self.manager.status(name, version):
            entry = response.model_version_status.add(version=status.version, state=status.state)
            entry.status.SetInParent()  # TF Serving prints "status" even when OK
            if status.error is not None:
                entry.status.error_code = status.error.code_number
                entry.status.error_message = status.error.message
        return response

    def metadata(
        self, name: str, version: int | None, label: str | None, fields: Sequence[str]
    ) -> get_model_metadata_pb2.GetModelMetadataResponse:
        """Return GetModelMetadataResponse with the SignatureDefMap packed in ``metadata``."""
        if not fields:
            raise invalid("GetModelMetadataRequest must specify at least one metadata_field")
        for field_name in fields:
            if field_name != "signature_def":
                raise invalid(f"Metadata field {field_name} is not supported")
        servable = self.manager.servable(name, version, label)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = name
        response.model_spec.version.value = servable.version or 0
        sig_map = get_model_metadata_pb2.SignatureDefMap()
        for key, sig in servable.signature_defs.items():
            sig_map.signature_def[key].CopyFrom(sig)
        response.metadata["signature_def"].Pack(sig_map)
        return response

    def record(
        self, name: str, api: str, entrypoint: str, started: float, error: ServingError | None
    ) -> None:
        """Count a request and its latency under TF Serving's metric names."""
        self.metrics.record_request(
            name,
            "OK" if error is None else error.code_name,
            api,
            entrypoint,
            (time.perf_counter() - started) * 1e6,
        )

    def close(self) -> None:
        """Stop helper threads."""
        self._timed.shutdown(wait=False, cancel_futures=True)
        if self.batcher is not None:
            self.batcher.close()


def state_name(state: int) -> str:
    """Return the ModelVersionStatus.State name."""
    return STATE_NAMES.get(state, "UNKNOWN")
