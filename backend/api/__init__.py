"""HTTP blueprints and the helpers their views share."""

from __future__ import annotations

from typing import Any

import orjson
from flask import Response, current_app, g, request

from backend.errors import BadRequest, Forbidden, PayloadTooLarge
from backend.schemas import MODEL_SPEC, ModelT, parse_request
from backend.service import Gateway
from backend.settings import Settings
from backend.worker import get_gateway
from modelformat.names import LABEL_RULE, MODEL_NAME_RULE


def json_response(body: Any, status: int = 200) -> Response:
    """Return ``body`` as a JSON response (orjson; numpy arrays serialize directly)."""
    data = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(data, status=status, mimetype="application/json")


# Set in the WSGI environ once the whole body has been read (the app's _finish_body skips then).
BODY_READ = "gateway.body_read"


def request_body() -> bytes:
    """Return the request body; 413 when it is over GATEWAY_MAX_BODY_BYTES, chunked ones too.

    A body with a Content-Length within the limit is read straight from ``wsgi.input`` (the
    server bounds it by that length): Werkzeug's stream wrapper and its checks cost ~50 µs a
    request and add nothing then. Werkzeug refuses a declared Content-Length over the limit,
    but a chunked body it cuts at the limit without a word: the JSON would then fail to parse
    as a misleading 400.
    """
    environ = request.environ
    limit = current_settings().max_body_bytes
    length = request.content_length
    if length is not None and length <= limit:
        raw: bytes = environ["wsgi.input"].read(length) if length else b""
        environ[BODY_READ] = True
        return raw
    raw = request.get_data(cache=False)
    if length is None and len(raw) >= limit and environ["wsgi.input"].read(1):
        raise PayloadTooLarge(f"body is over the limit of {limit} bytes (GATEWAY_MAX_BODY_BYTES)")
    return raw


def current_settings() -> Settings:
    """Return the running app's settings."""
    settings: Settings = current_app.extensions["gateway_settings"]
    return settings


def current_gateway() -> Gateway:
    """Return this worker's Gateway (created after fork, once per process)."""
    return get_gateway(current_app)


def body_as(kind: type[ModelT]) -> ModelT:
    """Return the request body validated as ``kind``: 400 naming the problem, 413/422 past the
    limits every route shares (backend/inputs.py: the one rule for every list)."""
    return parse_request(kind, request_body(), current_settings())


def named_model(spec: str) -> tuple[str, int | None, str | None]:
    """Return (name, version, label) of a body's ``model``: ``name``, ``name@version`` or
    ``name:label`` (OpenAI's and Cohere's requests name the model in the body); 403 when the
    API key may not use it."""
    if not MODEL_SPEC.fullmatch(spec):
        raise BadRequest(
            f"model {spec[:140]!r}: give 'name', 'name@<version number>' or 'name:<label>' "
            f"(a name {MODEL_NAME_RULE}; a label {LABEL_RULE})"
        )
    name, at, version = spec.partition("@")
    if at:
        if not version.isdigit():
            raise BadRequest(f"model {spec!r}: give name@<version number>")
        authorize_model(name)
        return name, int(version), None
    name, colon, label = spec.partition(":")
    if colon and not label:
        raise BadRequest(f"model {spec!r}: give name:<label>")
    authorize_model(name)
    return name, None, label or None


def authorize_model(model: str) -> None:
    """403 when the request's API key (if keys are on) may not use ``model``."""
    key = g.get("api_key")
    if key is not None and not key.allows(model):
        raise Forbidden(f"API key {key.name!r} may not use model {model!r}")


def note_served(model: str, version: int) -> None:
    """Remember which model version served this request (for metrics and logs)."""
    g.served_model = model
    g.served_version = version
