"""Cohere's embed API (``POST /v2/embed``, the path the ``cohere`` SDK's ``ClientV2.embed``
posts to): a thin translator onto ``Gateway.embeddings``, as /v1/embeddings is for OpenAI.

``input_type`` maps onto the model's prompts and ``embedding_types`` picks the output types
(backend/embeddings.py: the rules); ``truncate`` NONE / START / END is the gateway's truncate
false / left / right. Vectors are L2-normalized, as Cohere's are. Errors in Cohere's shape.
"""

from __future__ import annotations

import uuid

from flask import Blueprint, Response

from backend import timing
from backend.api import body_as, current_gateway, json_response, named_model, note_served
from backend.api.rerank import cohere_error
from backend.errors import ERROR_SHAPES
from backend.schemas import CohereEmbedRequest
from backend.service import typed_embeddings

bp = Blueprint("cohere", __name__)
ERROR_SHAPES[bp.name] = cohere_error


@bp.post("/v2/embed")
def embed_v2() -> Response:
    """Embed texts (Cohere v2 request and answer: embeddings by type)."""
    with timing.stage("validate"):
        body = body_as(CohereEmbedRequest)
        name, version, label = named_model(body.model)
    direction = {"START": "left", "END": "right"}.get(body.truncate)
    types = body.embedding_types or ["float"]
    done, vectors = current_gateway().embeddings(
        name, body.texts, version, label, body.truncate != "NONE", normalize=True,
        direction=direction, input_type=body.input_type, types=types,
    )  # fmt: skip
    note_served(name, done.assets.version)
    with timing.stage("answer"):
        return json_response({
            "id": str(uuid.uuid4()), "embeddings": typed_embeddings(vectors, types),
            "texts": body.texts, "response_type": "embeddings_by_type",
            "meta": {"api_version": {"version": "2"},
                     "billed_units": {"input_tokens": int(sum(done.token_counts))}},
        })  # fmt: skip
