"""The inference and model-status routes (docs/architecture.md, contract 3)."""

from __future__ import annotations

from flask import Blueprint, Response

from backend import timing
from backend.api import (
    body_as,
    current_gateway,
    json_response,
    note_served,
)
from backend.api.rerank import checked_body, rank
from backend.errors import UnprocessableInput
from backend.schemas import (
    ClassifyRequest,
    DetokenizeRequest,
    EmbedRequest,
    ModelRerankRequest,
    TagRequest,
    TokenizeRequest,
)

bp = Blueprint("models", __name__)


@bp.post("/v1/models/<model>:classify")
def classify(model: str) -> Response:
    """Classify texts with a classification model: label, score and top-k per text."""
    with timing.stage("validate"):
        body = body_as(ClassifyRequest)
    answer = current_gateway().classify(model, body)
    note_served(model, answer["model"]["version"])
    with timing.stage("answer"):
        return json_response(answer)


@bp.post("/v1/models/<model>:embed")
def embed(model: str) -> Response:
    """Embed texts with an embedding model (L2-normalized unless normalize=false)."""
    with timing.stage("validate"):
        body = body_as(EmbedRequest)
    answer = current_gateway().embed(model, body)
    note_served(model, answer["model"]["version"])
    with timing.stage("answer"):
        return json_response(answer)


@bp.post("/v1/models/<model>:tag")
def tag(model: str) -> Response:
    """Tag texts with a token-classification model: entities with character offsets."""
    with timing.stage("validate"):
        body = body_as(TagRequest)
    answer = current_gateway().tag(model, body)
    note_served(model, answer["model"]["version"])
    with timing.stage("answer"):
        return json_response(answer)


@bp.get("/v1/models/<name:model>")
def model_status(model: str) -> Response:
    """Return the model's versions and states on the model server, and its labels."""
    return json_response(current_gateway().model_status(model))


@bp.post("/v1/models/<model>:rerank")
def rerank(model: str) -> Response:
    """Rank documents against a query: an embedding model (cosine) or a cross-encoder."""
    with timing.stage("validate"):
        body = checked_body(ModelRerankRequest)
    served, results, tokens = rank(model, body, body.version, body.label)
    with timing.stage("answer"):
        return json_response(
            {"model": {"name": model, "version": served}, "results": results, "tokens": tokens}
        )


@bp.post("/v1/models/<model>:tokenize")
def tokenize(model: str) -> Response:
    """Tokens of each text as the serving version's vocabulary cuts them, with character offsets."""
    with timing.stage("validate"):
        body = body_as(TokenizeRequest)
    assets, tokens = current_gateway().tokenize(model, body.texts, body.version, body.label)
    with timing.stage("answer"):
        return json_response(
            {"model": {"name": model, "version": assets.version},
             "max_seq_len": assets.max_seq_len, "tokens": tokens}
        )  # fmt: skip


@bp.post("/v1/models/<model>:detokenize")
def detokenize(model: str) -> Response:
    """The text of token ids, with the serving version's vocabulary."""
    with timing.stage("validate"):
        body = body_as(DetokenizeRequest)
    try:
        assets, texts = current_gateway().detokenize(model, body.ids, body.version, body.label)
    except ValueError as exc:
        raise UnprocessableInput(str(exc)) from None
    with timing.stage("answer"):
        return json_response({"model": {"name": model, "version": assets.version}, "texts": texts})
