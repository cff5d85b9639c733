"""OpenAI-compatible routes: ``POST /v1/embeddings`` and ``GET /v1/models``.

Thin translators (docs/guides/clients-and-keys.md): the request becomes the same
``Gateway.embeddings`` call ``:embed`` makes (resolve the version, tokenize, bucket, call,
normalize), under the same limits, and errors answer in OpenAI's shape
(``{"error": {"message", "type", "param", "code"}}``) so the SDKs raise their usual exceptions.
"""

from __future__ import annotations

import base64
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from flask import Blueprint, Response, current_app, g

from backend import metrics, timing
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
    UnprocessableInput,
)
from backend.inputs import openai_inputs
from backend.reloading import ReloadingFile
from backend.schemas import EmbeddingsRequest
from backend.service import typed_embeddings
from backend.settings import Settings
from modelformat import layout, serverconfig
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
    with timing.stage("validate"):
        req, name, version, label, texts, token_ids = _embeddings_request()
    gateway = current_gateway()
    try:
        done, vectors = gateway.embeddings(
            name, texts, version, label, normalize=True, token_ids=token_ids,
            direction=req.truncation_direction, prompt_name=req.prompt_name,
            input_type=req.input_type, types=(req.embedding_type,), encoding=req.encoding_format,
        )  # fmt: skip
    except ValueError as exc:  # a token id outside the vocabulary
        raise UnprocessableInput(str(exc)) from None
    note_served(name, done.assets.version)
    with timing.stage("answer"):
        if req.dimensions is not None:
            vectors = _shortened(vectors, req.dimensions)
        tokens = int(sum(done.token_counts))
        typed = typed_embeddings(vectors, [req.embedding_type])[req.embedding_type]
        data = [
            {"object": "embedding", "index": i, "embedding": _encode(vector, req.encoding_format)}
            for i, vector in enumerate(typed)
        ]
        return json_response({
            "object": "list", "data": data, "model": f"{name}@{done.assets.version}",
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        })  # fmt: skip


def _embeddings_request() -> tuple[
    EmbeddingsRequest, str, int | None, str | None, list[str], list[list[int]] | None
]:
    """Return the validated body, its model (name, version, label) and its texts or token ids
    (413/422 past the limits every route shares)."""
    req = body_as(EmbeddingsRequest)
    name, version, label = named_model(req.model)
    texts, token_ids = openai_inputs(req.input)
    return req, name, version, label, texts, token_ids


def _shortened(vectors: np.ndarray, dimensions: int) -> np.ndarray:
    """Return ``vectors`` cut to their first ``dimensions`` and made unit vectors again
    (OpenAI's ``dimensions``); 422 over the model's own."""
    dim = vectors.shape[1]
    if dimensions > dim:  # a fact of this model, not of the request's shape: 422
        raise UnprocessableInput(
            f"field 'dimensions': {dimensions} is over the model's {dim} dimensions"
        )
    vectors = vectors[:, :dimensions]
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.ascontiguousarray(vectors / np.maximum(norms, 1e-12), dtype=np.float32)


def _encode(vector: np.ndarray, encoding: str) -> Any:
    if encoding == "base64":  # float32 little-endian; int8/uint8 one byte each
        raw = vector.astype("<f4") if vector.dtype.kind == "f" else vector
        return base64.b64encode(raw.tobytes()).decode("ascii")
    return vector


@bp.get("/v1/models")
def list_models() -> Response:
    """List the models this request's API key may use (OpenAI's shape): the models of the
    serving config, else every model directory with a version under the gateway's model tree."""
    settings = current_settings()
    base = Path(settings.model_base_path)
    key = g.get("api_key")
    data = [
        {
            "id": name,
            "object": "model",
            "created": _created(base / name),
            "owned_by": "bert-gateway",
        }
        for name in _model_list(settings).names()
        if key is None or key.allows(name)
    ]
    return json_response({"object": "list", "data": data})


class ModelList:
    """The served models' names, at most ``recheck_s`` old: the serving config's (re-read by
    the labels' rule: parsed only when its content changes, last good kept), else the model
    directories that hold a version."""

    def __init__(self, settings: Settings) -> None:
        self.base = Path(settings.model_base_path)
        self.recheck_s = settings.labels_cache_s
        self._config: ReloadingFile[list[str]] | None = None
        if settings.model_config_file:
            self._config = ReloadingFile(
                settings.model_config_file, _config_names, [], recheck_s=self.recheck_s,
                what="serving config", errors=metrics.MODEL_CONFIG_ERRORS,
                stale=metrics.MODEL_CONFIG_STALE,
            )  # fmt: skip
        self._listed: tuple[float, list[str]] = (-float("inf"), [])
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        """Return the names (the config's, else the model tree's)."""
        names = self._config.get() if self._config is not None else []
        return names or self._tree()

    def _tree(self) -> list[str]:
        with self._lock:
            checked, names = self._listed
            if time.monotonic() - checked >= self.recheck_s:
                names = sorted(
                    p.name for p in self.base.iterdir()
                    if valid_model_name(p.name) and p.is_dir() and layout.list_versions(p)
                ) if self.base.is_dir() else []  # fmt: skip
                self._listed = (time.monotonic(), names)
            return names


def _config_names(data: bytes) -> list[str]:
    """Return the model names of a serving config (FormatError, a ValueError, when broken)."""
    config = serverconfig.parse(data.decode("utf-8"))
    return [m.name for m in config.model_config_list.config]


def _model_list(settings: Settings) -> ModelList:
    """Return this process's ModelList (made after fork, on first use)."""
    state = current_app.extensions.get("gateway_model_list")
    if state is None or state[0] != os.getpid():
        state = (os.getpid(), ModelList(settings))
        current_app.extensions["gateway_model_list"] = state
    models: ModelList = state[1]
    return models


def _created(path: Path) -> int:
    try:
        return int(os.stat(path).st_mtime)
    except OSError:
        return 0
