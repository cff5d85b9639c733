"""OpenAI-compatible routes: ``POST /v1/embeddings`` and ``GET /v1/models``.

Thin translators (DESIGN.md, "other request shapes"): the request becomes the same
``Gateway.embeddings`` call ``:embed`` makes (resolve the version, tokenize, bucket, call,
normalize), under the same limits, and errors answer in OpenAI's shape
(``{"error": {"message", "type", "param", "code"}}``) so the SDKs raise their usual exceptions.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import numpy as np
from flask import Blueprint, Response

from backend.api import (
    body_as,
    current_gateway,
    current_settings,
    json_response,
    named_model,
    note_served,
)
from backend.errors import (
    ERROR_SHAPES,
    GatewayError,
    PayloadTooLarge,
    UnprocessableInput,
)
from backend.schemas import EmbeddingsRequest, check_texts
from modelformat import layout, serverconfig
from modelformat.errors import FormatError
from modelformat.names import valid_model_name

bp = Blueprint("openai", __name__)

_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}


def openai_error(error: GatewayError) -> dict[str, Any]:
    """Return ``error`` as OpenAI's error body."""
    kind = _TYPES.get(error.status_code)
    if kind is None:
        kind = "invalid_request_error" if error.status_code < 500 else "api_error"
    return {
        "error": {
            "message": error.message,
            "type": kind,
            "param": getattr(error, "param", None),
            "code": error.code,
        }
    }


ERROR_SHAPES[bp.name] = openai_error


@bp.post("/v1/embeddings")
def embeddings() -> Response:
    """Create embeddings (OpenAI's API): the same work as :embed, OpenAI's request and answer."""
    settings = current_settings()
    req = body_as(EmbeddingsRequest, "input", _input_texts, _input_ids)
    name, version, label = named_model(req.model)
    texts: list[str] = []
    token_ids: list[list[int]] | None = None
    if isinstance(req.input, str):
        texts = [req.input]
    elif req.input and all(isinstance(x, int) for x in req.input):
        token_ids = [list(req.input)]  # type: ignore[arg-type]
    elif req.input and all(isinstance(x, list) for x in req.input):
        token_ids = [list(x) for x in req.input]  # type: ignore[arg-type]
    else:
        texts = list(req.input)  # type: ignore[arg-type]
    if token_ids is not None:
        if len(token_ids) > settings.max_texts_per_request:
            raise PayloadTooLarge(
                f"{len(token_ids)} inputs is over the limit of {settings.max_texts_per_request} "
                "(GATEWAY_MAX_TEXTS)"
            )
        if any(not ids for ids in token_ids):
            raise UnprocessableInput("field 'input' has an empty list of token ids")
    else:
        check_texts(texts, settings, field="input")
    gateway = current_gateway()
    try:
        done, vectors = gateway.embeddings(
            name, texts, version, label, token_ids=token_ids, direction=req.truncation_direction
        )
    except ValueError as exc:  # a token id outside the vocabulary
        raise UnprocessableInput(str(exc)) from None
    if req.dimensions is not None:
        dim = vectors.shape[1]
        if req.dimensions > dim:  # a fact of this model, not of the request's shape: 422
            raise UnprocessableInput(
                f"field 'dimensions': {req.dimensions} is over the model's {dim} dimensions"
            )
        vectors = vectors[:, : req.dimensions]
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = np.ascontiguousarray(vectors / np.maximum(norms, 1e-12), dtype=np.float32)
    note_served(name, done.assets.version)
    tokens = int(sum(done.token_counts))
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(vector, req.encoding_format)}
        for i, vector in enumerate(vectors)
    ]
    return json_response({
        "object": "list", "data": data, "model": f"{name}@{done.assets.version}",
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })  # fmt: skip


def _input_texts(body: dict[str, Any]) -> Any:
    value = body.get("input")
    return [value] if isinstance(value, str) else value


def _input_ids(body: dict[str, Any]) -> Any:
    """Return the body's token-id inputs as lists (one list of ints is one input)."""
    value = body.get("input")
    if isinstance(value, list) and value and all(isinstance(x, int) for x in value):
        return [value]
    return value


def _encode(vector: np.ndarray, encoding: str) -> Any:
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector


@bp.get("/v1/models")
def list_models() -> Response:
    """List the served models (OpenAI's shape): the models of the serving config, else every
    model directory with a version under the gateway's model tree."""
    settings = current_settings()
    base = Path(settings.model_base_path)
    names: list[str] = []
    if settings.model_config_file:
        try:
            config = serverconfig.read(settings.model_config_file)
            names = [m.name for m in config.model_config_list.config]
        except FormatError:
            names = []
    if not names and base.is_dir():
        names = sorted(
            p.name for p in base.iterdir()
            if valid_model_name(p.name) and p.is_dir() and layout.list_versions(p)
        )  # fmt: skip
    data = [
        {
            "id": name,
            "object": "model",
            "created": _created(base / name),
            "owned_by": "bert-gateway",
        }
        for name in names
    ]
    return json_response({"object": "list", "data": data})


def _created(path: Path) -> int:
    try:
        return int(os.stat(path).st_mtime)
    except OSError:
        return 0
