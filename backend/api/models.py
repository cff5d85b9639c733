"""The inference and model-status routes (DESIGN.md contract 3)."""

from __future__ import annotations

from flask import Blueprint, Response

from backend.api import (
    current_gateway,
    current_settings,
    json_response,
    note_served,
    request_body,
)
from backend.schemas import ClassifyRequest, EmbedRequest, parse_request

bp = Blueprint("models", __name__)


@bp.post("/v1/models/<model>:classify")
def classify(model: str) -> Response:
    """Classify texts with a classification model: label, score and top-k per text."""
    body = parse_request(ClassifyRequest, request_body(), current_settings())
    answer = current_gateway().classify(model, body)
    note_served(model, answer["model"]["version"])
    return json_response(answer)


@bp.post("/v1/models/<model>:embed")
def embed(model: str) -> Response:
    """Embed texts with an embedding model (L2-normalized unless normalize=false)."""
    body = parse_request(EmbedRequest, request_body(), current_settings())
    answer = current_gateway().embed(model, body)
    note_served(model, answer["model"]["version"])
    return json_response(answer)


@bp.get("/v1/models/<model>")
def model_status(model: str) -> Response:
    """Return the model's versions and states on the model server, and its labels."""
    return json_response(current_gateway().model_status(model))
