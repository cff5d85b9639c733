"""The gateway's error hierarchy and its Flask handlers: every failure is a JSON error body."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, has_request_context, jsonify, request
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)


class GatewayError(Exception):
    """Base of every error the gateway reports to clients (HTTP 500, generic message)."""

    status_code = 500
    code = "internal"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON body ``{"error": {"code", "message"}}``."""
        return {"error": {"code": self.code, "message": self.message}}


class BadRequest(GatewayError):
    """HTTP 400: the body is not JSON, or a field has the wrong type or an unknown name."""

    status_code = 400
    code = "bad_request"


class NotFound(GatewayError):
    """HTTP 404: unknown route."""

    status_code = 404
    code = "not_found"


class ModelNotFound(NotFound):
    """HTTP 404: the model server has no such model."""

    code = "model_not_found"


class VersionNotFound(NotFound):
    """HTTP 404: the model has no such version (or it is not loaded)."""

    code = "version_not_found"


class LabelNotFound(NotFound):
    """HTTP 404: the model has no such version label."""

    code = "label_not_found"


class Unauthorized(GatewayError):
    """HTTP 401: no API key, or one the gateway does not know (API keys are on)."""

    status_code = 401
    code = "unauthorized"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": 'Bearer realm="bert-gateway"'})


class Forbidden(GatewayError):
    """HTTP 403: the API key may not use this model."""

    status_code = 403
    code = "forbidden"


class RateLimited(GatewayError):
    """HTTP 429: the API key is over its requests-per-second limit; sent with Retry-After."""

    status_code = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message, headers={"Retry-After": str(max(1, retry_after_s))})


class MethodNotAllowed(GatewayError):
    """HTTP 405: the route exists but not for this method."""

    status_code = 405
    code = "method_not_allowed"


class PayloadTooLarge(GatewayError):
    """HTTP 413: the body is over GATEWAY_MAX_BODY_BYTES or has over GATEWAY_MAX_TEXTS texts."""

    status_code = 413
    code = "payload_too_large"


class UnsupportedMediaType(GatewayError):
    """HTTP 415, werkzeug's: today's routes read any body as JSON, whatever its Content-Type."""

    status_code = 415
    code = "unsupported_media_type"


class UnprocessableInput(GatewayError):
    """HTTP 422: well-formed JSON whose texts cannot be processed (empty, too long, not strings)."""

    status_code = 422
    code = "unprocessable"


class TextTooLong(UnprocessableInput):
    """HTTP 422: a text needs more tokens than max_seq_len and the caller said truncate=false."""

    code = "text_too_long"


class TaskMismatch(UnprocessableInput):
    """HTTP 422: e.g. :classify on an embedding model."""

    code = "task_mismatch"


class UpstreamError(GatewayError):
    """HTTP 502: the model server answered with an error the gateway cannot map to the caller."""

    status_code = 502
    code = "upstream_error"


class ModelAssetsError(UpstreamError):
    """HTTP 502: the version's assets (tokenizer.json or vocab.txt, model.json) are unreadable."""

    code = "model_assets_error"


class UpstreamUnavailable(GatewayError):
    """HTTP 503: the model server is unreachable or overloaded; sent with Retry-After."""

    status_code = 503
    code = "upstream_unavailable"

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message, headers={"Retry-After": str(max(1, retry_after_s))})


class Saturated(UpstreamUnavailable):
    """HTTP 503 too: the model server answered that it is overloaded (its batch queue is full);
    the same code for clients, a class of its own so that nobody fails over or retries on it."""


class NotReady(UpstreamUnavailable):
    """HTTP 503: /readyz while a model it waits for is not AVAILABLE."""

    code = "not_ready"


class UpstreamStatus(GatewayError):
    """The model server's own error, kept as it answered it (the /tfs passthrough): its HTTP
    status (TF Serving's mapping of its code) and its message."""

    code = "upstream_status"

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


class UpstreamTimeout(GatewayError):
    """HTTP 504: the model server did not answer within GATEWAY_TIMEOUT_S."""

    status_code = 504
    code = "upstream_timeout"


# Blueprint name -> the error body of its route family (docs/guides/clients-and-keys.md: other
# request shapes answer errors the way their clients parse them); routes of any other blueprint
# answer ``to_dict()``.
ERROR_SHAPES: dict[str, Callable[[GatewayError], dict[str, Any]]] = {}
# Path prefix -> the error body of a route family, for what no route of it matched (an unknown
# verb under /tfs answers in TF Serving's shape, like the family's routes).
PATH_SHAPES: dict[str, Callable[[GatewayError], dict[str, Any]]] = {}


def error_response(error: GatewayError) -> Response:
    """Return the Flask response for ``error``, in the shape of the request's route family."""
    shape = None
    if has_request_context():
        shape = ERROR_SHAPES.get(request.blueprint or "") or next(
            (found for prefix, found in PATH_SHAPES.items() if request.path.startswith(prefix)),
            None,
        )
    response = jsonify(shape(error) if shape is not None else error.to_dict())
    response.status_code = error.status_code
    for name, value in error.headers.items():
        response.headers[name] = value
    return response


_HTTP_ERRORS: dict[int, type[GatewayError]] = {
    400: BadRequest,
    404: NotFound,
    405: MethodNotAllowed,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
}


def register_error_handlers(app: Flask) -> None:
    """Make every error a JSON body: gateway errors, werkzeug's HTTP errors, then anything else."""

    @app.errorhandler(GatewayError)
    def _gateway_error(error: GatewayError) -> Response:
        return error_response(error)

    @app.errorhandler(HTTPException)
    def _http_error(error: HTTPException) -> Response:
        status = error.code or 500
        kind = _HTTP_ERRORS.get(status, GatewayError)
        mapped = kind(_http_message(error))
        mapped.status_code = status
        response = error_response(mapped)
        if status == 405 and error.get_response().headers.get("Allow"):
            response.headers["Allow"] = error.get_response().headers["Allow"]
        return response

    @app.errorhandler(Exception)
    def _unexpected(error: Exception) -> Response:
        # The one place a traceback is logged; the client gets a generic message, never the trace.
        log.exception("unhandled error", exc_info=error)
        return error_response(GatewayError("internal error; see the gateway log"))


def _http_message(error: HTTPException) -> str:
    """Return a short message for werkzeug's HTTP errors (no HTML)."""
    if error.code == 413:
        return "request body is over the size limit (GATEWAY_MAX_BODY_BYTES)"
    if error.code == 404:
        return "no such route; see /openapi.json"
    return error.name if not error.description else f"{error.name}: {error.description}"
