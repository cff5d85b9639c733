"""The upstream client interface (docs/architecture.md, contract 2) and the error mapping of all.

Every transport (grpc, rest, local) implements ``PredictClient`` and maps its errors here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from backend.errors import (
    GatewayError,
    LabelNotFound,
    ModelNotFound,
    Saturated,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
    VersionNotFound,
)
from modelformat.status import VersionStatus

Outputs = dict[str, np.ndarray]


class PredictClient(Protocol):
    """What the gateway needs from a model server; grpc, rest and local implement it."""

    transport: str
    # True when predict() gives up by itself at timeout_s (gRPC deadlines, HTTP read timeouts).
    enforces_deadline: bool

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
        """Return the outputs of a signature (default serving_default) and the version served;
        ``output_filter`` names the outputs wanted (all when empty; TF Serving's gRPC
        ``PredictRequest.output_filter``: its REST API has none, so REST asks the narrowest
        output-subset signature that has them, modelformat/outputs.py ``kind_signatures``, and
        answers every output where the version has none)."""
        ...

    def model_status(self, model: str, *, timeout_s: float) -> list[VersionStatus]:
        """Return the status of every version of ``model`` the server knows, newest first."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


def saturated(message: str) -> bool:
    """Return True for TF Serving's "batch queue full" answer (UNAVAILABLE / HTTP 503)."""
    text = message.lower()
    return "queue" in text and "full" in text


# TF Serving's status codes (by name) → the gateway error a caller should see.
def error_for_status(
    code: str, message: str, *, model: str, retry_after_s: int = 1
) -> GatewayError:
    """Return the gateway error for an upstream status ``code`` (a TF / gRPC code name)."""
    detail = f"model server: {message}" if message else "model server error"
    if code == "NOT_FOUND":
        if "Specific(" in message or "Could not find version" in message:
            return VersionNotFound(f"model {model!r} has no such version loaded ({detail})")
        return ModelNotFound(f"model {model!r} is not served ({detail})")
    if code == "INVALID_ARGUMENT" and "version label" in message:
        return LabelNotFound(f"model {model!r} has no such version label ({detail})")
    if code == "DEADLINE_EXCEEDED":
        return UpstreamTimeout(f"the model server did not answer in time ({detail})")
    if code == "RESOURCE_EXHAUSTED" or (code == "UNAVAILABLE" and saturated(message)):
        # TF Serving's full batch queue: every replica carries the same load, so nobody fails
        # over or retries at once on this answer; the client backs off (Retry-After).
        return Saturated(f"the model server is overloaded ({detail})", retry_after_s=retry_after_s)
    if code in ("UNAVAILABLE", "CANCELLED", "ABORTED"):
        return UpstreamUnavailable(
            f"the model server is unavailable ({detail})", retry_after_s=retry_after_s
        )
    return UpstreamError(f"the model server rejected the request: {code} ({detail})")
