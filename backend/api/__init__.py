"""HTTP blueprints and the helpers their views share."""

from __future__ import annotations

from typing import Any

import orjson
from flask import Response, current_app, g, request

from backend.errors import PayloadTooLarge
from backend.service import Gateway
from backend.settings import Settings
from backend.worker import get_gateway


def json_response(body: Any, status: int = 200) -> Response:
    """Return ``body`` as a JSON response (orjson; numpy arrays serialize directly)."""
    data = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(data, status=status, mimetype="application/json")


def request_body() -> bytes:
    """Return the request body; 413 when it is over GATEWAY_MAX_BODY_BYTES, chunked ones too.

    Werkzeug refuses a declared Content-Length over the limit, but a chunked body it cuts at
    the limit without a word: the JSON would then fail to parse as a misleading 400.
    """
    raw = request.get_data(cache=False)
    limit = current_settings().max_body_bytes
    if (
        request.content_length is None
        and len(raw) >= limit
        and request.environ["wsgi.input"].read(1)
    ):
        raise PayloadTooLarge(f"body is over the limit of {limit} bytes (GATEWAY_MAX_BODY_BYTES)")
    return raw


def current_settings() -> Settings:
    """Return the running app's settings."""
    settings: Settings = current_app.extensions["gateway_settings"]
    return settings


def current_gateway() -> Gateway:
    """Return this worker's Gateway (created after fork, once per process)."""
    return get_gateway(current_app)


def note_served(model: str, version: int) -> None:
    """Remember which model version served this request (for metrics and logs)."""
    g.served_model = model
    g.served_version = version
