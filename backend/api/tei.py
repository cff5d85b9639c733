"""Hugging Face text-embeddings-inference's sparse route (``POST /embed_sparse``), for TEI's
clients: a thin translator onto ``Gateway.embed`` with ``outputs`` ["sparse"], on the gateway's
default model (GATEWAY_DEFAULT_MODEL: TEI serves one model per server).

The answer is TEI's: per input a list of ``{"index", "value"}``, the non-zero entries in id
order. Documents' vectors (TEI has no query side: an inference-free SPLADE model's queries are
:embed's ``is_query``). Errors in TEI's shape, ``{"error", "error_type"}``.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response

from backend import timing
from backend.api import (
    authorize_model,
    body_as,
    current_gateway,
    current_settings,
    json_response,
    note_served,
)
from backend.errors import ERROR_SHAPES, GatewayError, ModelNotFound
from backend.outputs import sparse
from backend.schemas import EmbedRequest, TeiSparseRequest

bp = Blueprint("tei", __name__)


def tei_error(error: GatewayError) -> dict[str, Any]:
    """Return ``error`` as TEI's error body."""
    return {"error": error.message, "error_type": error.code}


ERROR_SHAPES[bp.name] = tei_error


@bp.post("/embed_sparse")
def embed_sparse() -> Response:
    """Sparse vectors of texts (TEI's request and answer), on the default model."""
    with timing.stage("validate"):
        body = body_as(TeiSparseRequest)
        model = current_settings().default_model
        if not model:
            raise ModelNotFound("no default model: set GATEWAY_DEFAULT_MODEL for /embed_sparse")
        authorize_model(model)
        texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
        request = EmbedRequest.model_construct(
            texts=texts, version=None, label=None, truncate=body.truncate is not False,
            truncation_direction=body.truncation_direction.lower(), normalize=None,
            prompt_name=body.prompt_name, input_type=None, embedding_types=None,
            long_text="truncate", outputs=["sparse"], is_query=None, top_k=None,
            min_weight=None, return_tokens=False,
        )  # fmt: skip
    answer = current_gateway().embed(model, request)
    note_served(model, answer["model"]["version"])
    with timing.stage("answer"):
        return json_response([
            sparse.tei_answer(sparse.SparseVector(item["indices"], item["values"]))
            for item in answer["sparse"]
        ])  # fmt: skip
